"""`gpuslice advise` against a real Prometheus scraping `gpuslice run` on the simulated
t4x4 node (ts-4: each replica a quarter of a 15,360 MiB T4). Four pods of three workloads
use memory along curves this test chooses, through the events file (the same pid again
with a new size): one workload fits its share, one is over-packed, one (two pods) is
wasteful. Prometheus also scrapes a kube-state-metrics stand-in naming one pod's owner.
The advice is checked against figures computed here from the raw samples Prometheus
stored, evaluated step by step as Prometheus evaluates advise's queries.
.ci/run installs Prometheus, so there this fails rather than skips when it is missing."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from agent_harness import GPU, serving
from metrics_harness import Prometheus, free_port, prometheus_binary, scraped_node
from process_harness import AgentProcess, clean_env

from gpuslice.core.devices import physical_id
from gpuslice.testing.kubelet import KubeletStandin

MIB = 1024 * 1024
T4_MIB = 15360
STEP_S = 0.5
USED = "gpuslice_container_gpu_memory_used_bytes"
UTIL = "gpuslice_container_gpu_utilization_ratio"

# pod -> (pid, memory curve in MiB, SM utilisation curve in %)
CURVES = {
    "serving/infer-5d8f9c7b6-x2k4p": (4001, [2000, 2600, 3000, 2800, 2400, 2900, 2200, 2500],
                                      [40, 55, 60, 50, 45, 70, 65, 50]),
    "ml/train-0": (4002, [3000, 3300, 3600, 3500, 3400, 3550, 3200, 3450],
                   [90, 95, 99, 97, 92, 96, 98, 94]),
    "web/api-6f7d9c8b4-k2m9z": (4003, [500, 700, 800, 650, 600, 750, 550, 700],
                                [10, 12, 8, 15, 11, 9, 14, 10]),
    "web/api-6f7d9c8b4-p8x7w": (4004, [400, 600, 780, 500, 450, 620, 480, 530],
                                [5, 7, 6, 9, 4, 8, 6, 7]),
}  # fmt: skip


# kube-state-metrics' series of the infer pod's owner; the other pods have none known.
OWNERS = (
    'kube_pod_owner{namespace="serving",pod="infer-5d8f9c7b6-x2k4p",uid="u1",'
    'owner_kind="ReplicaSet",owner_name="infer-5d8f9c7b6",owner_is_controller="true"} 1\n'
)


@pytest.fixture
def kube_state_metrics() -> Iterator[str]:
    """A scrape target serving OWNERS, as kube-state-metrics would; its address."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = OWNERS.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def binary() -> str:
    return prometheus_binary()


@pytest.fixture
async def pod_kubelet(plugin_dir: str) -> AsyncIterator[KubeletStandin]:
    socket_path = os.path.join(plugin_dir, "pod-resources", "kubelet.sock")
    async with KubeletStandin(plugin_dir, socket_path) as standin:
        yield standin


async def advise(url: str, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in clean_env().items() if "proxy" not in k.lower()}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuslice", "advise", "--prometheus", url, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def stepped(
    raw: list[tuple[float, float]], end: float, window_s: float, how: str, closed: bool
) -> list[float]:
    """The samples advise counts, computed here from the raw ones: at each multiple of
    STEP_S in the window (which advise ends half a step off that grid, at or before
    `end`), the raw samples of the STEP_S before it folded by `how`, in MiB or percent
    rounded half up; that STEP_S is closed in Prometheus 2, left-open in Prometheus 3."""
    last = (math.floor(end / STEP_S) + 0.5) * STEP_S
    last -= STEP_S if last > end else 0
    out = []
    for k in range(math.ceil((last - window_s) / STEP_S), math.floor(last / STEP_S) + 1):
        t = k * STEP_S
        inside = [v for ts, v in raw if t - STEP_S <= ts <= t and (closed or ts > t - STEP_S)]
        if inside:
            folded = max(inside) / MIB if how == "max" else 100 * sum(inside) / len(inside)
            out.append(math.floor(folded + 0.5))
    return out


def raw_samples(
    prometheus: Prometheus, metric: str, pod: str, end: float, span_s: float
) -> list[tuple[float, float]]:
    """The samples Prometheus stored for the pod's series in (end - span_s, end]."""
    query = f'{metric}{{pod="{pod}"}}[{int(span_s * 1000)}ms]'
    params = urllib.parse.urlencode({"query": query, "time": f"{end:.3f}"})
    answer = prometheus._get(f"/api/v1/query?{params}")
    (series,) = answer["data"]["result"]
    return [(float(ts), float(v)) for ts, v in series["values"]]


