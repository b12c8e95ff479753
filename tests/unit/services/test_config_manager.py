"""ConfigManager: the config chosen by the node label, applied live from a mounted ConfigMap
or from the ConfigMap read through the API.

Real files laid out as the kubelet mounts a ConfigMap (entries are symlinks through `..data`,
updated by an atomic swap of that symlink), the real DirWatcher in inotify and polling mode,
and a queue-driven Node label source standing in for the Kubernetes API; for the API
source, MemoryNodeApi's ConfigMap.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpuslice.adapters.fswatch import DirWatcher
from gpuslice.config.convert import resource_settings
from gpuslice.config.loader import LoadedConfig, load_config_file
from gpuslice.core.errors import ConfigError, GpusliceError, HardwareError
from gpuslice.core.metrics import NoMetrics
from gpuslice.core.ports import DirEvents, DirWatch
from gpuslice.core.selection import DEFAULT_LABEL
from gpuslice.core.sharing import ResourceSettings
from gpuslice.services.config_manager import (
    ConfigChoice,
    ConfigInputs,
    ConfigManager,
    ConfigStatus,
    NoCluster,
)
from gpuslice.services.config_source import ConfigMapEntries, DirectoryEntries, FileEntries
from gpuslice.testing.nodeapi import MemoryNodeApi

NODE = "gpu-node-7"
WITHIN_S = 10.0  # gives up on a change never applied: a hang detector, not a budget
BROKEN = "version: v1\nflags:\n  migStrategy: bogus\n"
MODES = [pytest.param(True, id="inotify"), pytest.param(False, id="poll")]


def timeslicing(replicas: int) -> str:
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


def write_file(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


class MountedConfigMap:
    """A directory laid out and updated the way the kubelet does for a ConfigMap volume:
    files in a timestamped directory, `..data` pointing at it, entries `name -> ..data/name`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._generation = 0

    def write(self, data: Mapping[str, str]) -> None:
        """One update: new payload dir, `..data_tmp` renamed over `..data`, entry links
        added and removed, old payload dir removed."""
        self._generation += 1
        stamp = f"..2024_05_01_12_00_{self._generation:02d}.{os.getpid()}"
        os.mkdir(self._at(stamp))
        for key, text in data.items():
            write_file(self._at(stamp, key), text)
        old = os.readlink(self._at("..data")) if os.path.lexists(self._at("..data")) else None
        os.symlink(stamp, self._at("..data_tmp"))
        os.rename(self._at("..data_tmp"), self._at("..data"))
        for key in data:
            if not os.path.lexists(self._at(key)):
                os.symlink(os.path.join("..data", key), self._at(key))
        for name in os.listdir(self.path):
            if not name.startswith("..") and name not in data:
                os.unlink(self._at(name))
        if old is not None:
            shutil.rmtree(self._at(old))

    def _at(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)


class FakeNode:
    """The Node as the manager sees it: labels a test pushes, Events it records."""

    def __init__(self) -> None:
        self.watching = asyncio.Event()  # set when the manager waits for the first read
        self.watched: list[str] = []
        self.events: list[tuple[str, str, str, bool]] = []
        self.handled = asyncio.Event()  # set when the manager asks for the next update
        self._updates: asyncio.Queue[dict[str, str] | None] = asyncio.Queue()
        self._recorded: asyncio.Queue[str] = asyncio.Queue()

    def push(self, labels: Mapping[str, str]) -> None:
        """The labels of one read or watch event of the Node."""
        self._updates.put_nowait(dict(labels))

    def end_watch(self) -> None:
        self._updates.put_nowait(None)

    async def watch_node_labels(self, node: str) -> AsyncIterator[dict[str, str]]:
        self.watched.append(node)
        self.watching.set()
        while (labels := await self._updates.get()) is not None:
            yield labels
            self.handled.set()

    async def record_event(self, node: str, reason: str, message: str, *, warning: bool) -> None:
        self.events.append((node, reason, message, warning))
        self._recorded.put_nowait(message)

    async def next_event(self) -> str:
        async with asyncio.timeout(WITHIN_S):
            return await self._recorded.get()


