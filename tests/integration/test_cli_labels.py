"""`gpuslice labels` (the labeller alone, as GFD) and the labels of `gpuslice inspect`, as
real processes: oneshot writes the features file atomically and exits 0; interval mode
rewrites only on change, re-reads the config on SIGHUP and removes the file on SIGTERM;
the NodeFeature output without a cluster is a one-line error; a GFD DaemonSet's arguments
are accepted, the plugin's are refused in one line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import threading
from pathlib import Path

import pytest
from agent_harness import EXAMPLES, write_file
from node_harness import file_labels, time_slicing
from process_harness import GPUSLICE, AgentProcess, clean_env, run_once

from gpuslice.core.labels import TIMESTAMP_LABEL

GOLDEN = Path(__file__).resolve().parents[1] / "unit" / "core" / "golden"
TIME_SLICING = str(EXAMPLES / "time-slicing.yaml")
ONESHOT_T4X4 = ["--fake-hardware", "t4x4", "--config-file", TIME_SLICING]
TO_FILE = ["--use-node-feature-api=false"]


def _golden(case: str) -> dict[str, str]:
    text = (GOLDEN / f"{case}.labels").read_text(encoding="utf-8")
    pairs = (line.split("=", 1) for line in text.splitlines())
    return {k: v for k, v in pairs if k != TIMESTAMP_LABEL}


def _without_timestamp(labels: dict[str, str] | None) -> dict[str, str]:
    assert labels is not None
    return {k: v for k, v in labels.items() if k != TIMESTAMP_LABEL}


async def _labels_process(processes: list[AgentProcess], *args: str) -> AgentProcess:
    proc = await asyncio.create_subprocess_exec(
        GPUSLICE,
        "labels",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=clean_env(),
    )
    running = AgentProcess(proc)
    processes.append(running)
    return running


def test_oneshot_writes_the_expected_lines_atomically_and_exits_zero(tmp_path: Path) -> None:
    out = tmp_path / "features.d" / "gfd"
    result = run_once("labels", "--oneshot", *ONESHOT_T4X4, *TO_FILE, "--output-file", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines == sorted(lines)
    assert text.endswith("\n")
    labels = file_labels(out)
    assert _without_timestamp(labels) == _golden("t4x4-time-slicing")
    assert labels is not None
    assert labels[TIMESTAMP_LABEL].isdigit()
    assert os.listdir(out.parent) == ["gfd"]  # the temporary file was renamed, not left
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o644
    assert result.stdout == ""


def test_oneshot_with_an_empty_output_file_prints_the_labels(tmp_path: Path) -> None:
    result = run_once(
        "labels", "--oneshot", "--no-timestamp", *ONESHOT_T4X4, *TO_FILE, "--output-file", ""
    )
    assert result.returncode == 0, result.stderr
    expected = "".join(f"{k}={v}\n" for k, v in sorted(_golden("t4x4-time-slicing").items()))
    assert result.stdout == expected


def test_the_config_file_gfd_settings_apply(tmp_path: Path) -> None:
    """flags.gfd and flags.useNodeFeatureAPI in the file count, as in GFD."""
    out = tmp_path / "from-file"
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nflags:\n  useNodeFeatureAPI: false\n"
        f"  gfd:\n    oneshot: true\n    noTimestamp: true\n    outputFile: {out}\n"
    )
    result = run_once("labels", "--fake-hardware", "t4", "--config-file", str(config))
    assert result.returncode == 0, result.stderr
    assert file_labels(out) == _golden("t4")


@pytest.mark.parametrize(
    "args",
    [
        ["--oneshot", "--fake-hardware", "t4"],
        ["--oneshot", "--fake-hardware", "t4", "--node-name", "gpu-node-7"],
        ["--oneshot", "--fake-hardware", "t4", "--use-node-feature-api=true"],
    ],
    ids=["default", "node-name-but-no-cluster", "explicit"],
)
def test_the_node_feature_output_without_a_cluster_is_a_one_line_error(args: list[str]) -> None:
    result = run_once("labels", *args)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpuslice: error: useNodeFeatureAPI is true")
    assert "--use-node-feature-api=false" in lines[0]


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--config-file", "/nonexistent.yaml"], "/nonexistent.yaml"),
        (["--sleep-interval", "60"], "sleep-interval"),
        (["--fake-hardware", "v100x8"], "v100x8"),
    ],
    ids=["missing-config", "bare-number-interval", "unknown-profile"],
)
def test_a_bad_start_is_a_one_line_error(args: list[str], problem: str) -> None:
    base = ["--fake-hardware", "t4"] if "--fake-hardware" not in args else []
    result = run_once("labels", "--oneshot", *TO_FILE, "-o", "", *base, *args)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpuslice: error: ")
    assert problem in lines[0]


async def test_interval_mode_relabels_on_sighup_and_removes_the_file_on_sigterm(
    processes: list[AgentProcess], tmp_path: Path
) -> None:
    out = tmp_path / "features.d" / "gfd"
    config = tmp_path / "config.yaml"
    config.write_text(time_slicing(4))
    proc = await _labels_process(
        processes,
        *("--fake-hardware", "t4x4", "--config-file", str(config), *TO_FILE),
        *("--output-file", str(out), "--sleep-interval", "60s"),
    )
    await proc.wait_for_line("labels_published")
    assert _without_timestamp(file_labels(out)) == _golden("t4x4-time-slicing")

    reader = FileReader(out)
    reader.start()
    try:
        for replicas in (2, 3, 5, 6, 7, 8, 9, 10):
            write_file(config, time_slicing(replicas))
            proc.signal(signal.SIGHUP)
            await reader.until(f"nvidia.com/gpu.replicas={replicas}")
    finally:
        reader.stop()
    assert reader.torn == []  # every read saw a whole file, old or new
    assert reader.reads > 4

    proc.signal(signal.SIGTERM)
    rc, _ = await proc.wait()
    assert rc == 0, proc.log
    assert not out.exists()
    assert os.listdir(out.parent) == []
    assert "Traceback" not in proc.log


async def test_a_broken_config_on_sighup_keeps_the_labels(
    processes: list[AgentProcess], tmp_path: Path
) -> None:
    out = tmp_path / "gfd"
    config = tmp_path / "config.yaml"
    config.write_text(time_slicing(4))
    proc = await _labels_process(
        processes, "--fake-hardware", "t4x4", "--config-file", str(config), *TO_FILE, "-o", str(out)
    )
    await proc.wait_for_line("labels_published")
    before = out.read_text()
    write_file(config, "version: v1\nsharing: [\n")
    proc.signal(signal.SIGHUP)
    line = await proc.wait_for_line("config_rejected_keeping_last_good")
    assert str(config) in line
    assert out.read_text() == before
    proc.signal(signal.SIGTERM)
    rc, _ = await proc.wait()
    assert rc == 0, proc.log


class FileReader:
    """Reads a file over and over on a thread, as NFD might at any moment, and keeps
    every read that was not a whole label file."""

    def __init__(self, path: Path, lines: int = 26) -> None:
        self.path = path
        self.lines = lines
        self.reads = 0
        self.torn: list[str] = []
        self._seen: dict[str, asyncio.Event] = {}
        self._loop = asyncio.get_running_loop()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    async def until(self, line: str, timeout_s: float = 30.0) -> None:
        event = self._seen.setdefault(line, asyncio.Event())
        await asyncio.wait_for(event.wait(), timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                text = self.path.read_text(encoding="utf-8")
            except FileNotFoundError:
                self.torn.append("<missing>")
                continue
            self.reads += 1
            if not text.endswith("\n") or len(text.splitlines()) != self.lines:
                self.torn.append(text)
            for line in text.splitlines():
                event = self._seen.get(line)
                if event is not None and not event.is_set():
                    self._loop.call_soon_threadsafe(event.set)


def test_inspect_json_has_the_labels_without_the_timestamp() -> None:
    result = run_once("inspect", *ONESHOT_T4X4, "--output", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["labels"] == _golden("t4x4-time-slicing")
    assert report["resources"] == {"nvidia.com/gpu": 16}


def test_inspect_table_lists_the_labels() -> None:
    result = run_once("inspect", "--fake-hardware", "t4x4", "--config-file", TIME_SLICING)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    assert ["LABEL", "VALUE"] in rows
    assert ["nvidia.com/gpu.product", "Tesla-T4-SHARED"] in rows
    assert ["nvidia.com/gpu.replicas", "4"] in rows
    assert not any(row and row[0] == TIMESTAMP_LABEL for row in rows)


def _nvml_loads() -> bool:
    from gpuslice.adapters.nvml import NvmlBackend
    from gpuslice.core.errors import GpusliceError

    try:
        NvmlBackend.open().close()
    except GpusliceError:
        return False
    return True


without_nvml = pytest.mark.skipif(_nvml_loads(), reason="NVML loads on this machine")


@without_nvml
def test_without_nvml_labels_exits_one_saying_why(tmp_path: Path) -> None:
    result = run_once("labels", "--oneshot", *TO_FILE, "-o", str(tmp_path / "gfd"))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "NVML" in lines[0]
    assert not (tmp_path / "gfd").exists()


@without_nvml
def test_without_nvml_and_fail_on_init_error_false_only_the_timestamp_is_labelled(
    tmp_path: Path,
) -> None:
    """As GFD's null manager: no GPU labels, and the run still succeeds."""
    out = tmp_path / "gfd"
    result = run_once("labels", "--oneshot", "--fail-on-init-error=false", *TO_FILE, "-o", str(out))
    assert result.returncode == 0, result.stderr
    labels = file_labels(out)
    assert labels is not None
    assert list(labels) == [TIMESTAMP_LABEL]
    assert "backend_unavailable_labelling_no_gpus" in result.stderr


