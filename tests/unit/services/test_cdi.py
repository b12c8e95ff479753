"""CdiSpecs: what the agent's hook hands the spec store, and how a failing store is borne."""

from __future__ import annotations

import json
from collections.abc import Mapping

from gpuslice.adapters.fake import load_spec
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
