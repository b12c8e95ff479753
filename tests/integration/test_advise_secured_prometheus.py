"""`gpuslice advise` against a real Prometheus behind an authenticating TLS front (a
certificate of a private CA; a bearer token or a client certificate required), as
OpenShift's Thanos querier, Grafana Cloud or an oauth proxy put one. Prometheus scrapes
`gpuslice run` on the simulated t4x4 node, one pod using memory. With the right token,
CA and certificate advise prints its advice; with a wrong token, an unknown CA or no
client certificate it ends in one line saying what to give, exit 1.
.ci/run installs Prometheus, so there this fails rather than skips when it is missing."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_harness import GPU, serving
from metrics_harness import Prometheus, free_port, prometheus_binary, scraped_node
from process_harness import AgentProcess, clean_env
from tls_front import Pki, make_pki, tls_front

from gpuslice.core.devices import physical_id
from gpuslice.testing.kubelet import KubeletStandin

pytestmark = pytest.mark.timeout(180)
USED = "gpuslice_container_gpu_memory_used_bytes"
POD = "ml/train-0"


@pytest.fixture
async def prometheus_port(
    plugin_dir: str, processes: list[AgentProcess], tmp_path: Path
) -> AsyncIterator[int]:
    """The port of a real Prometheus holding POD's series, scraped from the agent."""
    binary = prometheus_binary()
    socket_path = os.path.join(plugin_dir, "pod-resources", "kubelet.sock")
    port = free_port()
    work = tmp_path / "prometheus"
    work.mkdir()
    prometheus = Prometheus(binary, f"127.0.0.1:{port}", work)
    async with KubeletStandin(plugin_dir, socket_path) as kubelet:
        await prometheus.start()
        flags = ["--pod-resources-socket", socket_path, "--sample-interval", "100ms"]
        try:
            async with scraped_node(plugin_dir, tmp_path, port, flags) as node:
                processes.append(node.proc)
                await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), 10)
                (admitted,) = await kubelet.admit(POD, {"main": {GPU: 1}})
                gpu = physical_id(admitted.device_ids[0])
                node.inject({"process": {"pid": 4001, "gpu": gpu, "memory_mib": 3000,
                                         "sm_util": 50, "pod_uid": admitted.pod_uid}})  # fmt: skip
                await prometheus.until(USED, lambda found: len(found) == 1)
                yield prometheus.port
        finally:
            await prometheus.stop()


async def advise(url: str, *args: str, **env: str) -> tuple[int, str, str]:
    """`gpuslice advise` over the last minute, as JSON: exit code, stdout, stderr."""
    environ = {k: v for k, v in clean_env(**env).items() if "proxy" not in k.lower()}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuslice", "advise", "--prometheus", url, "--window", "1m",
        "--step", "1s", "--min-samples", "1", "--end", f"{time.time():.3f}",
        "--output", "json", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=environ,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def advised(result: tuple[int, str, str]) -> list[str]:
    """The workloads of a run that succeeded."""
    code, out, err = result
    assert code == 0, err
    return [w["workload"] for w in json.loads(out)["workloads"]]


def one_line(result: tuple[int, str, str]) -> str:
    """The one error line of a run that failed."""
    code, out, err = result
    assert code == 1, (out, err)
    assert "Traceback" not in err
    (line,) = err.splitlines()
    assert line.startswith("gpuslice: error: ")
    return line


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


