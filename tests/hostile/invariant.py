"""The suite's invariant, measured: the agent answers Allocate within a second and its
resident memory grows by less than 64 MiB through an attack; and, for attacks on a
`gpuslice run` process, that it stays up serving the last good state.

`answers_allocate` and `rss_bytes` serve any test; `Invariant` bundles all four checks
for an `AgentUnderAttack` (a process started against the kubelet stand-in of a plugin
directory): up, the stand-in streaming what was served before, Allocate within
ALLOCATE_WITHIN_S, RSS grown by less than RSS_GROWTH_LIMIT since the baseline.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from agent_harness import GPU
from process_harness import AgentProcess

from gpuslice.testing.kubelet import KubeletStandin

RSS_GROWTH_LIMIT = 64 * 1024 * 1024
ALLOCATE_WITHIN_S = 1.0
READY_WITHIN_S = 20.0


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


class AgentUnderAttack(AgentProcess):
    """`gpuslice run` on simulated hardware against the kubelet stand-in of `plugin_dir`
    (its sockets, CDI directory, PodResources socket and events file all there)."""

    @classmethod
    async def attack(
        cls, plugin_dir: str, *args: str, hardware: str = "t4", env: dict[str, str] | None = None
    ) -> AgentUnderAttack:
        base = [
            "--fake-hardware", hardware,
            "--kubelet-socket", os.path.join(plugin_dir, "kubelet.sock"),
            "--cdi-spec-dir", os.path.join(plugin_dir, "cdi"),
            "--pod-resources-socket", os.path.join(plugin_dir, "pr", "kubelet.sock"),
            "--fake-events", os.path.join(plugin_dir, "events.jsonl"),
        ]  # fmt: skip
        agent = await cls.start([*base, *args], env=env)
        assert isinstance(agent, cls)
        return agent

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def count(self, text: str) -> int:
        return sum(1 for line in self.lines if text in line)

    async def stop(self) -> int:
        """SIGTERM; the exit status (it must exit within the harness's bound)."""
        if self.alive:
            self.signal(signal.SIGTERM)
        rc, _ = await self.wait()
        return rc


@dataclass
class Invariant:
    """What a hostile input must not change, taken once the agent serves."""

    agent: AgentUnderAttack
    kubelet: KubeletStandin
    served: dict[str, int]
    rss: int

    @classmethod
    async def baseline(
        cls, agent: AgentUnderAttack, kubelet: KubeletStandin, served: dict[str, int]
    ) -> Invariant:
        """Wait until the stand-in streams `served`, then note the agent's memory."""
        await kubelet.wait_for(lambda k: k.serves(served) or not agent.alive, READY_WITHIN_S)
        assert agent.alive, "the agent stopped before serving:\n" + agent.log
        return cls(agent, kubelet, dict(served), rss_bytes(agent.proc.pid))

    async def check(self) -> None:
        """Up, serving what it served, Allocate within the bound, RSS within the limit."""
        assert self.agent.alive, "the agent stopped:\n" + self.agent.log
        assert self.kubelet.serves(self.served), self.kubelet.node_status()
        await answers_allocate(self.kubelet, next(iter(self.served)))
        grown = rss_bytes(self.agent.proc.pid) - self.rss
        assert grown < RSS_GROWTH_LIMIT, f"RSS grew by {grown >> 20} MiB"
