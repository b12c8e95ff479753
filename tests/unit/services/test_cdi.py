"""CdiSpecs: what the agent's hook hands the spec store, and how a failing store is borne."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Collection, Mapping

from gpuslice.adapters.fake import load_spec
from gpuslice.core.cdi_toolkit import ToolkitDevices
from gpuslice.core.errors import BackendError
from gpuslice.core.resources import Resource, build_resources
from gpuslice.core.response import CDI_CRI, ENVVAR, AllocateOptions
from gpuslice.core.sharing import ResourceSettings
from gpuslice.services.cdi import CdiSpecs

GPU_SPEC = "k8s.device-plugin.nvidia.com-gpu.json"
CDI = AllocateOptions(list_strategies=(CDI_CRI,))


class MemoryStore:
    """A CdiStore holding specs in memory; `failures` next syncs raise BackendError."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.failures = 0

    async def sync(self, specs: Mapping[str, str]) -> tuple[str, ...]:
        if self.failures:
            self.failures -= 1
            raise BackendError("CDI spec /x: cannot write: Read-only file system", transient=True)
        changed = [n for n, t in specs.items() if self.files.get(n) != t]
        gone = [n for n in self.files if n not in specs]
        self.files = dict(specs)
        return (*changed, *gone)


def t4x4_resources() -> tuple[Resource, ...]:
    return build_resources(load_spec("t4x4"), ResourceSettings())


async def test_apply_writes_the_specs_the_options_ask_for_and_removes_them_for_envvar() -> None:
    store = MemoryStore()
    specs = CdiSpecs(store, control_devices=("/dev/nvidia-uvm",))
    await specs.apply(t4x4_resources(), CDI)
    spec = json.loads(store.files[GPU_SPEC])
    assert len(spec["devices"]) == 4
    assert {"path": "/dev/nvidia-uvm"} in spec["containerEdits"]["deviceNodes"]
    await specs.apply(t4x4_resources(), AllocateOptions(list_strategies=(ENVVAR,)))
    assert store.files == {}


async def test_a_failed_write_is_kept_as_the_error_and_the_next_apply_retries() -> None:
    """Serving must not depend on the spec directory: apply never raises."""
    store = MemoryStore()
    store.failures = 1
    specs = CdiSpecs(store)
    await specs.apply(t4x4_resources(), CDI)
    assert specs.error is not None
    assert "cannot write" in specs.error
    assert store.files == {}
    await specs.apply(t4x4_resources(), CDI)
    assert specs.error is None
    assert GPU_SPEC in store.files


class Events:
    """A DirWatch over queues the test feeds: (name, kind) per directory."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[tuple[str, str]]] = {}
        self.opened = asyncio.Event()

    @contextlib.asynccontextmanager
    async def __call__(
        self, path: str, names: Collection[str] | None
    ) -> AsyncIterator[AsyncIterator[tuple[str, str]]]:
        queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.queues[path] = queue
        if len(self.queues) == 2:
            self.opened.set()

        async def events() -> AsyncIterator[tuple[str, str]]:
            while True:
                yield await queue.get()

        yield events()


async def test_a_burst_of_spec_changes_is_one_lookup_and_listeners_hear_of_changes_only() -> None:
    """Watched changes of spec files are looked up again (a burst of writes once, names
    the lookup does not read not at all); listeners are told only a different result."""
    found = [ToolkitDevices(frozenset({"all"}), "/etc/cdi/nvidia.yaml", None)]
    lookups: list[int] = []

    def find() -> ToolkitDevices:
        lookups.append(1)
        return found[0]

    watch = Events()
    specs = CdiSpecs(
        MemoryStore(),
        find_toolkit=find,
        toolkit_dirs=("/var/run/cdi", "/etc/cdi"),
        watch=watch,
        is_spec=lambda name: name.endswith(".yaml"),
    )
    told: list[ToolkitDevices] = []
    specs.on_toolkit(told.append, always=True)
    following = asyncio.create_task(specs.follow_toolkit())
    try:
        await watch.opened.wait()
        for _ in range(50):  # a writer's burst
            watch.queues["/etc/cdi"].put_nowait(("nvidia.yaml", "created"))
        watch.queues["/var/run/cdi"].put_nowait(("k8s.gpu.json", "created"))  # not read
        await _until(lambda: bool(told))
        assert (len(lookups), told) == (1, found)

        watch.queues["/etc/cdi"].put_nowait(("nvidia.yaml", "created"))  # same result
        await _until(lambda: len(lookups) == 2)
        found[0] = ToolkitDevices()
        watch.queues["/etc/cdi"].put_nowait(("nvidia.yaml", "deleted"))
        await _until(lambda: len(told) == 2)
        assert told == [ToolkitDevices(frozenset({"all"}), "/etc/cdi/nvidia.yaml", None), found[0]]
        assert len(lookups) == 3
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following


async def _until(check: Callable[[], bool]) -> None:
    """Until `check()` holds (what the watch does runs in tasks and a thread)."""
    while True:
        if check():
            return
        await asyncio.sleep(0.01)
