"""The install-time check of config.map: a pre-install/pre-upgrade hook Job runs the agent's
own `gpuslice config validate` with the agent's image on a hook copy of the configs, so a typo
fails `helm install` with the agent's one-line error. The command the Job runs is run here,
for real, on the ConfigMap data the chart rendered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chart_kit import (
    CONFIGS,
    HOOK,
    NVIDIA_VALUES,
    container,
    is_hook,
    kube_versions,
    rendered,
    schema_errors,
    tool,
)

CHART = tool().CHART
TYPO = "version: v1\nsharing:\n  timeSlicing:\n    resourcess:\n    - {name: nvidia.com/gpu}\n"
GPUSLICE = str(Path(sys.executable).with_name("gpuslice"))


def hooks(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    objects = tool().objects(tool().render(CHART, values, release="gpu", namespace="gpu-system"))
    return {o["kind"]: o for o in objects if is_hook(o)}


def run_the_job(values: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The Job's container command, with its ConfigMap volume written to a directory."""
    found = hooks(values)
    job, data = found["Job"], found["ConfigMap"]
    pod = job["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    (mount,) = agent["volumeMounts"]
    (volume,) = pod["volumes"]
    assert volume["configMap"]["name"] == data["metadata"]["name"]
    for entry, text in data["data"].items():
        (tmp_path / entry).write_text(text)
    args = [str(tmp_path) if a == mount["mountPath"] else a for a in agent["args"]]
    return subprocess.run(
        [GPUSLICE, *args], env={}, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_hook_runs_before_install_and_upgrade_with_the_agents_image() -> None:
    found = hooks({"config": {"map": CONFIGS, "default": "t4-ts-4"}})
    assert set(found) == {"ConfigMap", "Job"}
    job, data = found["Job"], found["ConfigMap"]
    for obj in (job, data):
        assert obj["metadata"]["annotations"][HOOK] == "pre-install,pre-upgrade"
    weights = [int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for o in (data, job)]
    assert weights[0] < weights[1]  # the configs exist before the Job starts
    assert data["data"] == CONFIGS
    (agent,) = job["spec"]["template"]["spec"]["containers"]
    assert agent["image"] == container(rendered("config-map"))["image"]
    assert agent["args"][:2] == ["config", "validate"]
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_no_hook_without_inline_configs_or_when_turned_off() -> None:
    assert hooks({}) == {}
    assert hooks({"config": {"name": "theirs"}}) == {}
    assert hooks({"config": {"map": CONFIGS, "default": "t4-ts-4", "validate": False}}) == {}


def test_the_jobs_command_passes_good_configs(tmp_path: Path) -> None:
    result = run_the_job({"config": {"map": CONFIGS, "default": "t4-ts-4"}}, tmp_path)
    assert result.returncode == 0, result.stderr


def test_the_jobs_command_refuses_a_typo_with_the_agents_one_line_error(tmp_path: Path) -> None:
    values = {"config": {"map": {**CONFIGS, "typo": TYPO}, "default": "t4-ts-4"}}
    result = run_the_job(values, tmp_path)
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("gpuslice: error: ")
    assert "typo: sharing.timeSlicing.resourcess: unknown field; did you mean resources?" in line


def test_the_job_checks_each_configs_text_only(tmp_path: Path) -> None:
    """What depends on the node (GPUs, MIG mode, MPS_ROOT) is the agent's to check there:
    an MPS config passes the Job whatever mps.enabled says, and the Job gets no flag env."""
    mps = (
        "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n"
    )
    values = {"config": {"map": {"mps": mps}}, "migStrategy": "mixed"}
    (agent,) = hooks(values)["Job"]["spec"]["template"]["spec"]["containers"]
    assert "env" not in agent
    assert run_the_job(values, tmp_path).returncode == 0


FOLLOWED = {
    "hostNetwork": True,
    "tolerations": [{"key": "gpu", "operator": "Equal", "value": "on", "effect": "NoExecute"}],
    "priorityClassName": "system-cluster-critical",
    "imagePullSecrets": [{"name": "regcred"}],
    "nodeSelector": {"pool": "gpu"},
    "podSecurityContext": {"seLinuxOptions": {"type": "spc_t"}, "runAsGroup": 0},
    "securityContext": {"seLinuxOptions": {"type": "spc_t"}, "runAsUser": 0},
    "runtimeClassName": "nvidia",
}
WITH_CONFIGS = {"config": {"map": CONFIGS, "default": "t4-ts-4"}}


def job_and_agent_pods(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    objects = tool().objects(tool().render(CHART, values, release="gpu", namespace="gpu-system"))
    (job,) = [o for o in objects if o["kind"] == "Job"]
    (agent,) = [o for o in objects if o["kind"] == "DaemonSet"]
    return job["spec"]["template"]["spec"], agent["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    "key", ["hostNetwork", "dnsPolicy", "tolerations", "priorityClassName", "imagePullSecrets"]
)
def test_the_job_follows_the_agent_pods_setting(key: str) -> None:
    job, agent = job_and_agent_pods({**WITH_CONFIGS, **FOLLOWED})
    assert key in agent
    assert job[key] == agent[key]
    plain_job, plain_agent = job_and_agent_pods(WITH_CONFIGS)
    assert plain_job.get(key) == plain_agent.get(key)  # defaults too (or both unset)


def test_the_job_takes_the_agents_security_contexts_over_its_own() -> None:
    job, agent = job_and_agent_pods({**WITH_CONFIGS, **FOLLOWED})
    assert job["securityContext"].items() >= agent["securityContext"].items()
    assert job["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (check,) = job["containers"]
    assert check["securityContext"] == FOLLOWED["securityContext"]
    plain, _ = job_and_agent_pods(WITH_CONFIGS)
    assert plain["securityContext"]["runAsNonRoot"] is True  # no root unless the agent's is
    assert plain["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


# NVIDIA's values file with the GPU Operator's device-plugin label as nodeSelector, on a
# cluster without a pod network.
GPU_NODES_ONLY = {
    **NVIDIA_VALUES,
    **WITH_CONFIGS,
    "nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"},
    "runtimeClassName": "nvidia",
    "hostNetwork": True,
}


@pytest.mark.parametrize("values", [GPU_NODES_ONLY, {**WITH_CONFIGS, **FOLLOWED}])
def test_the_job_needs_no_gpu_node_nor_the_gpu_runtime(values: dict[str, Any]) -> None:
    """Pinned to the agent's nodes, the Job would wait for a GPU node that a pool scaling
    from zero, or NFD yet to label it, does not have at install: it takes none of the agent's
    node selection, and still what lets a pod start anywhere."""
    job, agent = job_and_agent_pods(values)
    for key in ("nodeSelector", "affinity", "runtimeClassName"):
        assert key in agent
        assert key not in job
    for key in ("hostNetwork", "dnsPolicy", "tolerations"):
        assert job[key] == agent[key]


PLACEMENT = {
    "nodeSelector": {"node-role.example.com/system": "true"},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["gpu"]}]}
                ]
            }
        }
    },
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system",
                     "effect": "NoSchedule"}],
}  # fmt: skip