@dataclass(frozen=True)
class Applied:
    name: str | None
    resources: ResourceSettings

    @property
    def replicas(self) -> int:
        rules = self.resources.sharing.rules
        return rules[0].replicas if rules else 1


def to_settings(loaded: LoadedConfig) -> Applied:
    return Applied(loaded.name, resource_settings(loaded.config))


class Applier:
    """The agent's apply(): records what it was given; refuses while `refuse` is set;
    while `hold` is set, returns only once it is set (an agent whose backend still opens)."""

    def __init__(self) -> None:
        self.applied: list[Applied] = []
        self.refuse: str | None = None
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()  # set at each call
        self._queue: asyncio.Queue[Applied] = asyncio.Queue()

    async def __call__(self, settings: Applied) -> None:
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.refuse is not None:
            raise HardwareError(self.refuse)
        self.applied.append(settings)
        self._queue.put_nowait(settings)

    async def next(self, within: float = WITHIN_S) -> Applied:
        async with asyncio.timeout(within):
            return await self._queue.get()


@contextlib.asynccontextmanager
async def _silent(
    path: str, names: Collection[str] | None
) -> AsyncIterator[AsyncIterator[tuple[str, str]]]:
    async def nothing() -> AsyncIterator[tuple[str, str]]:
        await asyncio.Event().wait()
        yield ("", "")  # never reached

    yield nothing()


def silent_watch(path: str, names: Collection[str] | None) -> DirEvents:
    """A DirWatch that reports nothing: only reload() can notice an edit."""
    return _silent(path, names)


@pytest.fixture
def configmap() -> Iterator[MountedConfigMap]:
    path = tempfile.mkdtemp(prefix="gcm-", dir="/tmp")
    yield MountedConfigMap(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=MODES)
def watch(request: pytest.FixtureRequest) -> DirWatch:
    use_inotify: bool = request.param

    def factory(path: str, names: Collection[str] | None) -> DirEvents:
        return DirWatcher(path, names, poll_interval=0.02, use_inotify=use_inotify)

    return factory


@pytest.fixture
def node() -> FakeNode:
    return FakeNode()


@pytest.fixture
def applier() -> Applier:
    return Applier()


def manager_for(
    node: FakeNode,
    configmap: MountedConfigMap,
    applier: Applier,
    watch: DirWatch,
    *,
    default: str | None = None,
    fallbacks: Sequence[str] = ("named", "single"),
    debounce_s: float = 0.1,
) -> ConfigManager[Applied]:
    return ConfigManager(
        ConfigInputs(node, NODE, DirectoryEntries(configmap.path, watch), to_settings),
        applier,
        ConfigChoice(default=default, fallbacks=fallbacks, debounce_s=debounce_s),
    )