def test_a_gfd_daemonsets_arguments_work_unchanged(tmp_path: Path) -> None:
    """GFD's flags that change nothing here (API rates, driver paths) are still taken, and
    a bad value of one is still refused by name; GFD's env vars are read."""
    out = tmp_path / "gfd"
    args = [*ONESHOT_T4X4, *TO_FILE, "--output-file", str(out), "--kube-api-qps", "20",
            "--kube-api-burst", "40", "--driver-root", "/run/nvidia/driver",
            "--device-discovery-strategy", "nvml"]  # fmt: skip
    result = run_once("labels", *args, env=clean_env(GFD_ONESHOT="true", NVIDIA_DEV_ROOT="/"))
    assert result.returncode == 0, result.stderr
    assert "nvidia.com/gpu.replicas=4" in out.read_text(encoding="utf-8")

    refused = run_once("labels", *args, "--kube-api-qps", "fast")
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        'gpuslice: error: --kube-api-qps: got "fast"; expected a number of 0 or more, '
        "such as 5 or 2.5"
    ]


def test_a_plugin_flag_is_an_unknown_option_of_labels_in_one_line() -> None:
    result = run_once("labels", "--oneshot", "--kubelet-socket", "/x")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "gpuslice: error: No such option '--kubelet-socket'; see 'gpuslice labels --help'"
    ]
