"""The log pipe's reader gone (stderr closed under a running `gpuslice run`): logging
must never stop work. The agent keeps serving and registers again after a kubelet
restart, though every line it logs meanwhile meets EPIPE."""

from __future__ import annotations

import os
import signal
import subprocess

from agent_harness import GPU, registrations, serving
from process_harness import GPUSLICE, clean_env

from gpuslice.testing.kubelet import KubeletStandin

from .invariant import RSS_GROWTH_LIMIT, answers_allocate, rss_bytes


async def test_with_its_log_reader_gone_the_agent_still_registers_after_a_kubelet_restart(
    kubelet: KubeletStandin, plugin_dir: str
) -> None:
    args = ["run", "--fake-hardware", "t4", "--kubelet-socket", os.path.join(plugin_dir, "kubelet.sock")]  # fmt: skip # noqa: E501
    proc = subprocess.Popen(  # noqa: ASYNC220 - its pipe's read end is closed by hand
        [GPUSLICE, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, env=clean_env(),
    )  # fmt: skip
    try:
        await kubelet.wait_for(lambda k: serving(k, {GPU: 1}), 20)
        assert proc.stdout is not None
        rss = rss_bytes(proc.pid)
        proc.stdout.close()  # the only read end: every write now fails with EPIPE
        for restarts in (2, 3):
            await kubelet.restart()
            await kubelet.wait_for(
                lambda k, n=restarts: registrations(k)[GPU] == n and serving(k, {GPU: 1}), 10
            )
        await answers_allocate(kubelet)
        assert proc.poll() is None
        assert rss_bytes(proc.pid) - rss < RSS_GROWTH_LIMIT
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
