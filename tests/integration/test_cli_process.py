"""`gpuslice` as a real process: `run` against the kubelet stand-in (register,
SIGHUP, SIGTERM, start-up errors, no NVML), `demo`, `inspect` and `config validate`."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from agent_harness import EXAMPLES, GPU, registrations, serving, write_file
from process_harness import AgentProcess, clean_env, run_once

from gpuslice.testing.kubelet import KubeletStandin

EXIT_WITHIN_S = 5.0
TIME_SLICING = (EXAMPLES / "time-slicing.yaml").read_text()


def _one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("gpuslice: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def _nvml_loads() -> bool:
    from gpuslice.adapters.nvml import NvmlBackend
    from gpuslice.core.errors import GpusliceError

    try:
        NvmlBackend.open().close()
    except GpusliceError:
        return False
    return True


without_nvml = pytest.mark.skipif(_nvml_loads(), reason="NVML loads on this machine")


def _plugin_sockets(plugin_dir: str) -> list[str]:
    return sorted(n for n in os.listdir(plugin_dir) if n.endswith(".sock") and n != "kubelet.sock")


async def _run(
    processes: list[AgentProcess], plugin_dir: str, *args: str, env: dict[str, str] | None = None
) -> AgentProcess:
    kubelet_socket = os.path.join(plugin_dir, "kubelet.sock")
    proc = await AgentProcess.start([*args, "--kubelet-socket", kubelet_socket], env=env)
    processes.append(proc)
    return proc


async def test_run_registers_and_exits_zero_on_sigterm_removing_its_sockets(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess], tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(TIME_SLICING)
    proc = await _run(
        processes, plugin_dir, "--fake-hardware", "t4x4", "--config-file", str(config)
    )
    await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), 10)
    assert _plugin_sockets(plugin_dir) == ["nvidia-gpu.sock"]

    proc.signal(signal.SIGTERM)
    rc, took = await proc.wait()
    print(f"SIGTERM -> exit {rc} in {took * 1000:.0f} ms")
    assert rc == 0, proc.log
    assert took < EXIT_WITHIN_S
    assert _plugin_sockets(plugin_dir) == []
    assert "Traceback" not in proc.log
    await kubelet.wait_for(lambda k: k.endpoint(GPU) is None)


async def test_sighup_re_reads_the_edited_config_file(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess], tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(TIME_SLICING)
    proc = await _run(
        processes, plugin_dir, "--fake-hardware", "t4x4", "--config-file", str(config)
    )
    await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), 10)

    write_file(config, TIME_SLICING.replace("replicas: 4", "replicas: 2"))
    proc.signal(signal.SIGHUP)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 8}))
    assert registrations(kubelet) == {GPU: 1}

    write_file(config, "version: v1\nsharing: {timeSlicing: {resources: []}}\n")
    proc.signal(signal.SIGHUP)
    rejected = await proc.wait_for_line("config_rejected_keeping_last_good")
    assert "sharing.timeSlicing.resources" in rejected
    assert serving(kubelet, {GPU: 8})
    assert proc.proc.returncode is None

    proc.signal(signal.SIGTERM)
    rc, _ = await proc.wait()
    assert rc == 0, proc.log


BAD_STARTS = {
    "invalid file": (["--config-file", str(EXAMPLES / "invalid" / "one-replica.yaml")], {}),
    "missing file": (["--config-file", "/nonexistent/config.yaml"], {}),
    "unknown entry": (
        ["--config-file", str(EXAMPLES / "time-slicing-configmap.yaml"), "--config-name", "v100"],
        {},
    ),
    "bad flag value": (["--mig-strategy", "mix"], {}),
    "bad env value": ([], {"DEVICE_LIST_STRATEGY": "cdi"}),
    "unknown profile": (["--fake-hardware", "v100x8"], {}),
}


@pytest.mark.parametrize("case", BAD_STARTS.keys())
async def test_a_bad_start_exits_one_with_a_one_line_error(
    plugin_dir: str, processes: list[AgentProcess], case: str
) -> None:
    args, env = BAD_STARTS[case]
    if "--fake-hardware" not in args:
        args = ["--fake-hardware", "t4x4", *args]
    proc = await _run(processes, plugin_dir, *args, env=clean_env(**env))
    rc, _ = await proc.wait()
    assert rc == 1
    _one_error_line(proc.log)
    assert _plugin_sockets(plugin_dir) == []


async def test_a_mig_strategy_the_hardware_cannot_follow_exits_one_cleanly(
    plugin_dir: str, processes: list[AgentProcess]
) -> None:
    """migStrategy single on a node with MIG and non-MIG GPUs: one error line
    (after the agent's own log lines), no traceback, no socket left."""
    proc = await _run(
        processes, plugin_dir, "--fake-hardware", "a100-40gb-mig-mixed", "--mig-strategy", "single"
    )
    rc, _ = await proc.wait()
    assert rc == 1
    errors = [line for line in proc.lines if line.startswith("gpuslice: error: ")]
    assert len(errors) == 1, proc.log
    assert "use migStrategy mixed" in errors[0]
    assert "Traceback" not in proc.log
    assert _plugin_sockets(plugin_dir) == []


@without_nvml
async def test_without_nvml_run_exits_one_saying_why(
    plugin_dir: str, processes: list[AgentProcess]
) -> None:
    proc = await _run(processes, plugin_dir)
    rc, _ = await proc.wait()
    assert rc == 1
    line = _one_error_line(proc.log)
    assert "NVML" in line


@without_nvml
async def test_without_nvml_and_fail_on_init_error_false_it_waits_until_sigterm(
    plugin_dir: str, processes: list[AgentProcess]
) -> None:
    proc = await _run(processes, plugin_dir, "--fail-on-init-error=false")
    line = await proc.wait_for_line("backend_unavailable_waiting")
    assert "NVML" in line
    assert proc.proc.returncode is None
    assert _plugin_sockets(plugin_dir) == []
    proc.signal(signal.SIGTERM)
    rc, took = await proc.wait()
    assert rc == 0, proc.log
    assert took < EXIT_WITHIN_S


def test_demo_exits_zero_and_shows_the_allocation_and_the_fault() -> None:
    result = run_once("demo")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "notebook-alice/jupyter" in out
    assert "NVIDIA_VISIBLE_DEVICES" in out
    assert "XID 79" in out
    assert "now Unhealthy: 4" in out
    assert "a new pod still gets a healthy GPU" in out
    assert "plugin sockets left behind: none" in out
    assert "Traceback" not in result.stderr


INSPECT = {
    "t4x4-time-slicing": (
        ["--fake-hardware", "t4x4", "--config-file", str(EXAMPLES / "time-slicing.yaml")],
        {GPU: 16},
    ),
    "t4x4-renamed": (
        ["--fake-hardware", "t4x4", "--config-file", str(EXAMPLES / "time-slicing-renamed.yaml")],
        {"nvidia.com/gpu.shared": 16},
    ),
    "mig-mixed-configmap": (
        [
            "--fake-hardware",
            "a100-40gb-mig-mixed",
            "--config-file",
            str(EXAMPLES / "time-slicing-configmap.yaml"),
            "--config-name",
            "a100-40gb",
        ],
        {
            GPU: 8,
            "nvidia.com/mig-1g.5gb": 4,
            "nvidia.com/mig-2g.10gb": 2,
            "nvidia.com/mig-3g.20gb": 3,
        },
    ),
    "mig-single": (
        ["--fake-hardware", "a100-40gb-mig-single", "--mig-strategy", "single"],
        {GPU: 7},
    ),
}


@pytest.mark.parametrize("case", INSPECT.keys())
def test_inspect_json_reports_the_resource_counts(case: str) -> None:
    args, expected = INSPECT[case]
    result = run_once("inspect", *args, "--output", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["resources"] == expected


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_config_validate_accepts_every_example(path: Path) -> None:
    result = run_once("config", "validate", str(path))
    assert result.returncode == 0, result.stderr
    valid = [line for line in result.stdout.splitlines() if line.endswith(": valid")]
    assert valid, result.stdout
    assert all(line.startswith(str(path)) for line in valid)  # a ConfigMap: one per entry


@pytest.mark.parametrize("path", sorted((EXAMPLES / "invalid").iterdir()), ids=lambda p: p.name)
def test_config_validate_rejects_each_invalid_example_in_one_line(path: Path) -> None:
    """The line names the file and says what the file's own `# error:` comment says."""
    result = run_once("config", "validate", str(path))
    assert result.returncode == 1
    line = _one_error_line(result.stderr)
    expected = path.read_text().splitlines()[0].removeprefix("# error: ")
    assert line == f"gpuslice: error: {path}: {expected}"
