"""`gpuslice advise` as a user runs it, against the synthetic Prometheus: a table, JSON
and a config `gpuslice config validate` accepts; every bad input is one error line and
exit 1, never a traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice.testing.prometheus import SyntheticPrometheus

END = "1800000000"


def gpuslice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuslice", *args],
        capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "NO_PROXY": "127.0.0.1"},
    )  # fmt: skip


def advise(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return gpuslice("advise", "--prometheus", url, "--end", END, "--window", "1d", *args)


def failed_in_one_line(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert done.returncode == code, done
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("gpuslice: error: ")
    return line


def test_the_table_has_one_row_per_workload_and_a_summary() -> None:
    with SyntheticPrometheus(8) as fake:
        done = advise(fake.url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["WORKLOAD", "PODS", "HOLDS"]
    assert len(lines) == 1 + 8 + 2  # each pod is its own job here
    assert lines[1].split()[:2] == ["team-0/job0/main*", "1"]
    assert "gpu 1/4 of A100-SXM4-40GB (40,960 MiB)" in lines[1]
    assert "2880 (24.0 h)" in lines[1]
    assert lines[-2] == "* grouped by the pods' name prefix: no owner known (kube_pod_owner)"
    assert lines[-1] == (
        "8 workloads: 1 fits, 1 over-packed, 6 wasteful; 0.69 GPUs could be given back"
    )


def test_json_and_a_config_that_validates(tmp_path: Path) -> None:
    with SyntheticPrometheus(8) as fake:
        as_json = advise(fake.url, "--output", "json")
        as_config = advise(fake.url, "--output", "config")
    report = json.loads(as_json.stdout)
    assert len(report["workloads"]) == 8
    smallest = min(w["replicas"] for w in report["workloads"])
    assert f"replicas: {smallest}" in as_config.stdout
    path = tmp_path / "advised.yaml"
    path.write_text(as_config.stdout)
    checked = gpuslice("config", "validate", str(path))
    assert checked.returncode == 0, checked.stderr


def test_an_unreachable_prometheus() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert "cannot reach Prometheus" in failed_in_one_line(advise(url))


def test_a_url_that_is_not_prometheus() -> None:
    page = (200, "text/html", b"<html>" + b"<div>" * 10000 + b"</html>")
    with SyntheticPrometheus(0, respond=lambda path, params: page) as fake:
        line = failed_in_one_line(advise(fake.url))
    assert "does not answer as Prometheus' HTTP API" in line


def test_a_window_without_data() -> None:
    with SyntheticPrometheus(0) as fake:
        line = failed_in_one_line(advise(fake.url))
    assert f"no gpuslice container series in the last 1d at {fake.url}" in line


@pytest.mark.parametrize(
    ("args", "said", "code"),
    [
        (["--window", "7x"], '--window "7x": expected a duration', 1),
        (["--window", "400d"], "at most 90d", 1),
        (["--step", "2d"], "--step 2d is longer than --window 1d", 1),
        (["--step", "50ms"], "--window 1d is more than 1,000,000 steps of 50ms", 1),
        (["--output", "yaml"], "Invalid value for '--output'", 2),  # a usage error
    ],
)
def test_bad_flags(args: list[str], said: str, code: int) -> None:
    with SyntheticPrometheus(1) as fake:
        assert said in failed_in_one_line(advise(fake.url, *args), code)


def test_the_demo_shows_a_short_advice_table_with_every_verdict() -> None:
    done = gpuslice("demo", "--advise")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[2].startswith("WORKLOAD")
    rows = lines[3:11]
    assert {row.split()[-1] for row in rows} >= {"fits", "over-packed", "back"}


def test_a_mig_config_the_agent_takes_unchanged(tmp_path: Path) -> None:
    with SyntheticPrometheus(8) as fake:
        done = advise(fake.url, "--output", "mig-config")
    assert done.returncode == 0, done.stderr
    path = tmp_path / "advised-mig.yaml"
    path.write_text(done.stdout)
    node = tmp_path / "node.yaml"
    node.write_text("name: pool\ngpus: [{model: a100-40gb, count: 2}]\n")
    # the layouts it proposes, and what the device plugin advertises once they are made
    inspected = gpuslice("inspect", "--fake-hardware", str(node), "--mig-parted-config",
                         str(path), "--mig-config", "advised-nvidia-a100-sxm4-40gb",
                         "--mig-strategy", "mixed", "--output", "json")  # fmt: skip
    assert inspected.returncode == 0, inspected.stderr
    report = json.loads(inspected.stdout)
    # 8 pods: 5 peak above a 1g.5gb with 10 % headroom, 3 below
    assert report["resources"] == {"nvidia.com/mig-1g.10gb": 5, "nvidia.com/mig-1g.5gb": 3}
