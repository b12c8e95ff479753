"""The Kubernetes RBAC rules the agent needs: the one definition of them.

Each Rule is a PolicyRule (apiGroups, resources, verbs) with where it must be granted:
cluster-wide (a ClusterRole and ClusterRoleBinding), in the agent's own namespace
(NAMESPACE; a Role and RoleBinding there), or in namespace `default`, where the API server
keeps Events about cluster-scoped objects such as Nodes. docs/rbac.md shows this table and
a test checks that every API call the agent makes is covered by exactly these rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuslice.adapters.kube import objects


class Scope(StrEnum):
    CLUSTER = "cluster"
    NAMESPACE = "namespace"  # the agent's own namespace (NAMESPACE)
    DEFAULT = "default"  # namespace default


@dataclass(frozen=True)
class Rule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    scope: Scope
    needed_for: str
    # The flag whose value names the only object the rule covers (RBAC's resourceNames; get
    # and watch are still allowed, as the agent asks for one name: by GET, and by a watch with
    # fieldSelector metadata.name); None: every object of the resources.
    named_by: str | None = None
    # The flag without which the agent makes no such call (the rule is left out then);
    # a rule narrowed by `named_by` is only needed with that flag too.
    only_with: str | None = None

    @property
    def needs(self) -> str | None:
        """The flag the rule is needed with, None: always."""
        return self.named_by or self.only_with

    def namespace(self, agent_namespace: str) -> str | None:
        """Where the rule is granted for an agent in `agent_namespace`; None: cluster-wide."""
        if self.scope is Scope.CLUSTER:
            return None
        return agent_namespace if self.scope is Scope.NAMESPACE else objects.NODE_EVENT_NAMESPACE

    def policy_rule(self, names: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The rule as it appears in a ClusterRole or Role; with `names` (flag -> its value),
        narrowed to the object its `named_by` flag names."""
        rule: dict[str, Any] = {
            "apiGroups": list(self.api_groups),
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }
        if names is not None and self.named_by is not None:
            rule["resourceNames"] = [names[self.named_by]]
        return rule


RULES: tuple[Rule, ...] = (
    Rule(("",), ("nodes",), ("get", "watch"), Scope.CLUSTER,
         "read and follow the node's labels (per-node configs); the Node's uid for its Events"),
    Rule(("",), ("events",), ("create",), Scope.CLUSTER,
         "Events on the Node (in default: a rejected config) and on Pods over their GPU "
         "memory budget (in each Pod's namespace)"),
    Rule((objects.NFD_GROUP,), (objects.NODE_FEATURE_PLURAL,), ("get", "create", "update"),
         Scope.NAMESPACE, "publish the node labels as a NodeFeature (labels on, NodeFeature API)"),
    Rule(("",), ("pods",), ("get",), Scope.NAMESPACE,
         "owner references of the NodeFeature (POD_NAME set)"),
    Rule(("",), ("configmaps",), ("get", "watch"), Scope.NAMESPACE,
         "read and follow the ConfigMap of per-node configs (only with CONFIG_MAP; "
         "resourceNames: that ConfigMap)",
         named_by="config-map"),
    Rule(("",), ("events",), ("get", "patch"), Scope.NAMESPACE,
         "report a problem of that ConfigMap once for the cluster: one Event on it, named "
         "after the problem, that a node finding it again bumps (only with CONFIG_MAP)",
         only_with="config-map"),
)  # fmt: skip

# With DRA on (the chart's dra.enabled): the node's ResourceSlices (listed and watched by
# node and driver, written, replaced on each change or repair, deleted when the pool
# shrinks) and the ResourceClaims the kubelet asks to prepare (read by name; listed only
# to rebuild a checkpoint that was not one).
DRA_RULES: tuple[Rule, ...] = (
    Rule((objects.DRA_GROUP,), ("resourceslices",),
         ("list", "watch", "create", "update", "delete"),
         Scope.CLUSTER, "publish this node's ResourceSlices (DRA)"),
    Rule((objects.DRA_GROUP,), ("resourceclaims",), ("get", "list"), Scope.CLUSTER,
         "read the allocation and config of a claim the kubelet asks to prepare; list "
         "those allocated to this node to rebuild a bad checkpoint (DRA)"),
)  # fmt: skip


# With --metrics-auth kubernetes (the chart's metrics.auth): who a scraper's bearer token
# is, and whether that user may get /metrics (metrics_auth.py).
METRICS_AUTH_RULES: tuple[Rule, ...] = (
    Rule((objects.AUTHN_GROUP,), ("tokenreviews",), ("create",), Scope.CLUSTER,
         "authenticate a /metrics scraper's bearer token (--metrics-auth kubernetes)"),
    Rule((objects.AUTHZ_GROUP,), ("subjectaccessreviews",), ("create",), Scope.CLUSTER,
         "check that the scraper may get /metrics (--metrics-auth kubernetes)"),
)  # fmt: skip


def rules_in(scope: Scope, names: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The PolicyRules of one ClusterRole (CLUSTER) or Role (the others). With `names`
    (flag -> its value), a rule narrowed to an object is narrowed to the one named, and a
    rule needed only with a flag is left out when that flag is not set, as the agent then
    makes no such call."""
    return [
        rule.policy_rule(names)
        for rule in RULES
        if rule.scope is scope and (names is None or rule.needs is None or names.get(rule.needs))
    ]
