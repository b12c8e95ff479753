"""`helm install` before any GPU node exists: the pre-install check Job must find a node on a
cluster of CPU nodes only (Helm fails the install when it does not finish, "failed
pre-install: ... Job Failed"), and the agent must then land on a GPU node as soon as it joins
and carries the selecting labels. The Job's and the DaemonSet's pod specs, rendered by Helm's
engine, are placed on Node objects by the scheduler's filters (schedule_kit)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from chart_kit import CONFIGS, NAMESPACE, NVIDIA_VALUES, RELEASE, VALUE_SETS, is_hook, tool
from schedule_kit import daemon_pod, node, placed, refusal

WITH_CONFIGS = {"config": {"map": CONFIGS, "default": "t4-ts-4"}}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NFD_LABEL = {"feature.node.kubernetes.io/pci-10de.present": "true"}

CRITICAL_ONLY = {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"}
# Tolerations of the GPU pool only, which replace the chart's: the check gets the system
# pool's of its own.
GPU_POOL = {
    **VALUE_SETS["scheduling"],
    "validate": {"tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}]},
}
# value set, the GPU node's taints as it joins, the labels it gets a while later (NFD, the
# GPU Operator, the pool's own label)
SCENARIOS: dict[str, tuple[dict[str, Any], list[dict[str, str]], dict[str, str]]] = {
    "nvidia-operator": (
        {
            **NVIDIA_VALUES,
            **WITH_CONFIGS,
            "nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"},
        },
        [GPU_TAINT],
        {**NFD_LABEL, "nvidia.com/gpu.deploy.device-plugin": "true"},
    ),
    "gpu-pool": (
        {**GPU_POOL, **WITH_CONFIGS},
        [{"key": "gpu", "value": "on", "effect": "NoExecute"}],
        {"pool": "gpu"},
    ),
    "gpu-pool-host-network": (
        {**GPU_POOL, **WITH_CONFIGS, "hostNetwork": True},
        [{"key": "gpu", "value": "on", "effect": "NoExecute"}],
        {"pool": "gpu"},
    ),
}
# clusters without a GPU node: name -> (nodes, where the check may run)
CPU_CLUSTERS = {
    "one-node": ([node("cpu-1")], ["cpu-1"]),
    "system-pool": (
        [node("system-1", taints=[CRITICAL_ONLY]), node("cpu-2", unschedulable=True)],
        ["system-1"],
    ),
}


def release(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The check Job's pod spec, the DaemonSet's pod template, and the hooks' names."""
    gen = tool()
    objects = gen.objects(gen.render(gen.CHART, values, release=RELEASE, namespace=NAMESPACE))
    (job,) = [o for o in objects if o["kind"] == "Job"]
    (agent,) = [o for o in objects if o["kind"] == "DaemonSet"]
    hooks = [o["metadata"]["name"] for o in objects if is_hook(o)]
    return job["spec"]["template"]["spec"], agent["spec"]["template"], hooks


@pytest.mark.parametrize("cluster", CPU_CLUSTERS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_install_with_no_gpu_node_then_the_agent_lands_on_the_node_labelled_later(
    scenario: str, cluster: str
) -> None:
    values, taints, labels = SCENARIOS[scenario]
    nodes, check_nodes = CPU_CLUSTERS[cluster]
    job, template, hooks = release(values)
    agent = daemon_pod(template["spec"])

    assert placed(job, nodes) == check_nodes  # the pre-install hook finishes
    assert placed(agent, nodes) == []  # DESIRED 0

    gpu = node("gpu-1", taints=taints)  # the pool scales up; not labelled yet
    assert refusal(agent, gpu) == "node(s) didn't match Pod's node affinity/selector"
    gpu["metadata"]["labels"].update(labels)
    assert placed(agent, [*nodes, gpu]) == ["gpu-1"]

    # nothing makes the new pod wait: no init container, nothing of the hooks (deleted once
    # they succeed) referenced
    assert "initContainers" not in template["spec"]
    text = json.dumps(template)
    assert [name for name in hooks if name in text] == []


def test_the_jobs_own_placement_values_pick_its_node() -> None:
    system = node("system-1", {"pool": "system"}, [{"key": "dedicated", "value": "system",
                                                    "effect": "NoSchedule"}])  # fmt: skip
    nodes = [system, node("cpu-2")]
    job, _, _ = release(WITH_CONFIGS)
    assert placed(job, nodes) == ["cpu-2"]
    placement = {
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
    }
    job, _, _ = release({**WITH_CONFIGS, "validate": placement})
    assert placed(job, nodes) == ["system-1"]


def test_the_placement_model_refuses_as_the_scheduler_does() -> None:
    """The filters say no where the scheduler does, in its words."""
    tainted = node("n", taints=[{"key": "k", "value": "v", "effect": "NoExecute"}])
    assert refusal({}, tainted) == "node(s) had untolerated taint {k: v}"
    assert refusal({"tolerations": [{"key": "k", "operator": "Exists"}]}, tainted) is None
    assert refusal({"tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]}, tainted)
    assert refusal({}, node("n", taints=[{"key": "k", "effect": "PreferNoSchedule"}])) is None
    assert refusal({}, node("n", unschedulable=True)) == "node(s) were unschedulable"
    assert refusal(daemon_pod({}), node("n", unschedulable=True)) is None
    assert refusal({"nodeSelector": {"a": "b"}}, node("n", {"a": "c"})) is not None

    def term(*exprs: dict[str, Any]) -> dict[str, Any]:
        required = {"nodeSelectorTerms": [{"matchExpressions": list(exprs)}]}
        return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                              required}}}  # fmt: skip

    assert refusal(term(), node("n")) is not None  # an empty term matches no node
    assert refusal(term({"key": "a", "operator": "NotIn", "values": ["x"]}), node("n")) is None
    four = node("n", {"a": "4"})
    assert refusal(term({"key": "a", "operator": "Gt", "values": ["3"]}), four) is None
    assert refusal(term({"key": "a", "operator": "Gt", "values": ["5"]}), four) is not None