async def test_a_bearer_token_from_a_file_and_a_private_ca(
    prometheus_port: int, pki: Pki, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")  # as a mounted Secret holds it, newline and all
    with tls_front(pki, prometheus_port, token="s3cret-token") as url:
        ca = ("--prometheus-ca-file", str(pki.ca))
        assert advised(await advise(url, *ca, "--prometheus-bearer-token-file", str(token))) == [
            "train"
        ]
        # the same through the env vars, as a pod's environment gives them
        assert advised(
            await advise(url, GPUSLICE_PROMETHEUS_BEARER_TOKEN_FILE=str(token),
                         GPUSLICE_PROMETHEUS_CA_FILE=str(pki.ca))
        ) == ["train"]  # fmt: skip

        line = one_line(await advise(url, *ca))
        assert line == (
            f"gpuslice: error: {url} refused the query: HTTP 401 Unauthorized: it asks for "
            "credentials; give --prometheus-bearer-token-file "
            "(GPUSLICE_PROMETHEUS_BEARER_TOKEN_FILE)"
        )
        token.write_text("rotated-elsewhere")  # read again on each run
        line = one_line(await advise(url, *ca, "--prometheus-bearer-token-file", str(token)))
        assert line == (
            f"gpuslice: error: {url} refused the query: HTTP 401 Unauthorized: it does not "
            f"accept the bearer token of {token}"
        )

        token.write_text("s3cret-token")
        with_token = ("--prometheus-bearer-token-file", str(token))
        line = one_line(await advise(url, *with_token))  # the system's CAs do not know it
        assert f"gpuslice: error: cannot reach Prometheus at {url}: its certificate is not " in line
        assert "it is not signed by the system's CAs; name the CA that signed it with " in line
        line = one_line(await advise(url, *with_token, "--prometheus-ca-file", str(pki.other)))
        assert f"it is not signed by the CAs of {pki.other}" in line
        skip = ("--prometheus-insecure-skip-verify", "true")
        assert advised(await advise(url, *with_token, *skip)) == ["train"]


async def test_a_client_certificate(prometheus_port: int, pki: Pki) -> None:
    with tls_front(pki, prometheus_port, client_ca=pki.ca) as url:
        ca = ("--prometheus-ca-file", str(pki.ca))
        cert, key = pki.client
        mine = ("--prometheus-cert-file", str(cert), "--prometheus-key-file", str(key))
        assert advised(await advise(url, *ca, *mine)) == ["train"]

        line = one_line(await advise(url, *ca))
        assert line.startswith(f"gpuslice: error: cannot reach Prometheus at {url}: it asks ")
        assert line.endswith(
            "give --prometheus-cert-file (GPUSLICE_PROMETHEUS_CERT_FILE) and "
            "--prometheus-key-file (GPUSLICE_PROMETHEUS_KEY_FILE)"
        )
        cert, key = pki.other_client
        theirs = ("--prometheus-cert-file", str(cert), "--prometheus-key-file", str(key))
        line = one_line(await advise(url, *ca, *theirs))
        assert f"it refused the client certificate {cert}" in line


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--prometheus-cert-file", "c.pem"],
         "--prometheus-key-file (GPUSLICE_PROMETHEUS_KEY_FILE) go together"),
        (["--prometheus-ca-file", "ca.pem"],
         "need an https:// URL; --prometheus is 'http://127.0.0.1:1'"),
        (["--prometheus-bearer-token-file", "/nonexistent"],
         "/nonexistent: No such file or directory"),
        (["--prometheus-bearer-token-file", "/dev/zero"],
         "is a character device, not a regular file"),
    ],
)  # fmt: skip
async def test_credentials_that_cannot_be_used_are_one_line(args: list[str], said: str) -> None:
    assert said in one_line(await advise("http://127.0.0.1:1", *args))


async def test_unusable_tls_and_token_files_are_one_line(tmp_path: Path) -> None:
    """Said before anything is sent: a CA file that is not PEM, a key that is not the
    certificate's, an empty token (a Secret not filled in yet)."""
    url = "https://127.0.0.1:1"
    text = tmp_path / "ca.pem"
    text.write_text("not a certificate\n")
    assert one_line(await advise(url, "--prometheus-ca-file", str(text))) == (
        f"gpuslice: error: --prometheus-ca-file (GPUSLICE_PROMETHEUS_CA_FILE) {text}: not PEM "
        "(no -----BEGIN line)"
    )
    pki = make_pki(tmp_path / "pki")
    cert, key = pki.client[0], pki.other_client[1]
    line = one_line(await advise(url, "--prometheus-cert-file", str(cert),
                                 "--prometheus-key-file", str(key)))  # fmt: skip
    assert f"{cert} with --prometheus-key-file (GPUSLICE_PROMETHEUS_KEY_FILE) {key}: not a " in line
    empty = tmp_path / "token"
    empty.write_text("\n")
    assert one_line(await advise(url, "--prometheus-bearer-token-file", str(empty))).endswith(
        f"{empty}: is empty"
    )
