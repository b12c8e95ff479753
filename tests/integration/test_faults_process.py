"""`gpuslice run` as a real process under faults: SIGKILLed and started again (it
serves the same device IDs, replaces the stale sockets the killed one left and
re-registers every resource), and a device-plugin server that can no longer
start (the process exits 1 with one line, so Kubernetes restarts the pod)."""

from __future__ import annotations

import os
import signal
import time

from agent_harness import EXAMPLES, is_socket, registrations, serving
from process_harness import AgentProcess

from gpuslice.core.resources import socket_name
from gpuslice.testing.kubelet import KubeletStandin

MIG_MIXED = [
    "--fake-hardware",
    "a100-40gb-mig-mixed",
    "--config-file",
    str(EXAMPLES / "time-slicing-configmap.yaml"),
    "--config-name",
    "a100-40gb",
]
FOUR = {
    "nvidia.com/gpu": 8,
    "nvidia.com/mig-1g.5gb": 4,
    "nvidia.com/mig-2g.10gb": 2,
    "nvidia.com/mig-3g.20gb": 3,
}


async def _run(processes: list[AgentProcess], plugin_dir: str, *args: str) -> AgentProcess:
    kubelet_socket = os.path.join(plugin_dir, "kubelet.sock")
    proc = await AgentProcess.start([*args, "--kubelet-socket", kubelet_socket])
    processes.append(proc)
    return proc


def _stamps(plugin_dir: str) -> dict[str, tuple[int, int]]:
    """Which file is at each socket path (inode numbers alone may be reused)."""
    out = {}
    for name in FOUR:
        st = os.lstat(os.path.join(plugin_dir, socket_name(name)))
        out[name] = (st.st_ino, st.st_ctime_ns)
    return out


async def test_a_sigkilled_agent_started_again_serves_the_same_ids_and_re_registers(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess]
) -> None:
    first = await _run(processes, plugin_dir, *MIG_MIXED)
    await kubelet.wait_for(lambda k: serving(k, FOUR), 15)
    ids = {name: set(kubelet.devices(name)) for name in FOUR}
    (held,) = await kubelet.admit("running-pod", {"main": {"nvidia.com/gpu": 1}})
    stale = _stamps(plugin_dir)

    first.signal(signal.SIGKILL)
    rc, _ = await first.wait()
    assert rc == -signal.SIGKILL
    await kubelet.wait_for(lambda k: all(k.endpoint(n) is None for n in FOUR))
    assert all(is_socket(os.path.join(plugin_dir, socket_name(n))) for n in FOUR)  # left behind
    assert kubelet.node_status().allocatable == dict.fromkeys(FOUR, 0)

    started = time.monotonic()
    second = await _run(processes, plugin_dir, *MIG_MIXED)
    await kubelet.wait_for(
        lambda k: serving(k, FOUR) and all(registrations(k)[n] == 2 for n in FOUR), 15
    )
    took = time.monotonic() - started
    print(f"SIGKILL, start again -> {len(FOUR)} resources registered in {took:.2f} s")
    assert {name: set(kubelet.devices(name)) for name in FOUR} == ids
    assert all(_stamps(plugin_dir)[n] != stale[n] for n in FOUR)  # replaced, not reused
    assert kubelet.stale_streams == []
    assert set(held.device_ids) <= ids["nvidia.com/gpu"]
    (fresh,) = await kubelet.admit("new-pod", {"main": {"nvidia.com/gpu": 1}})
    assert fresh.device_ids != held.device_ids

    second.signal(signal.SIGTERM)
    rc, _ = await second.wait()
    assert rc == 0, second.log
    assert "Traceback" not in second.log


async def test_a_server_that_cannot_start_again_makes_the_process_exit_one_with_one_line(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess]
) -> None:
    proc = await _run(processes, plugin_dir, "--fake-hardware", "t4x4")
    await kubelet.wait_for(lambda k: serving(k, {"nvidia.com/gpu": 4}), 15)
    path = os.path.join(plugin_dir, "nvidia-gpu.sock")
    while True:  # the agent may re-create its socket between our unlink and mkdir
        os.unlink(path)
        try:
            os.mkdir(path)
            break
        except FileExistsError:
            continue
    started = time.monotonic()
    await kubelet.restart()

    rc, _ = await proc.wait(15)
    print(f"server cannot start -> process exits {rc} after {time.monotonic() - started:.2f} s")
    assert rc == 1
    errors = [line for line in proc.lines if line.startswith("gpuslice: error: ")]
    assert len(errors) == 1, proc.log
    assert errors[0].startswith(
        "gpuslice: error: the device-plugin server for nvidia.com/gpu failed 6 times in a row"
    )
    assert f"cannot replace {path}: Is a directory" in errors[0]
    assert "Traceback" not in proc.log
    assert sum("plugin_server_failed" in line for line in proc.lines) == 5
    os.rmdir(path)
