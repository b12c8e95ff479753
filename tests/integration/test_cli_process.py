"""`gpuslice` as a real process: `run` against the kubelet stand-in (register,
SIGHUP, SIGTERM, start-up errors, no NVML), JSON logs, `demo` (also from an installed
wheel), `inspect` and `config validate`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
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
    _assert_demo_output(result.stdout, result.stderr)


def _assert_demo_output(out: str, err: str) -> None:
    assert "notebook-alice/jupyter" in out
    assert "NVIDIA_VISIBLE_DEVICES" in out
    assert "XID 79" in out
    assert "now Unhealthy: 4" in out
    assert "a new pod still gets a healthy GPU" in out
    assert "plugin sockets left behind: none" in out
    assert "Traceback" not in err


def test_demo_runs_from_an_installed_wheel_outside_the_checkout(tmp_path: Path) -> None:
    """The wheel carries what the demo needs: built from this tree, installed into a fresh
    venv (the locked dependencies reached through a path entry, not the editable install)
    and run from a directory that is not the checkout."""
    repo = Path(__file__).resolve().parents[2]
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(repo)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if build.returncode != 0 and "hatchling" in build.stderr and "No matching" in build.stderr:
        pytest.skip("the build backend (hatchling) cannot be fetched here")
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("gpuslice-*.whl")
    assert "gpuslice/data/dgx-a100-demo.yaml" in zipfile.ZipFile(wheel).namelist()

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    subprocess.run([*install, "--no-deps", "--no-index", str(wheel)], check=True, timeout=120)
    (site,) = (env_dir / "lib").glob("python3*/site-packages")
    deps = next(p for p in map(Path, sys.path) if p.name == "site-packages" and p.is_dir())
    (site / "locked-deps.pth").write_text(f"{deps}\n")  # a plain path: its .pth files stay off

    where = subprocess.run(
        [python, "-c", "import gpuslice; print(gpuslice.__file__)"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    assert where.stdout.startswith(str(site)), where.stdout
    result = subprocess.run(
        [env_dir / "bin" / "gpuslice", "demo"],
        capture_output=True, text=True, check=False, cwd=tmp_path, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    _assert_demo_output(result.stdout, result.stderr)


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


# ---- one-line errors a process ends with, and JSON logs


def _json_lines(lines: list[str]) -> list[dict[str, object]]:
    """Every line parsed as a JSON object (fails on the first line that is not one)."""
    events = []
    for line in lines:
        event = json.loads(line)
        assert isinstance(event, dict), line
        events.append(event)
    return events


async def test_json_logs_make_grpc_core_lines_and_the_final_error_json(
    plugin_dir: str, processes: list[AgentProcess]
) -> None:
    """GRPC_VERBOSITY=debug makes gRPC C-core write to stderr as the plugin server starts;
    then the plugin socket is replaced by a directory, so the server cannot be restarted
    and the agent exits 1 once its restart budget is spent. Every line is JSON."""
    proc = await _run(
        processes,
        plugin_dir,
        *("--fake-hardware", "t4", "--labels", "false", "--log-format", "json"),
        env=clean_env(GRPC_VERBOSITY="debug"),
    )
    sock = os.path.join(plugin_dir, "nvidia-gpu.sock")
    await proc.wait_for_line(sock)  # serving on it
    os.unlink(sock)
    os.mkdir(sock)
    rc, _ = await proc.wait(30)
    assert rc == 1
    events = _json_lines(proc.lines)
    assert any(e["event"] == "grpc_core" for e in events), proc.log
    last = events[-1]
    assert (last["event"], last["level"], last["exit_code"]) == ("exit_on_error", "error", 1)
    assert "nvidia.com/gpu" in str(last["error"])


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["run", "--log-format", "json", "--mig-strategy", "mix"], "--mig-strategy"),
        (["labels", "--log-format=json", "--kube-api-qps", "fast"], "--kube-api-qps"),
        (["run", "--log-format", "json", "--kubelet-sockt", "/x"], "--kubelet-sockt"),
    ],
)
def test_json_logs_make_an_early_error_one_json_event(args: list[str], flag: str) -> None:
    """A bad value or an unknown option, refused before anything runs, is one JSON event."""
    result = run_once(*args)
    assert result.returncode != 0
    (event,) = _json_lines(result.stderr.splitlines())
    assert event["event"] == "exit_on_error"
    assert flag in str(event["error"])


@pytest.fixture
def port_in_use() -> Iterator[str]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield f"127.0.0.1:{taken.getsockname()[1]}"


@pytest.mark.parametrize("case", ["in use", "not on this host", "bad port", "bad host"])
async def test_a_status_address_it_cannot_use_is_one_line_naming_the_flag(
    plugin_dir: str, processes: list[AgentProcess], port_in_use: str, case: str
) -> None:
    address = {
        "in use": port_in_use,  # with hostNetwork, any process on the node
        "not on this host": "192.0.2.1:8080",  # TEST-NET-1
        "bad port": "127.0.0.1:99999",
        "bad host": "-" * 70 + ":8080",
    }[case]
    proc = await _run(
        processes, plugin_dir, "--fake-hardware", "t4", "--labels", "false",
        "--status-address", address,
    )  # fmt: skip
    rc, _ = await proc.wait()
    assert rc == 1
    line = _one_error_line(proc.log)
    assert line.startswith("gpuslice: error: --status-address")
    assert address in line
    assert _plugin_sockets(plugin_dir) == []


KUBECONFIGS = {
    "not YAML": "clusters: [a\n",
    "not a mapping": "just a string\n",
    "wrong types": "apiVersion: v1\nclusters: 5\n",
    "no clusters": "apiVersion: v1\nkind: Config\ncurrent-context: x\n",
    "bad server URL": (
        "apiVersion: v1\nkind: Config\ncurrent-context: a\n"
        "clusters: [{name: a, cluster: {server: '::::'}}]\n"
        "contexts: [{name: a, context: {cluster: a, user: u}}]\n"
        "users: [{name: u, user: {token: x}}]\n"
    ),
    "not UTF-8": b"\xff\xfe\x00",
}


@pytest.mark.parametrize("case", KUBECONFIGS)
def test_a_malformed_kubeconfig_is_one_line_naming_the_flag(tmp_path: Path, case: str) -> None:
    path = tmp_path / "kubeconfig"
    content = KUBECONFIGS[case]
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = run_once(
        "labels", "--oneshot", "--fake-hardware", "t4", "--node-name", "n1",
        "--kubeconfig", str(path),
    )  # fmt: skip
    assert result.returncode == 1
    line = _one_error_line(result.stderr)
    assert line.startswith(f"gpuslice: error: --kubeconfig (KUBECONFIG) {path}: not a usable")
