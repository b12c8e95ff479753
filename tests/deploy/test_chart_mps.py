"""The mps-control DaemonSet (mps.enabled): where the MPS daemons run, so that they and
their clients outlive the agent's restarts and upgrades. Never replaced by an upgrade
(OnDelete), its own selector, the host's PID namespace for the MPS servers (never the
agent's pod for MPS), the agent pointed at its socket, the same MPS root and nodes."""

from __future__ import annotations

from typing import Any

import pytest
from chart_kit import RELEASE, container, env, rendered, the, tool

from gpuslice.commands.mps_control import SOCKET_NAME

ROOT = "/run/nvidia/mps"


def mps_control(objects: tuple[dict[str, Any], ...]) -> Any:
    return the(objects, "DaemonSet", mps_control=True)


def render(values: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    gen = tool()
    return tuple(gen.objects(gen.render(gen.CHART, values, release=RELEASE)))


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_daemons_run_in_a_daemonset_of_their_own_that_no_upgrade_replaces() -> None:
    objects = rendered("mps")
    daemons, agent = mps_control(objects), the(objects, "DaemonSet")
    assert daemons["spec"]["updateStrategy"] == {"type": "OnDelete"}
    pod = daemons["spec"]["template"]["spec"]
    (box,) = pod["containers"]
    assert box["image"] == container(objects)["image"]  # the agent's image
    assert box["args"][0] == "mps-control"
    assert "livenessProbe" not in box  # a restart would end every daemon and client
    assert "privileged" not in (box.get("securityContext") or {})
    assert pod["automountServiceAccountToken"] is False
    assert pod["hostPID"] is True  # the MPS servers see their clients' processes
    agent_pod = agent["spec"]["template"]["spec"]
    for key in ("affinity", "tolerations", "priorityClassName"):
        assert pod.get(key) == agent_pod.get(key), key
    assert "hostPID" not in agent_pod


def test_neither_selector_matches_the_other_daemonsets_pods() -> None:
    """NVIDIA's chart gives both DaemonSets one selector, and they fight over the pods."""
    objects = rendered("mps")
    daemons, agent = mps_control(objects), the(objects, "DaemonSet")
    for one, other in ((daemons, agent), (agent, daemons)):
        selector = one["spec"]["selector"]["matchLabels"]
        assert matches(selector, one["spec"]["template"]["metadata"]["labels"])
        assert not matches(selector, other["spec"]["template"]["metadata"]["labels"])


def test_the_agent_and_mps_control_share_the_root_and_the_socket() -> None:
    objects = rendered("mps")
    box = mps_control(objects)["spec"]["template"]["spec"]["containers"][0]
    theirs = {e["name"]: e["value"] for e in box["env"]}
    ours = env(objects)
    socket = f"{ROOT}/{SOCKET_NAME}"
    assert theirs["GPUSLICE_MPS_CONTROL_SOCKET"] == ours["GPUSLICE_MPS_CONTROL_SOCKET"] == socket
    assert theirs["MPS_ROOT"] == ours["MPS_ROOT"] == ROOT
    (volume,) = mps_control(objects)["spec"]["template"]["spec"]["volumes"]
    assert volume["hostPath"] == {"path": ROOT, "type": "DirectoryOrCreate"}
    assert box["volumeMounts"] == [{"name": volume["name"], "mountPath": ROOT}]
    assert theirs["NVIDIA_VISIBLE_DEVICES"] == "all"


@pytest.mark.parametrize(
    ("values", "host_pid"),
    [
        ({"mps": {"enabled": True}}, True),
        ({"mps": {"enabled": True, "enableHostPID": False}}, False),
        ({"mps": {"enabled": True}, "memoryBudget": {"policy": "terminate"}}, True),
    ],
)
def test_host_pid_is_the_values_decision_for_the_mps_control_pod_only(
    values: dict[str, Any], host_pid: bool
) -> None:
    pod = mps_control(render(values))["spec"]["template"]["spec"]
    assert pod.get("hostPID", False) is host_pid


def test_without_mps_there_is_no_mps_control_and_no_socket() -> None:
    objects = rendered("defaults")
    assert not [o for o in objects if o["kind"] == "DaemonSet" and "mps" in o["metadata"]["name"]]
    assert "GPUSLICE_MPS_CONTROL_SOCKET" not in env(objects)


def test_a_simulated_node_gets_the_simulated_control_daemon() -> None:
    objects = render({"mps": {"enabled": True}, "simulate": "t4x4"})
    args = mps_control(objects)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--simulated" in args
