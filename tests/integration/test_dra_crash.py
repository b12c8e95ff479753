"""The DRA agent killed (SIGKILL, a real process) at each step of prepare and unprepare:
after a restart no CDI spec outlives its claim and no prepared claim is lost; the
kubelet's retry completes the call (a checkpoint that is not one:
test_dra_checkpoint_rebuild.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_harness import remove_dir, short_dir
from dra_harness import DRIVER, NODE, dra_rig

from gpuslice.testing.apiserver import FakeApiServer, write_kubeconfig
from gpuslice.testing.kubelet.dra import DraKubeletStandin

GPU0 = "gpu-0000-07-00-0"
AGENT = os.path.join(os.path.dirname(__file__), "dra_crash_agent.py")
PREPARE_STEPS = ["1", "2", "3", "3+"]  # PrepareStarted, the spec, PrepareCompleted, answer
UNPREPARE_STEPS = ["4", "5", "5+"]  # the spec removed, the entry removed, the answer


@pytest.fixture
def root() -> AsyncIterator[str]:
    path = short_dir("gsc-")
    yield path
    remove_dir(path)


class Agent:
    def __init__(self, root: str, kubeconfig: str) -> None:
        self.root, self.kubeconfig = root, kubeconfig
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, step: str = "") -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.root, "paused"))
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, AGENT, self.root, self.kubeconfig, step,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip

    async def paused(self) -> None:
        """Until the process says it stopped at its step (a file it writes)."""
        marker = os.path.join(self.root, "paused")
        for _ in range(1000):
            if await asyncio.to_thread(os.path.exists, marker):
                return
            await asyncio.sleep(0.02)
        raise TimeoutError("the agent never reached its step")

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def specs(root: str) -> list[str]:
    cdi = os.path.join(root, "cdi")
    return sorted(os.listdir(cdi)) if os.path.isdir(cdi) else []


def entries(root: str) -> dict[str, object]:
    path = Path(root, "plugins", DRIVER, "checkpoint.json")
    return dict(json.loads(path.read_text())["claims"]) if path.exists() else {}


async def settled(kubelet: DraKubeletStandin) -> None:
    """Until the agent has taken its checkpoint over (calls are answered after that)."""
    assert await kubelet.unprepare(DRIVER, [("ml", "never", "x")]) == {"never": ""}


async def crash(root: str, step: str, *, unprepare: bool) -> None:
    async with FakeApiServer() as api:
        agent = Agent(root, str(write_kubeconfig(Path(root), api.url)))
        kubelet = DraKubeletStandin(os.path.join(root, "registry"), os.path.join(root, "cdi"))
        results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": GPU0}]
        obj = api.dra.put_claim("ml", "c", results)
        claim = ("ml", obj["metadata"]["uid"], "c")
        spec = f"k8s.gpu.nvidia.com-claim_{claim[1]}.json"
        try:
            await agent.start(step)
            await kubelet.discover(DRIVER, timeout_s=20)
            if unprepare:
                assert (await kubelet.prepare(DRIVER, [claim]))[claim[1]].error == ""
                call = asyncio.ensure_future(kubelet.unprepare(DRIVER, [claim]))
            else:
                call = asyncio.ensure_future(kubelet.prepare(DRIVER, [claim]))
            await agent.paused()
            await agent.kill()
            with contextlib.suppress(Exception):
                await call  # the kubelet sees the call fail
            await kubelet.restart()
            await agent.start()
            await kubelet.discover(DRIVER, timeout_s=20)
            await settled(kubelet)
            held = claim[1] in entries(root)
            # nothing leaked: a spec exists only for a claim the checkpoint holds
            assert specs(root) == ([spec] if held else [])
            if held:  # nothing lost: the claim is prepared, its answer the same
                (again,) = (await kubelet.prepare(DRIVER, [claim]))[claim[1]].devices
                assert kubelet.resolve_cdi(again.cdi_ids)["deviceNodes"]
            if not unprepare:  # the kubelet retries the prepare: done whole
                result = (await kubelet.prepare(DRIVER, [claim]))[claim[1]]
                assert result.error == ""
                assert specs(root) == [spec]
            assert await kubelet.unprepare(DRIVER, [claim]) == {claim[1]: ""}
            assert specs(root) == []
            assert entries(root) == {}
        finally:
            await kubelet.close()
            await agent.kill()


@pytest.mark.parametrize("step", PREPARE_STEPS)
async def test_killed_while_preparing(root: str, step: str) -> None:
    await crash(root, step, unprepare=False)


@pytest.mark.parametrize("step", UNPREPARE_STEPS)
async def test_killed_while_unpreparing(root: str, step: str) -> None:
    await crash(root, step, unprepare=True)


async def test_an_orphan_spec_is_swept_at_start(root: str, tmp_path: Path) -> None:
    write(Path(root, "cdi", "k8s.gpu.nvidia.com-claim_gone-uid.json"), "{}")
    write(Path(root, "cdi", "nvidia.yaml"), "kind: nvidia.com/gpu\n")  # not ours: kept
    async with dra_rig(root, tmp_path) as rig:
        await rig.frontend.driver.settled.wait()
        assert specs(root) == ["nvidia.yaml"]
