"""The suite's invariant, measured: the agent answers Allocate within a second and its
resident memory grows by less than 64 MiB through an attack."""

from __future__ import annotations

import os
import time

from agent_harness import GPU

from gpuslice.testing.kubelet import KubeletStandin

RSS_GROWTH_LIMIT = 64 * 1024 * 1024
ALLOCATE_WITHIN_S = 1.0


def rss_bytes(pid: int | None = None) -> int:
    """Resident memory of `pid` (this process by default), from /proc."""
    with open(f"/proc/{pid or os.getpid()}/status", encoding="ascii") as fh:
        line = next(ln for ln in fh if ln.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


async def answers_allocate(kubelet: KubeletStandin, resource: str = GPU) -> None:
    """One Allocate of a device the kubelet was sent, answered within the bound."""
    device = sorted(kubelet.devices(resource))[0]
    started = time.perf_counter()
    (answer,) = await kubelet.allocate(resource, [[device]])
    took = time.perf_counter() - started
    assert answer.envs or answer.cdi_devices
    assert took < ALLOCATE_WITHIN_S, f"Allocate took {took:.2f}s"
