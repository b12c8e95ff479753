"""Settings are resolved once per load: the command line is read in one pass over the
flag table, and each config load (start, every reload) applies it in one more pass;
the config file is read once per load. Counted on a real node on simulated hardware."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice import cli
from gpuslice.config import flags, loader
from gpuslice.config.loader import LoadedConfig
from gpuslice.wiring.node import build_node

TS = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: {}\n"
)


class CountingTable(tuple[flags.Flag, ...]):
    """The flag table, counting each walk over it."""

    walks = 0

    def __iter__(self) -> Iterator[flags.Flag]:
        type(self).walks += 1
        return super().__iter__()


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> type[CountingTable]:
    CountingTable.walks = 0
    monkeypatch.setattr(flags, "FLAGS", CountingTable(flags.FLAGS))
    return CountingTable


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = loader.load_config_file

    def counted(path: str, **kw: object) -> LoadedConfig:
        seen.append(path)
        return real(path, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(loader, "load_config_file", counted)
    monkeypatch.setattr("gpuslice.config.settings.load_config_file", counted)
    return seen


async def test_one_pass_for_the_command_line_and_one_per_config_load(
    tmp_path: Path, walks: type[CountingTable], reads: list[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(TS.format(2), encoding="utf-8")
    args = [
        f"--config-file={config}",
        f"--kubelet-socket={tmp_path}/kubelet.sock",
        f"--cdi-spec-dir={tmp_path}/cdi",
        f"--pod-resources-socket={tmp_path}/pr.sock",
        "--labels=true",
        "--use-node-feature-api=false",
        f"--output-file={tmp_path}/features",
        "--fake-hardware=t4x4",
    ]
    opts = cli.command_options("run", args, {})
    assert walks.walks == 1  # the command line: every flag parsed and checked
    node = build_node(opts, None)  # the labeller's settings come from the same load
    assert (walks.walks, reads) == (2, [str(config)])

    stop = asyncio.Event()
    task = asyncio.create_task(node.run(stop))
    try:
        async with asyncio.timeout(10):
            await node.agent.ready.wait()
            assert (walks.walks, len(reads)) == (2, 1)  # the first load, served as read
            config.write_text(TS.format(4), encoding="utf-8")
            assert await node.reload()
            assert (walks.walks, len(reads)) == (3, 2)
            assert await node.reload()
            assert (walks.walks, len(reads)) == (4, 3)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
