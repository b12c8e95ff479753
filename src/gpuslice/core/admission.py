"""Admission policies that refuse, at pod creation, what the kubelet would refuse later.

A container asking for more than 1 of a resource shared with failRequestsGreaterThanOne
passes the scheduler and then fails on the node with UnexpectedAdmissionError. One
ValidatingAdmissionPolicy (CEL, admissionregistration.k8s.io/v1) catches it on Pods and on
the workloads that carry pod templates. The resource names come from params: two ConfigMaps
bound with Deny and Warn, so a config change only changes their data, never the policy.

Which names go where (capped_names): a name is denied when every config that may serve it
caps it; capped on some configs only (another node type serves it whole, or unshared GPUs
stay under it), it is warned about. Pure data; the YAML is written at the edges.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuslice.core.errors import ConfigSettingError
from gpuslice.core.resources import servable_name
from gpuslice.core.sharing import ResourceSettings

DENY, WARN = "deny", "warn"
RESOURCES_KEY = "resources"  # params data: the names, comma-separated
NODES_KEY = "nodes"  # params data: "every" (Deny) or "some" (Warn), for the message
NODES = {DENY: "every", WARN: "some"}
# Pods, and the kinds whose pod template the policy reads (the template's path per kind).
MATCHED = (
    ("", "v1", "pods"),
    ("", "v1", "replicationcontrollers"),
    ("apps", "v1", "deployments"),
    ("apps", "v1", "replicasets"),
    ("apps", "v1", "statefulsets"),
    ("apps", "v1", "daemonsets"),
    ("batch", "v1", "jobs"),
    ("batch", "v1", "cronjobs"),
)


@dataclass(frozen=True, slots=True)
class CappedNames:
    deny: tuple[str, ...] = ()
    warn: tuple[str, ...] = ()


def capped_names(configs: Iterable[ResourceSettings]) -> CappedNames:
    """The names some config caps at 1 per container, split into deny and warn."""
    configs = tuple(configs)
    capped = sorted({name for c in configs for name in _caps(c)})
    deny = tuple(n for n in capped if not any(_uncapped(c, n) for c in configs))
    return CappedNames(deny, tuple(n for n in capped if n not in deny))


def _caps(config: ResourceSettings) -> set[str]:
    plan = config.sharing
    if not plan.serving.shares or not plan.fail_requests_greater_than_one:
        return set()
    return {r.advertised_name for r in plan.rules}


def _uncapped(config: ResourceSettings, name: str) -> bool:
    """True when a node with this config may serve `name` with more than 1 per container
    allowed: shared without the cap, or whole GPUs under a GPU resource's own name (GPUs
    no entry selects), unless an entry shares every device of that name under it."""
    plan = config.sharing
    rules = plan.rules if plan.serving.shares else ()
    if not plan.fail_requests_greater_than_one and any(r.advertised_name == name for r in rules):
        return True
    if not servable_name(name):
        return False
    shares_all = any(
        r.name == name and r.advertised_name == name and r.devices is None for r in rules
    )
    return not (plan.fail_requests_greater_than_one and shares_all)


# --- the policy ---------------------------------------------------------------------------

_LIMIT = "c.?resources.?limits[?r].orValue('0')"
_REQUEST = "c.?resources.?requests[?r].orValue('0')"


def _over(amount: str) -> str:
    return f"quantity(string({amount})).isGreaterThan(quantity('1'))"


_ASKS_TOO_MANY = f"({_over(_LIMIT)} || {_over(_REQUEST)})"
_AMOUNT = f"({_over(_LIMIT)} ? string({_LIMIT}) : string({_REQUEST}))"

VARIABLES: tuple[tuple[str, str], ...] = (
    # The pod spec: of a Pod, a CronJob's job template, or the template of the others.
    # dyn() keeps the schema type check from flagging the branches another kind takes.
    (
        "spec",
        "object.kind == 'Pod' ? dyn(object.spec) : object.kind == 'CronJob' ? "
        "dyn(object.spec).jobTemplate.spec.template.spec : dyn(object.spec).template.spec",
    ),
    # Ephemeral containers cannot set resources (the API server refuses them).
    ("containers", "variables.spec.containers + variables.spec.?initContainers.orValue([])"),
    (
        "capped",
        f"params.?data.?{RESOURCES_KEY}.orValue('').split(',').map(r, r.trim()).filter(r, r != '')",
    ),
    # One text per container that asks for more than 1 of a capped resource.
    (
        "asks",
        f"variables.containers.filter(c, variables.capped.exists(r, {_ASKS_TOO_MANY}))"
        ".map(c, 'container ' + c.name + ' asks for ' + variables.capped"
        f".filter(r, {_ASKS_TOO_MANY}).map(r, {_AMOUNT} + ' of ' + r).join(' and '))",
    ),
    (
        "asked",
        f"variables.capped.filter(r, variables.containers.exists(c, {_ASKS_TOO_MANY}))",
    ),
)
VALIDATION = "size(variables.asks) == 0"
MESSAGE = (
    "variables.asks.join('; ') + (size(variables.asked) == 1 ? ', which is' : ', which are')"
    " + ' shared with failRequestsGreaterThanOne' + "
    f"(params.?data.?{NODES_KEY}.orValue('') == '{NODES[WARN]}' ? "
    "' on some nodes, where the kubelet refuses the pod (UnexpectedAdmissionError): ask for 1, "
    "or select nodes that do not share it' : "
    "': ask for 1; for more GPU, ask for a resource that is not shared')"
)
# Updates are checked only when the spec changes: metadata edits (finalizers, labels) of
# an object made before the policy must never be blocked.
MATCH_CONDITIONS = (
    ("spec-changed", "request.operation != 'UPDATE' || object.spec != oldObject.spec"),
)


def policy_spec() -> dict[str, Any]:
    """The ValidatingAdmissionPolicy's spec (the same for every config)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for group, version, resource in MATCHED:
        groups.setdefault((group, version), []).append(resource)
    return {
        # A failure to evaluate lets the request through: the kubelet still refuses it.
        "failurePolicy": "Ignore",
        "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [group],
                    "apiVersions": [version],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": resources,
                }
                for (group, version), resources in groups.items()
            ]
        },
        "matchConditions": [{"name": n, "expression": e} for n, e in MATCH_CONDITIONS],
        "variables": [{"name": n, "expression": e} for n, e in VARIABLES],
        "validations": [
            {"expression": VALIDATION, "messageExpression": MESSAGE, "reason": "Invalid"}
        ],
    }


