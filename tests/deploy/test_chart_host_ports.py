"""Upgrades finish under hostNetwork: an upgrade's surge pod (maxSurge 1) must be placed on
the node beside the old pod, so the chart's pods may hold no host port that the old pod
holds. The scheduler's host-port rule (chart_kit.host_port_conflicts) is applied to the old
and the new pod of every value set and of hostNetwork variants. The probes then run in the
container over the agent's own status socket; here the probe command is run for real
against agents sharing one port, and reaches its own agent each time."""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chart_kit import (
    CHART,
    NAMESPACE,
    RELEASE,
    ROOT,
    VALUE_SETS,
    container,
    env,
    host_port_conflicts,
    host_ports,
    rendered,
    the,
    tool,
)

from gpuslice.adapters.status_http import StatusServer

HOST_NETWORK_VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {"hostNetwork": True},
    "ports-moved": {"hostNetwork": True, "statusPort": 9400, "metrics": {"port": 9401}},
    "metrics-on-loopback": {"hostNetwork": True, "metrics": {"bindAddress": "127.0.0.1"}},
    "monitored": {
        "hostNetwork": True,
        "monitoring": {"serviceMonitor": {"enabled": True}},
        "metrics": {"auth": "none"},
    },
}
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def pod_spec(values: dict[str, Any]) -> dict[str, Any]:
    gen = tool()
    objects = gen.objects(gen.render(CHART, values, release=RELEASE, namespace=NAMESPACE))
    return the(tuple(objects), "DaemonSet")["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def upgraded(values: dict[str, Any]) -> dict[str, Any]:
    """The same values with a new image: what `helm upgrade` to a new version rolls out."""
    image = {**values.get("image", {}), "tag": "9.9.9"}
    return {**values, "image": image}


@pytest.mark.parametrize("name", [*VALUE_SETS, *(f"host-{v}" for v in HOST_NETWORK_VARIANTS)])
def test_the_surge_pod_fits_beside_the_old_one(name: str) -> None:
    values = VALUE_SETS[name] if name in VALUE_SETS else HOST_NETWORK_VARIANTS[name[5:]]
    old, new = pod_spec(values), pod_spec(upgraded(values))
    assert new["containers"][0]["image"] != old["containers"][0]["image"]
    assert host_port_conflicts(old, new) == set()


@pytest.mark.parametrize("variant", HOST_NETWORK_VARIANTS)
def test_under_host_network_no_port_is_held_and_no_probe_names_one(variant: str) -> None:
    spec = pod_spec(HOST_NETWORK_VARIANTS[variant])
    assert spec["hostNetwork"] is True
    assert host_ports(spec) == set()
    agent = spec["containers"][0]
    for probe in PROBES:
        assert set(agent[probe]) & {"httpGet", "tcpSocket", "grpc"} == set(), probe


def test_any_old_pod_lets_the_new_one_in_even_one_that_held_the_ports() -> None:
    """The pods of earlier versions declared both ports, which hostNetwork turned into host
    ports: the rule refuses two of those on one node, and the new pod, holding none, fits
    beside one."""
    earlier = copy.deepcopy(pod_spec({}))  # ports declared, as every earlier version did
    earlier["hostNetwork"] = True
    assert host_port_conflicts(earlier, earlier) == {
        ("0.0.0.0", "TCP", 8080),
        ("0.0.0.0", "TCP", 8081),
    }
    assert host_port_conflicts(earlier, pod_spec({"hostNetwork": True})) == set()


def test_the_rule_reads_host_ips_and_protocols_as_the_scheduler_does() -> None:
    def pod(*ports: dict[str, Any]) -> dict[str, Any]:
        return {"containers": [{"name": "c", "ports": list(ports)}]}

    web = {"containerPort": 80, "hostPort": 80}
    assert host_port_conflicts(pod(web), pod(web)) == {("0.0.0.0", "TCP", 80)}
    assert host_port_conflicts(pod(web), pod({**web, "protocol": "UDP"})) == set()
    one, two = {**web, "hostIP": "10.0.0.1"}, {**web, "hostIP": "10.0.0.2"}
    assert host_port_conflicts(pod(one), pod(two)) == set()
    assert host_port_conflicts(pod(one), pod(web)) == {("0.0.0.0", "TCP", 80)}
    assert host_port_conflicts(pod({"containerPort": 80}), pod({"containerPort": 80})) == set()


def test_without_host_network_the_ports_stay_declared_for_the_pod_network() -> None:
    agent = container(rendered("defaults"))
    assert {p["name"] for p in agent["ports"]} == {"status", "metrics"}
    assert all("hostPort" not in p for p in agent["ports"])
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "status"}


def test_the_socket_lives_in_a_directory_of_the_pods_own() -> None:
    objects = rendered("host-network")
    spec = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    agent = container(objects)
    socket_path = env(objects)["GPUSLICE_STATUS_SOCKET"]
    (mount,) = [m for m in agent["volumeMounts"] if m["name"] == "status-socket"]
    assert mount["mountPath"] == str(Path(socket_path).parent)
    (volume,) = [v for v in spec["volumes"] if v["name"] == "status-socket"]
    assert "emptyDir" in volume  # the root filesystem is read-only, and nothing is shared
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_probes_interpreter_is_the_images() -> None:
    command = container(rendered("host-network"))["readinessProbe"]["exec"]["command"]
    venv = Path(command[0]).parent.parent
    dockerfile = (ROOT / "deploy" / "image" / "Dockerfile").read_text()
    assert f"python3 -m venv --without-pip {venv}" in dockerfile
    assert f'ENTRYPOINT ["{venv}/bin/gpuslice"]' in dockerfile


async def run_probe(command: list[str], socket_path: str) -> subprocess.CompletedProcess[str]:
    """The probe as the kubelet runs it, with this test's interpreter and socket (off the
    loop, which serves the agents)."""
    argv = [sys.executable, *command[1:-2], socket_path, command[-1]]
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=30, check=False
    )


async def test_each_probe_reaches_its_own_agent_while_two_share_the_port(tmp_path: Path) -> None:
    agent = container(rendered("host-network"))
    commands = {p: agent[p]["exec"]["command"] for p in PROBES}
    old_sock, new_sock = str(tmp_path / "old.sock"), str(tmp_path / "new.sock")
    ready = lambda: (True, {"agent": "old"})  # noqa: E731
    waiting = lambda: (False, {"agent": "new"})  # noqa: E731
    async with StatusServer("127.0.0.1:0", ready, unix_path=old_sock) as old:  # noqa: SIM117
        async with StatusServer(f"127.0.0.1:{old.port}", waiting, unix_path=new_sock):
            for _ in range(5):  # the shared port would hand some of these to the other agent
                to_old = await run_probe(commands["readinessProbe"], old_sock)
                assert to_old.returncode == 0, to_old.stdout
                to_new = await run_probe(commands["readinessProbe"], new_sock)
                assert to_new.returncode == 1
                assert '"agent": "new"' in to_new.stdout
            assert (await run_probe(commands["livenessProbe"], new_sock)).returncode == 0
    gone = await run_probe(commands["livenessProbe"], old_sock)
    assert gone.returncode == 1
    assert old_sock in gone.stdout
