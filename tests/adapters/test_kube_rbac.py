"""The RBAC rules of gpuslice.adapters.kube.rbac are exactly what the agent needs: every
API call KubeNodeApi makes (node read and watch, the ConfigMap's read and watch, Node
and Pod Events, NodeFeature create and update with POD_NAME set and the owner lookup) succeeds
against the API server stand-in enforcing just these rules, and taking away any single
verb of any rule makes a call fail with 403."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest
import yaml
from kube_fakes import FAST_BACKOFF, FakeApiServer, Follower, Following, fake_client, grants

from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.adapters.kube.rbac import RULES, Rule, Scope, rules_in
from gpuslice.core.errors import BackendError
from gpuslice.testing.apiserver import access_of

NS = "gpu-operator"
POD = "gpuslice-x7k2p"
CM = "gpuslice-configs"
NAMED = {"config-map": CM}  # the Role's configmaps rule covers this ConfigMap only
DOCS = Path(__file__).resolve().parents[2] / "docs" / "rbac.md"


async def agent_calls(server: FakeApiServer, tmp_path: Path) -> None:
    """Every call the agent makes, each allowed to fail (the server records the answers)."""
    server.put_node("n1", {"nvidia.com/device-plugin.config": "ts-8"})
    server.put_config_map(NS, "gpuslice-configs", {"ts-8": "version: v1\n"})
    server.put_pod(NS, POD, [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                              "name": "gpuslice", "uid": "ds-1", "controller": True}])  # fmt: skip
    client = fake_client(server.url, tmp_path)
    api = KubeNodeApi(client, pod_name=POD, backoff_s=FAST_BACKOFF)
    try:
        with contextlib.suppress(BackendError):
            await api.node_labels("n1")
        follower = Follower(api.watch_node_labels("n1"))
        try:
            await follower.next()
        except BackendError:
            pass
        else:
            await server.wait_for(lambda s: any(r.code for r in s.watches()))
        await follower.close()
        configs = Following(api.watch_config_map(NS, "gpuslice-configs"))
        try:
            await configs.next()
        except BackendError:
            pass
        else:
            await server.wait_for(lambda s: any(r.code for r in s.watches("configmaps")))
        await configs.close()
        await api.record_event("n1", "ConfigRejected", "config rejected", warning=True)
        # a shared problem: created (get 404, create), then found again once old: bumped
        for _ in range(2):
            await api.report_config_problem(NS, CM, "ConfigRejected", "entry ts-8: bad")
            for event in server.events:
                event["lastTimestamp"] = "2020-01-01T00:00:00Z"

        await api.record_pod_event("ml", "train-0", "uid-1", "GPUMemoryOverBudget", "over",
                                   warning=True)  # fmt: skip
        for replicas in ("4", "8"):  # create, then update
            with contextlib.suppress(BackendError):
                await api.publish_node_feature("n1", NS, {"nvidia.com/gpu.replicas": replicas})
    finally:
        await client.close()


def without(rule: Rule, verb: str) -> list[Rule]:
    """RULES with one verb taken from one rule."""
    rest = tuple(v for v in rule.verbs if v != verb)
    changed = [dataclasses.replace(rule, verbs=rest)]
    return [r for r in RULES if r is not rule] + (changed if rest else [])


async def test_the_rules_cover_every_call_the_agent_makes(tmp_path: Path) -> None:
    async with FakeApiServer(grants(NS, names=NAMED)) as server:
        await agent_calls(server, tmp_path)
    assert server.answered(403) == []
    calls = {(r.method, r.code) for r in server.requests}
    assert calls >= {("GET", 200), ("POST", 201), ("PUT", 200)}
    assert len(server.events) == 3
    assert {e["metadata"]["namespace"] for e in server.events} == {"default", "ml", NS}
    (shared,) = [e for e in server.events if e["involvedObject"]["kind"] == "ConfigMap"]
    assert shared["count"] == 2
    (feature,) = server.features.values()
    assert [o["kind"] for o in feature["metadata"]["ownerReferences"]] == ["DaemonSet", "Pod"]
    assert feature["spec"]["labels"] == {"nvidia.com/gpu.replicas": "8"}


@pytest.mark.parametrize(
    ("rule", "verb"),
    [(rule, verb) for rule in RULES for verb in rule.verbs],
    ids=[f"{'/'.join(rule.resources)}-{verb}" for rule in RULES for verb in rule.verbs],
)
async def test_without_any_one_verb_some_call_is_forbidden(
    tmp_path: Path, rule: Rule, verb: str
) -> None:
    async with FakeApiServer(grants(NS, without(rule, verb), NAMED)) as server:
        await agent_calls(server, tmp_path)
    refused = server.answered(403)
    assert refused, f"nothing needed {verb} on {rule.resources}"
    for request in refused:
        access = access_of(request.method, request.path, request.query)
        assert access is not None
        assert (access.verb, access.resource) == (verb, rule.resources[0])


async def test_the_rules_granted_in_another_namespace_are_not_enough(tmp_path: Path) -> None:
    """The namespace scope is real: the NodeFeature, Pod, ConfigMap and ConfigMap Event
    rules must be in NAMESPACE."""
    async with FakeApiServer(grants("kube-system")) as server:
        await agent_calls(server, tmp_path)
    refused = [access_of(r.method, r.path, r.query) for r in server.answered(403)]
    assert refused
    assert {(a.namespace, a.resource) for a in refused if a} == {
        (NS, "nodefeatures"),
        (NS, "configmaps"),
        (NS, "events"),
    }
    assert server.events  # the cluster-wide rules still hold


async def test_the_configmap_rule_covers_the_named_configmap_only(tmp_path: Path) -> None:
    """resourceNames on get and watch: the agent reads its ConfigMap by name and watches it
    with fieldSelector metadata.name, which the API server authorizes for that name (the
    whole test above passes with the rule narrowed); another ConfigMap, or a watch of the
    whole collection, is refused."""
    async with FakeApiServer(grants(NS, names={"config-map": "other"})) as server:
        await agent_calls(server, tmp_path)
    refused = [access_of(r.method, r.path, r.query) for r in server.answered(403)]
    assert ("get", "configmaps", CM) in {(a.verb, a.resource, a.name) for a in refused if a}
    assert {a.resource for a in refused if a} == {"configmaps"}
    named = grants(NS, names=NAMED)
    whole = access_of("GET", f"/api/v1/namespaces/{NS}/configmaps", {"watch": "true"})
    one = access_of("GET", f"/api/v1/namespaces/{NS}/configmaps",
                    {"watch": "true", "fieldSelector": f"metadata.name={CM}"})  # fmt: skip
    assert whole is not None
    assert one is not None
    assert not any(g.allows(whole) for g in named)
    assert any(g.allows(one) for g in named)


def test_a_narrowed_rule_renders_resource_names_and_is_left_out_when_unset() -> None:
    (configmaps,) = [r for r in rules_in(Scope.NAMESPACE, NAMED) if "configmaps" in r["resources"]]
    assert configmaps["resourceNames"] == [CM]
    unset = rules_in(Scope.NAMESPACE, {"config-map": ""})
    assert [r["resources"] for r in unset] == [["nodefeatures"], ["pods"]]
    (events,) = [r for r in rules_in(Scope.NAMESPACE, NAMED) if "events" in r["resources"]]
    assert "resourceNames" not in events  # Event names follow the problems: not narrowed


def test_each_scope_renders_the_policy_rules_of_one_role() -> None:
    assert rules_in(Scope.CLUSTER) == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    assert rules_in(Scope.DEFAULT) == []
    assert [r["resources"] for r in rules_in(Scope.NAMESPACE)] == [
        ["nodefeatures"],
        ["pods"],
        ["configmaps"],
        ["events"],
    ]


def doc_row(rule: Rule) -> str:
    groups = ", ".join(f"`{g}`" if g else "core" for g in rule.api_groups)
    resources = ", ".join(f"`{r}`" for r in rule.resources)
    return (
        f"| {groups} | {resources} | {', '.join(rule.verbs)} | {rule.scope} | {rule.needed_for} |"
    )


def test_the_docs_show_exactly_these_rules() -> None:
    """docs/rbac.md's table is RULES, row for row."""
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    table = [line for line in lines if line.startswith("| ")]
    assert table[1:] == [doc_row(rule) for rule in RULES]


DOCS_NS = "gpuslice"  # the namespace every page of the docs installs into (install.md)


def test_the_docs_example_roles_hold_exactly_these_rules() -> None:
    text = DOCS.read_text(encoding="utf-8")
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    roles = {
        (d["kind"], d["metadata"].get("namespace")): d["rules"] for d in yaml.safe_load_all(block)
    }
    assert roles == {
        ("ClusterRole", None): rules_in(Scope.CLUSTER),
        ("Role", DOCS_NS): rules_in(Scope.NAMESPACE, NAMED),
    }