def test_the_jobs_own_placement_values_place_it_and_only_it() -> None:
    job, agent = job_and_agent_pods({**WITH_CONFIGS, **FOLLOWED, "validate": PLACEMENT})
    assert job["nodeSelector"] == PLACEMENT["nodeSelector"]
    assert job["affinity"] == PLACEMENT["affinity"]
    assert job["tolerations"] == FOLLOWED["tolerations"] + PLACEMENT["tolerations"]
    _, unplaced = job_and_agent_pods({**WITH_CONFIGS, **FOLLOWED})
    assert agent == unplaced


def test_a_job_that_cannot_start_fails_before_helm_times_out_and_is_kept() -> None:
    """Helm waits 5 minutes by default: a pod that never starts (no sandbox, no image,
    unschedulable) must fail the Job first, so that helm reports the Job's failure
    (DeadlineExceeded) and the failed Job stays for its pod's events."""
    found = hooks(WITH_CONFIGS)
    spec = found["Job"]["spec"]
    assert 0 < spec["activeDeadlineSeconds"] < 300
    assert spec["backoffLimit"] == 0
    policy = found["Job"]["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    assert set(policy.split(",")) == {"before-hook-creation", "hook-succeeded"}


def test_the_job_with_every_followed_setting_is_a_valid_job() -> None:
    values = {**WITH_CONFIGS, **FOLLOWED, "validate": PLACEMENT}
    objects = tool().objects(tool().render(CHART, values, release="gpu", namespace="gpu-system"))
    versions = kube_versions()
    for obj in objects:
        if is_hook(obj):
            for version in (versions[0], versions[-1]):
                assert schema_errors(obj, version) == []