async def test_advise_reads_real_prometheus_and_matches_figures_computed_from_raw_samples(
    binary: str,
    kube_state_metrics: str,
    pod_kubelet: KubeletStandin,
    plugin_dir: str,
    processes: list[AgentProcess],
    tmp_path: Path,
) -> None:
    port = free_port()
    work = tmp_path / "prometheus"
    work.mkdir()
    prometheus = Prometheus(binary, f"127.0.0.1:{port}", work, kube_state_metrics)
    await prometheus.start()
    assert pod_kubelet.pod_resources_socket is not None
    flags = ["--pod-resources-socket", pod_kubelet.pod_resources_socket,
             "--sample-interval", "100ms"]  # fmt: skip
    try:
        async with scraped_node(plugin_dir, tmp_path, port, flags) as node:
            processes.append(node.proc)
            await pod_kubelet.wait_for(lambda k: serving(k, {GPU: 16}), 10)
            gpus = {}
            for pod in CURVES:
                (admitted,) = await pod_kubelet.admit(pod, {"main": {GPU: 1}})
                gpus[pod] = (physical_id(admitted.device_ids[0]), admitted.pod_uid)
            began = time.time()
            for step in range(len(next(iter(CURVES.values()))[1])):
                node.inject(*(
                    {"process": {"pid": pid, "gpu": gpus[pod][0], "memory_mib": memory[step],
                                 "sm_util": util[step], "pod_uid": gpus[pod][1]}}
                    for pod, (pid, memory, util) in CURVES.items()
                ))  # fmt: skip
                wanted = {p.split("/")[1]: m[step] * MIB for p, (_, m, _) in CURVES.items()}
                await prometheus.until(
                    USED,
                    lambda r, w=wanted: {dict(k)["pod"]: v for k, v in r.items()} == w,  # type: ignore[misc]
                )
                await asyncio.sleep(Prometheus.SCRAPE_S * 2)  # a few samples of each value
            end = time.time()
            window_s = math.ceil(end - began) + 5
            code, out, err = await advise(
                f"http://127.0.0.1:{prometheus.port}", "--window", f"{window_s}s",
                "--step", "500ms", "--min-samples", "10", "--end", f"{end:.3f}", "--output", "json",
            )  # fmt: skip
            assert code == 0, err
            report = json.loads(out)
            version = prometheus._get("/api/v1/status/buildinfo")["data"]["version"]
            closed = str(version).startswith("2.")
            by_name = {w["workload"]: w for w in report["workloads"]}
            assert set(by_name) == {"ReplicaSet/infer-5d8f9c7b6", "train", "api"}
            by_name["infer"] = by_name.pop("ReplicaSet/infer-5d8f9c7b6")
            assert by_name["infer"]["grouped_by"] == "owner"
            workloads = {
                "infer": ["serving/infer-5d8f9c7b6-x2k4p"],
                "train": ["ml/train-0"],
                "api": ["web/api-6f7d9c8b4-k2m9z", "web/api-6f7d9c8b4-p8x7w"],
            }
            for name, pods in workloads.items():
                memory: list[float] = []
                util: list[float] = []
                for pod in pods:
                    name_only = pod.split("/")[1]
                    raw = raw_samples(prometheus, USED, name_only, end, window_s + 1)
                    memory += stepped(raw, end, window_s, "max", closed)
                    raw = raw_samples(prometheus, UTIL, name_only, end, window_s + 1)
                    util += stepped(raw, end, window_s, "avg", closed)
                w = by_name[name]
                peak = max(max(CURVES[p][1]) for p in pods) * MIB
                assert w["grouped_by"] == ("owner" if name == "infer" else "name prefix")
                assert (w["resource"], w["model"], w["share"]) == (GPU, "Tesla T4", 0.25)
                assert w["gpu_memory"] == T4_MIB * MIB
                assert w["pods"] == len(pods)
                assert w["samples"] == len(memory)
                assert w["memory_p95"] == nearest_rank(memory, 0.95) * MIB
                assert w["memory_max"] == peak
                assert w["utilization_p95"] == pytest.approx(nearest_rank(util, 0.95) / 100)
                assert w["replicas"] == math.floor(T4_MIB * MIB / (peak * 1.1))
                assert w["memory_limit"] == math.floor(T4_MIB * MIB / w["replicas"])
                assert w["limit_source"] == "recommended"
                assert w["mig_profile"] is None  # a T4 has no MIG
            assert by_name["infer"]["verdict"] == "fits"  # 3,000 MiB * 1.1 <= 3,840
            assert by_name["train"]["verdict"] == "over-packed"  # 3,600 MiB * 1.1 > 3,840
            api = by_name["api"]
            assert api["verdict"] == "wasteful"
            assert api["replicas"] == 17  # 15,360 / (800 * 1.1)
            assert api["gpus_back"] == math.floor((2 * 0.25 - 2 / 17) * 100) / 100
            assert report["gpus_back"] == api["gpus_back"]

            code, out, err = await advise(
                f"http://127.0.0.1:{prometheus.port}", "--window", f"{window_s}s",
                "--step", "500ms", "--min-samples", "10", "--end", f"{end:.3f}",
                "--namespace", "web", "--output", "json",
            )  # fmt: skip
            assert code == 0, err
            assert [w["workload"] for w in json.loads(out)["workloads"]] == ["api"]

            code, text, err = await advise(
                f"http://127.0.0.1:{prometheus.port}", "--window", f"{window_s}s",
                "--step", "500ms", "--min-samples", "10", "--end", f"{end:.3f}",
                "--output", "config",
            )  # fmt: skip
            assert code == 0, err
            assert (
                "# nvidia.com/gpu: 4 -> 3 replicas; the tightest, ml/train, peaks at 3,600 MiB"
                in text
            )
            config = tmp_path / "advised.yaml"
            config.write_text(text)
            check = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gpuslice", "config", "validate", str(config),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            _, err_b = await check.communicate()
            assert check.returncode == 0, err_b.decode()
            assert "replicas: 3" in text
    finally:
        await prometheus.stop()