def object_names(name: str) -> dict[str, str]:
    """Names of the objects, from a prefix (the chart's fullname)."""
    return {
        "policy": f"{name}-shared-gpu-requests",
        **{f"binding-{k}": f"{name}-shared-gpu-requests-{k}" for k in (DENY, WARN)},
        **{f"params-{k}": f"{name}-admission-{k}" for k in (DENY, WARN)},
    }


# The API server's rules: object names are DNS-1123 subdomains, namespaces DNS-1123 labels.
_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_NAMESPACE = re.compile(_LABEL)
_MAX_NAME, _MAX_NAMESPACE = 253, 63


def check_names(name: str, namespace: str) -> None:
    """ConfigSettingError (one line naming the setting) unless the API server accepts every object
    name made from `name` (its suffixes included) and `namespace`."""
    if len(namespace) > _MAX_NAMESPACE or not _NAMESPACE.fullmatch(namespace):
        raise ConfigSettingError(
            "namespace",
            "the namespace",
            f"{namespace!r} is not a namespace name: lowercase letters, digits and '-', "
            f"starting and ending with a letter or digit, at most {_MAX_NAMESPACE}",
        )
    longest = max(len(n) for n in object_names(name).values()) - len(name)
    if len(name) > _MAX_NAME - longest or not _SUBDOMAIN.fullmatch(name):
        raise ConfigSettingError(
            "name",
            "the name",
            f"{name!r} cannot prefix object names: lowercase letters, digits, '-' and '.', "
            "each dot-separated part starting and ending with a letter or digit, at most "
            f"{_MAX_NAME - longest} characters (the longest name adds {longest})",
        )


def params_data(names: Iterable[str], action: str) -> dict[str, str]:
    return {RESOURCES_KEY: ",".join(names), NODES_KEY: NODES[action]}


def admission_objects(capped: CappedNames, *, name: str, namespace: str) -> list[dict[str, Any]]:
    """The policy, its Deny and Warn bindings and their params ConfigMaps in `namespace`.
    Raises ConfigError for a name or namespace the API server would refuse."""
    check_names(name, namespace)
    names = object_names(name)
    api = "admissionregistration.k8s.io/v1"
    out: list[dict[str, Any]] = [
        {
            "apiVersion": api,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": names["policy"]},
            "spec": policy_spec(),
        }
    ]
    for action, listed in ((DENY, capped.deny), (WARN, capped.warn)):
        out.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": names[f"params-{action}"], "namespace": namespace},
                "data": params_data(listed, action),
            }
        )
        out.append(
            {
                "apiVersion": api,
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": names[f"binding-{action}"]},
                "spec": {
                    "policyName": names["policy"],
                    "paramRef": {
                        "name": names[f"params-{action}"],
                        "namespace": namespace,
                        "parameterNotFoundAction": "Allow",
                    },
                    "validationActions": ["Deny" if action == DENY else "Warn"],
                },
            }
        )
    return out