@contextlib.asynccontextmanager
async def running(
    manager: ConfigManager[Applied], reload: asyncio.Event | None = None
) -> AsyncIterator[asyncio.Task[None]]:
    """The manager's run() as a task; stopped (and its failure raised) on exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop, reload))
    try:
        yield task
    finally:
        stop.set()
        async with asyncio.timeout(5):
            await task


async def started(manager: ConfigManager[Applied], task: asyncio.Task[None]) -> None:
    """Wait until the first config is applied; raise run()'s error if it failed instead."""
    ready = asyncio.ensure_future(manager.ready.wait())
    done, _ = await asyncio.wait({ready, task}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    ready.cancel()
    if task in done:
        task.result()
    assert manager.ready.is_set()


async def settled(manager: ConfigManager[Applied], seen: int) -> None:
    async with asyncio.timeout(WITHIN_S):
        await manager.wait_checked(seen)


async def test_first_apply_waits_for_the_first_read_of_the_node(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    """Nothing is chosen from the fallbacks before the Node's label is known."""
    configmap.write({"default": timeslicing(2), "big": timeslicing(8)})
    manager = manager_for(node, configmap, applier, watch)
    async with running(manager) as task:
        async with asyncio.timeout(5):
            await node.watching.wait()
        assert node.watched == [NODE]
        assert manager.status == ConfigStatus(
            None, False, f"waiting for the first read of Node {NODE}"
        )
        assert await manager.reload() is False
        configmap.write({"default": timeslicing(3), "big": timeslicing(8)})
        node.push({DEFAULT_LABEL: "big", "kubernetes.io/os": "linux"})
        await started(manager, task)
        first = await applier.next()
        assert (first.name, first.replicas) == ("big", 8)
        assert manager.status == ConfigStatus("big", True, f"label {DEFAULT_LABEL}=big")
        assert manager.settings == first
        assert manager.current is not None
        assert manager.current.name == "big"
    assert applier.applied == [first]


async def test_label_flip_switches_the_config_within_a_second(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    configmap.write({"default": timeslicing(2), "big": timeslicing(8)})
    manager = manager_for(node, configmap, applier, watch)
    node.push({})
    async with running(manager) as task:
        await started(manager, task)
        assert (await applier.next()).name == "default"
        node.push({DEFAULT_LABEL: "big"})
        assert (await applier.next()).replicas == 8
        node.push({})  # label removed: back to the named fallback
        assert (await applier.next()).name == "default"
    assert [a.name for a in applier.applied] == ["default", "big", "default"]


async def test_label_naming_the_same_entry_applies_nothing(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    """Other labels changing, or the label gaining the file extension, re-applies nothing."""
    configmap.write({"big.yaml": timeslicing(8)})
    manager = manager_for(node, configmap, applier, watch)
    node.push({DEFAULT_LABEL: "big"})
    async with running(manager) as task:
        await started(manager, task)
        seen = manager.checks
        node.push({DEFAULT_LABEL: "big", "team": "ml"})
        node.push({DEFAULT_LABEL: "big.yaml"})
        await settled(manager, seen)
        assert manager.status == ConfigStatus("big.yaml", True, f"label {DEFAULT_LABEL}=big.yaml")
    assert [a.name for a in applier.applied] == ["big.yaml"]


async def test_configmap_edit_is_applied_within_a_second(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    configmap.write({"ts": timeslicing(2)})
    manager = manager_for(node, configmap, applier, watch)
    node.push({DEFAULT_LABEL: "ts"})
    async with running(manager) as task:
        await started(manager, task)
        await applier.next()
        configmap.write({"ts": timeslicing(4)})
        assert (await applier.next()).replicas == 4
        configmap.write({"ts": timeslicing(4), "new": timeslicing(6)})
        node.push({DEFAULT_LABEL: "new"})
        assert (await applier.next()).replicas == 6
    assert [a.replicas for a in applier.applied] == [2, 4, 6]


async def test_unchanged_content_is_not_applied_again(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    """A swap with the same text, or an edit of another entry, reads but applies nothing."""
    configmap.write({"ts": timeslicing(2), "other": timeslicing(3)})
    manager = manager_for(node, configmap, applier, watch)
    node.push({DEFAULT_LABEL: "ts"})
    async with running(manager) as task:
        await started(manager, task)
        for other in (3, 5):
            seen = manager.checks
            configmap.write({"ts": timeslicing(2), "other": timeslicing(other)})
            await settled(manager, seen)
        seen = manager.checks
        assert await manager.reload() is True
        assert manager.checks == seen + 1
    assert len(applier.applied) == 1
    assert manager.status.ok


async def test_a_burst_of_updates_is_applied_once(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    """Updates spread over less than the debounce window (here 0.5 s) give one apply."""
    configmap.write({"ts": timeslicing(2)})
    manager = manager_for(node, configmap, applier, watch, debounce_s=0.5)
    node.push({DEFAULT_LABEL: "ts"})
    async with running(manager) as task:
        await started(manager, task)
        await applier.next()
        for replicas in (3, 4, 5, 6):
            configmap.write({"ts": timeslicing(replicas)})
            await asyncio.sleep(0.03)  # spacing the updates, not waiting for an outcome
        assert (await applier.next()).replicas == 6
    assert [a.replicas for a in applier.applied] == [2, 6]


async def test_broken_config_keeps_the_last_good_one_until_fixed(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    configmap.write({"ts": timeslicing(2)})
    manager = manager_for(node, configmap, applier, watch)
    node.push({DEFAULT_LABEL: "ts"})
    async with running(manager) as task:
        await started(manager, task)
        await applier.next()
        with capture_logs() as logs:
            configmap.write({"ts": BROKEN})
            message = await node.next_event()
        assert message.startswith("config rejected, keeping ts: ")
        assert 'flags.migStrategy: got "bogus"' in message
        assert "\n" not in message
        assert node.events == [(NODE, "ConfigRejected", message, True)]
        assert manager.status == ConfigStatus("ts", False, message)
        rejected = [e for e in logs if e["event"] == "config_rejected_keeping_last_good"]
        assert rejected
        assert rejected[0]["serving"] == "ts"
        assert rejected[0]["log_level"] == "warning"
        assert manager.settings == applier.applied[0]

        assert await manager.reload() is False  # the same problem is not recorded twice
        assert len(node.events) == 1

        configmap.write({"ts": timeslicing(5)})
        assert (await applier.next()).replicas == 5
        assert manager.status == ConfigStatus("ts", True, f"label {DEFAULT_LABEL}=ts")
    assert [a.replicas for a in applier.applied] == [2, 5]


async def test_fixing_back_to_the_same_content_recovers_without_applying(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    configmap.write({"ts": timeslicing(2)})
    manager = manager_for(node, configmap, applier, watch)
    node.push({DEFAULT_LABEL: "ts"})
    async with running(manager) as task:
        await started(manager, task)
        configmap.write({"ts": BROKEN})
        await node.next_event()
        seen = manager.checks
        configmap.write({"ts": timeslicing(2)})
        await settled(manager, seen)
        assert manager.status.ok
    assert len(applier.applied) == 1


async def test_unknown_label_keeps_the_config_and_says_so(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    configmap.write({"a100": timeslicing(2), "t4": timeslicing(4)})
    manager = manager_for(node, configmap, applier, watch)
    node.push({DEFAULT_LABEL: "a100"})
    async with running(manager) as task:
        await started(manager, task)
        await applier.next()
        node.push({DEFAULT_LABEL: "h100"})
        message = await node.next_event()
        assert message == (
            'config rejected, keeping a100: specified config "h100" does not exist; '
            f"available: a100, t4 (configs in {configmap.path})"
        )
        assert manager.status == ConfigStatus("a100", False, message)
        configmap.write({"a100": timeslicing(2), "t4": timeslicing(4), "h100": timeslicing(7)})
        assert (await applier.next()).name == "h100"  # the ConfigMap gained it: applied
        assert manager.status.ok


async def test_config_the_agent_refuses_keeps_the_last_good_one(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    """apply() raising (the hardware cannot serve it) counts as a rejection."""
    configmap.write({"ts": timeslicing(2), "big": timeslicing(8)})
    manager = manager_for(node, configmap, applier, watch)
    node.push({DEFAULT_LABEL: "ts"})
    async with running(manager) as task:
        await started(manager, task)
        applier.refuse = "no GPU matches sharing.timeSlicing.resources[0]"
        node.push({DEFAULT_LABEL: "big"})
        message = await node.next_event()
        assert message == (
            "config rejected, keeping ts: no GPU matches sharing.timeSlicing.resources[0]"
        )
        assert manager.status.config == "ts"
        applier.refuse = None
        assert await manager.reload() is True
        assert manager.status == ConfigStatus("big", True, f"label {DEFAULT_LABEL}=big")
    assert [a.name for a in applier.applied] == ["ts", "big"]


async def test_reload_rereads_what_no_watch_reported(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier
) -> None:
    configmap.write({"ts": timeslicing(2)})
    manager = manager_for(node, configmap, applier, silent_watch)
    node.push({DEFAULT_LABEL: "ts"})
    sighup = asyncio.Event()
    async with running(manager, sighup) as task:
        await started(manager, task)
        await applier.next()
        configmap.write({"ts": timeslicing(3)})
        assert await manager.reload() is True
        assert (await applier.next()).replicas == 3
        configmap.write({"ts": timeslicing(4)})
        sighup.set()  # what SIGHUP does
        assert (await applier.next()).replicas == 4
    assert [a.replicas for a in applier.applied] == [2, 3, 4]


async def test_a_reload_asked_for_while_the_first_config_is_applied_is_read_after_it(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier
) -> None:
    """A SIGHUP that comes while the agent still serves the first config (a process
    signalled right after its start) is neither lost nor refused: read once it is."""
    configmap.write({"ts": timeslicing(2)})
    manager = manager_for(node, configmap, applier, silent_watch)
    node.push({DEFAULT_LABEL: "ts"})
    applier.hold = asyncio.Event()
    sighup = asyncio.Event()
    async with running(manager, sighup) as task:
        await asyncio.wait_for(applier.entered.wait(), WITHIN_S)  # the first apply runs
        configmap.write({"ts": timeslicing(3)})
        sighup.set()
        applier.hold.set()
        await started(manager, task)
        assert (await applier.next()).replicas == 2
        assert (await applier.next()).replicas == 3
    assert [a.replicas for a in applier.applied] == [2, 3]


async def test_bad_config_at_start_is_raised_and_recorded(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    configmap.write({"a": timeslicing(2), "b": timeslicing(3)})
    manager = manager_for(node, configmap, applier, watch)
    node.push({})
    listing = re.escape(f"named, single all failed; available: a, b (configs in {configmap.path})")
    with pytest.raises(ConfigError, match=f"{listing}$"):
        async with running(manager):
            await node.next_event()
    ((name, reason, message, warning),) = node.events
    assert (name, reason, warning) == (NODE, "ConfigRejected", True)
    assert message.startswith("no config in force: no config selected")
    assert manager.status == ConfigStatus(None, False, message)
    assert applier.applied == []


async def test_refused_first_config_is_raised(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    configmap.write({"ts": timeslicing(2)})
    applier.refuse = "cannot serve"
    manager = manager_for(node, configmap, applier, watch)
    node.push({DEFAULT_LABEL: "ts"})
    with pytest.raises(HardwareError, match=r"^cannot serve$"):
        async with running(manager) as task:
            await started(manager, task)


async def test_watch_ending_before_the_first_read_is_an_error(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    configmap.write({"ts": timeslicing(2)})
    manager = manager_for(node, configmap, applier, watch)
    node.end_watch()
    with pytest.raises(GpusliceError, match=f"the watch of Node {NODE} ended before a first read"):
        async with running(manager) as task:
            await started(manager, task)


async def test_directory_edits_are_followed_after_the_label_watch_ends(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    configmap.write({"ts": timeslicing(2)})
    manager = manager_for(node, configmap, applier, watch)
    node.push({DEFAULT_LABEL: "ts"})
    node.end_watch()
    async with running(manager) as task:
        await started(manager, task)
        await applier.next()
        configmap.write({"ts": timeslicing(3)})
        assert (await applier.next()).replicas == 3


async def test_default_config_and_empty_fallback(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    configmap.write({"a.yaml": timeslicing(2), "b.yaml": timeslicing(3)})
    manager = manager_for(node, configmap, applier, watch, default="b")
    node.push({})
    async with running(manager) as task:
        await started(manager, task)
        assert (await applier.next()).name == "b.yaml"
        assert manager.status.detail == f"label {DEFAULT_LABEL} unset; default config"

    other = FakeNode()
    empty = manager_for(other, configmap, Applier(), watch, fallbacks=["named", "empty"])
    other.push({})
    async with running(empty) as task:
        await started(empty, task)
        assert empty.status.config == "(empty)"
        assert empty.settings == Applied(None, ResourceSettings())


def test_unknown_fallback_is_refused_when_built(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier
) -> None:
    with pytest.raises(ConfigError, match='"first" is unknown; allowed: named, single, empty'):
        manager_for(node, configmap, applier, silent_watch, fallbacks=["first"])


async def test_plain_directory_file_replaced_is_applied(
    node: FakeNode, applier: Applier, watch: DirWatch
) -> None:
    """A directory that is not a ConfigMap mount: a file replaced by rename is noticed."""
    path = tempfile.mkdtemp(prefix="gcd-", dir="/tmp")
    try:
        write_file(os.path.join(path, "ts"), timeslicing(2))
        manager = manager_for(node, MountedConfigMap(path), applier, watch)
        node.push({})
        async with running(manager) as task:
            await started(manager, task)
            write_file(os.path.join(path, ".ts.new"), timeslicing(9))
            os.replace(os.path.join(path, ".ts.new"), os.path.join(path, "ts"))
            assert (await applier.next()).replicas == 2
            assert (await applier.next()).replicas == 9
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_a_config_is_reported_only_once_apply_returned(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    """While the agent is still starting, the first config is "applying", not in force;
    a label flip meanwhile is read right after it and applied too."""
    configmap.write({"ts": timeslicing(2), "big": timeslicing(8)})
    manager = manager_for(node, configmap, applier, watch)
    applier.hold = asyncio.Event()
    node.push({DEFAULT_LABEL: "ts"})
    async with running(manager) as task:
        async with asyncio.timeout(WITHIN_S):
            await applier.entered.wait()
        assert manager.status == ConfigStatus(
            None, False, f"applying ts (label {DEFAULT_LABEL}=ts): waiting until it is served"
        )
        assert not manager.ready.is_set()
        node.handled.clear()
        node.push({DEFAULT_LABEL: "big"})
        async with asyncio.timeout(WITHIN_S):
            await node.handled.wait()
        assert manager.label == "big"
        assert applier.applied == []
        applier.hold.set()
        await started(manager, task)
        assert (await applier.next()).name == "ts"
        assert (await applier.next()).name == "big"
        assert manager.status == ConfigStatus("big", True, f"label {DEFAULT_LABEL}=big")


@pytest.mark.parametrize("empty", ["", "# cut here\n", "   \n"])
async def test_an_emptied_entry_keeps_the_last_good_one_until_version_v1(
    node: FakeNode,
    configmap: MountedConfigMap,
    applier: Applier,
    watch: DirWatch,
    empty: str,
) -> None:
    """An entry that had content and becomes empty is a truncated write, not a wish to
    drop sharing: rejected and reported; `version: v1` alone is the deliberate empty one."""
    configmap.write({"ts": timeslicing(2)})
    manager = manager_for(node, configmap, applier, watch)
    node.push({DEFAULT_LABEL: "ts"})
    async with running(manager) as task:
        await started(manager, task)
        await applier.next()
        configmap.write({"ts": empty})
        message = await node.next_event()
        assert message.startswith("config rejected, keeping ts: ")
        assert "the config is empty" in message
        assert "\n" not in message
        assert manager.status == ConfigStatus("ts", False, message)
        configmap.write({"ts": "version: v1\n"})
        assert (await applier.next()).replicas == 1
        assert manager.status.ok
    assert [a.replicas for a in applier.applied] == [2, 1]


async def test_an_empty_entry_is_accepted_at_start_and_may_stay_empty(
    node: FakeNode, configmap: MountedConfigMap, applier: Applier, watch: DirWatch
) -> None:
    configmap.write({"ts": ""})
    manager = manager_for(node, configmap, applier, watch)
    node.push({DEFAULT_LABEL: "ts"})
    async with running(manager) as task:
        await started(manager, task)
        assert (await applier.next()).replicas == 1
        seen = manager.checks
        configmap.write({"ts": "# still nothing\n"})
        await settled(manager, seen)
        assert manager.status.ok
        assert node.events == []


# The same manager over the ConfigMap read through the API (MemoryNodeApi plays it).

NS = "gpu-operator"
CM = "gpuslice-configs"
DEFAULT_ANNOTATION = "gpuslice.io/default-config"


def api_manager(
    node: FakeNode, api: MemoryNodeApi, applier: Applier, *, default: str | None = None
) -> ConfigManager[Applied]:
    return ConfigManager(
        ConfigInputs(node, NODE, ConfigMapEntries(api, NS, CM), to_settings),
        applier,
        ConfigChoice(default=default),
    )


async def test_configmap_from_the_api_edits_apply_and_the_label_picks_among_its_entries(
    node: FakeNode, applier: Applier
) -> None:
    api = MemoryNodeApi()
    api.put_config_map(NS, CM, {"ts": timeslicing(2), "big": timeslicing(8)})
    manager = api_manager(node, api, applier)
    node.push({DEFAULT_LABEL: "ts"})
    async with running(manager) as task:
        await started(manager, task)
        first = await applier.next()
        assert (first.name, first.replicas) == ("ts", 2)
        assert manager.current is not None
        assert manager.current.source == f"ConfigMap {NS}/{CM}[ts]"
        api.put_config_map(NS, CM, {"ts": timeslicing(3), "big": timeslicing(8)})
        assert (await applier.next()).replicas == 3
        node.push({DEFAULT_LABEL: "big"})
        assert (await applier.next()).replicas == 8
        seen = manager.checks
        api.put_config_map(NS, CM, {"ts": timeslicing(5), "big": timeslicing(8)})
        await settled(manager, seen)  # another entry edited: read, nothing applied
    assert [a.replicas for a in applier.applied] == [2, 3, 8]


async def test_the_default_annotation_applies_live_and_the_flag_wins_over_it(
    node: FakeNode, applier: Applier
) -> None:
    """What `helm upgrade --set config.default=X` changes: the ConfigMap's annotation."""
    api = MemoryNodeApi()
    data = {"default": timeslicing(2), "ts-4": timeslicing(4), "ts-8": timeslicing(8)}
    api.put_config_map(NS, CM, data)
    manager = api_manager(node, api, applier)
    node.push({})
    async with running(manager) as task:
        await started(manager, task)
        assert (await applier.next()).name == "default"  # fallback named
        api.put_config_map(NS, CM, data, {DEFAULT_ANNOTATION: "ts-8"})
        assert (await applier.next()).name == "ts-8"
        assert manager.status == ConfigStatus(
            "ts-8", True, f"label {DEFAULT_LABEL} unset; default config"
        )
        api.put_config_map(NS, CM, data, {DEFAULT_ANNOTATION: "h100"})
        message = await node.next_event()
        assert message == (
            'config rejected, keeping ts-8: specified config "h100" does not exist; '
            f"available: default, ts-4, ts-8 (configs in ConfigMap {NS}/{CM})"
        )

    other, pinned = FakeNode(), Applier()
    flagged = api_manager(other, api, pinned, default="ts-4")
    other.push({})
    async with running(flagged) as task:
        await started(flagged, task)
        assert (await pinned.next()).name == "ts-4"  # --default-config beats the annotation


async def test_a_deleted_configmap_keeps_the_last_good_config_until_it_returns(
    node: FakeNode, applier: Applier
) -> None:
    api = MemoryNodeApi()
    api.put_config_map(NS, CM, {"ts": timeslicing(2)})
    manager = api_manager(node, api, applier)
    node.push({DEFAULT_LABEL: "ts"})
    async with running(manager) as task:
        await started(manager, task)
        await applier.next()
        api.delete_config_map(NS, CM)
        message = await node.next_event()
        assert message == (
            f"config rejected, keeping ts: ConfigMap {NS}/{CM} not found (deleted, or not "
            "created yet)"
        )
        assert manager.status == ConfigStatus("ts", False, message)
        api.put_config_map(NS, CM, {"ts": timeslicing(6)})
        assert (await applier.next()).replicas == 6
        assert manager.status.ok


async def test_an_emptied_configmap_entry_keeps_the_last_good_one(
    node: FakeNode, applier: Applier
) -> None:
    """The directory's truncated-write rule, shared: an entry that had content and is
    now blank is rejected."""
    api = MemoryNodeApi()
    api.put_config_map(NS, CM, {"ts": timeslicing(2)})
    manager = api_manager(node, api, applier)
    node.push({DEFAULT_LABEL: "ts"})
    async with running(manager) as task:
        await started(manager, task)
        await applier.next()
        api.put_config_map(NS, CM, {"ts": ""})
        message = await node.next_event()
        assert message.startswith(f"config rejected, keeping ts: ConfigMap {NS}/{CM}[ts]: ")
        assert "the config is empty" in message
    assert len(applier.applied) == 1


async def test_an_unreachable_api_keeps_the_config_and_says_so_until_it_is_back(
    node: FakeNode, applier: Applier
) -> None:
    api = MemoryNodeApi()
    api.put_config_map(NS, CM, {"ts": timeslicing(2)})
    manager = api_manager(node, api, applier)
    node.push({DEFAULT_LABEL: "ts"})
    async with running(manager) as task:
        await started(manager, task)
        await applier.next()
        seen = manager.checks
        api.set_reachable(False)
        await settled(manager, seen)  # the trouble is read like a change
        status = manager.status.as_dict()
        assert status["config"] == "ts"
        assert status["ok"] is False
        assert status["source"] == (
            f"cannot follow ConfigMap {NS}/{CM}, retrying; keeping what it last said: "
            "watch ConfigMap: Kubernetes API unreachable (simulated)"
        )
        assert len(applier.applied) == 1
        api.put_config_map(NS, CM, {"ts": timeslicing(4)})  # made during the outage
        api.set_reachable(True)
        assert (await applier.next()).replicas == 4
        assert manager.status == ConfigStatus("ts", True, f"label {DEFAULT_LABEL}=ts")
        assert "source" not in manager.status.as_dict()
    assert node.events == []


async def test_a_missing_configmap_at_start_is_raised(node: FakeNode, applier: Applier) -> None:
    manager = api_manager(node, MemoryNodeApi(), applier)
    node.push({})
    with pytest.raises(ConfigError, match=f"^ConfigMap {NS}/{CM} not found"):
        async with running(manager) as task:
            await started(manager, task)
    assert applier.applied == []


async def test_a_bad_shared_entry_is_one_report_for_the_cluster_not_an_event_per_node() -> None:
    """Every node choosing the entry finds the same problem: it goes to the ConfigMap,
    one report per problem (MemoryNodeApi counts who reported it), and no node writes an
    Event of its own. A node's own problem (its apply refused) stays an Event on its Node."""
    api = MemoryNodeApi()
    api.put_config_map(NS, CM, {"ts": timeslicing(2)})
    nodes = [FakeNode() for _ in range(5)]
    appliers = [Applier() for _ in nodes]
    managers = [api_manager(n, api, a) for n, a in zip(nodes, appliers, strict=True)]
    for node in nodes:
        node.push({DEFAULT_LABEL: "ts"})
    async with contextlib.AsyncExitStack() as stack:
        for manager in managers:
            await started(manager, await stack.enter_async_context(running(manager)))
        seen = [m.checks for m in managers]
        api.put_config_map(NS, CM, {"ts": BROKEN})
        for manager, checks in zip(managers, seen, strict=True):
            await settled(manager, checks)
            assert manager.rejected is not None
        ((where, name, reason, message), reports), *_ = api.config_map_events.items()
        assert len(api.config_map_events) == 1
        assert (where, name, reason, reports) == (NS, CM, "ConfigRejected", 5)
        assert message.startswith(f"ConfigMap {NS}/{CM}[ts]: ")  # the same on every node
        assert "keeping" not in message
        assert all(node.events == [] for node in nodes)
        # the node's own problem: its apply refuses the (good) entry
        appliers[0].refuse = "this node cannot"
        seen0 = managers[0].checks
        api.put_config_map(NS, CM, {"ts": timeslicing(3)})
        await settled(managers[0], seen0)
        assert "this node cannot" in await nodes[0].next_event()
        assert len(api.config_map_events) == 1


class Rejections(NoMetrics):
    def __init__(self) -> None:
        self.names: list[str] = []

    def config_rejected(self, name: str) -> None:
        self.names.append(name)


async def test_the_config_file_is_applied_on_each_reload_and_a_refusal_counts_against_it(
    tmp_path: Path, applier: Applier
) -> None:
    """The file selector: nothing chosen, every reload applies again (the hardware is read
    again too), and a refused read is counted against the file that stays in force."""
    path = tmp_path / "config.yaml"
    path.write_text(timeslicing(2))
    entries = FileEntries(str(path), lambda: load_config_file(str(path)))
    metrics = Rejections()
    manager = ConfigManager(
        ConfigInputs(NoCluster(), NODE, entries, to_settings),
        applier,
        ConfigChoice(label=None),
        metrics=metrics,
    )
    async with running(manager) as task:
        await started(manager, task)
        assert await manager.reload()
        assert [a.replicas for a in applier.applied] == [2, 2]
        path.write_text(BROKEN)
        assert not await manager.reload()
    assert metrics.names == [str(path)]
    assert manager.rejected is not None
    assert manager.rejected.startswith("config rejected, keeping the last good one: ")
    assert manager.one_config
