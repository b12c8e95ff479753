"""`gpuslice labels`: the node's labels without the device plugin, run as GPU Feature
Discovery runs: label and publish, then (unless oneshot) relabel every sleep interval
until stopped; each reload (SIGHUP) re-reads the config file and relabels at once.

The labeller, its sinks and its run modes are services.labeller and
wiring.label_output, shared with `gpuslice run`. The hardware is read afresh for each
labelling, on one worker thread. A config that fails on reload keeps the last good one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import structlog

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import GpusliceError
from gpuslice.core.mps import plan_serving
from gpuslice.core.ports import GpuBackend
from gpuslice.core.sharing import ResourceSettings
from gpuslice.services.labeller import Labeller, snapshot_labels
from gpuslice.wiring import (
    RunOptions,
    effective_config,
    label_output,
    node_api,
    open_backend,
    pinned_limit,
    settings_from,
)

log = structlog.get_logger("gpuslice.labels")

NO_GPUS = HardwareSnapshot(gpus=())


async def run_labels(
    opts: RunOptions, stop: asyncio.Event, reload: asyncio.Event | None = None
) -> None:
    """Label until `stop` (once when oneshot). Raises GpusliceError for a bad config or
    flag, a backend that cannot start (unless failOnInitError is false) and, in oneshot
    mode, a labelling or output that fails."""
    loaded = effective_config(opts)
    first = settings_from(loaded, opts)
    resources, mps_root = first.resources, first.allocate.mps_root
    api = node_api(opts)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuslice-backend")
    loop = asyncio.get_running_loop()
    backend: GpuBackend | None = None
    try:
        output = label_output(opts, api, loaded.config)
        try:
            backend = await loop.run_in_executor(pool, open_backend, opts)
        except GpusliceError as exc:
            if first.fail_on_init_error:
                raise
            log.error("backend_unavailable_labelling_no_gpus", error=str(exc))

        async def read() -> tuple[HardwareSnapshot, ResourceSettings]:
            if backend is None:
                return NO_GPUS, resources
            snapshot = await loop.run_in_executor(pool, backend.snapshot)
            # what `run` refuses on this hardware is not labelled either (HardwareError)
            plan_serving(snapshot, resources, mps_root, pinned_limit_mib=pinned_limit(opts))
            return snapshot, resources

        labeller = Labeller(
            snapshot_labels(read, machine=output.machine),
            output.sinks,
            interval_s=output.interval_s,
            oneshot=output.oneshot,
            timestamps=output.timestamps,
        )

        async def reread() -> None:
            nonlocal resources, mps_root
            try:
                again = settings_from(effective_config(opts), opts)
                resources, mps_root = again.resources, again.allocate.mps_root
            except GpusliceError as exc:
                log.error("config_rejected_keeping_last_good", error=str(exc))
            try:
                await labeller.relabel()
            except GpusliceError as exc:
                log.error("labels_failed", error=str(exc))

        async with _on_each(reload, reread):
            await labeller.run(stop)
    finally:
        if backend is not None:
            await loop.run_in_executor(pool, backend.close)
        pool.shutdown(wait=True)
        if api is not None:
            await api.aclose()


@contextlib.asynccontextmanager
async def _on_each(
    event: asyncio.Event | None, action: Callable[[], Awaitable[None]]
) -> AsyncIterator[None]:
    """Run `action` each time `event` is set, while the block runs."""

    async def follow() -> None:
        assert event is not None
        while True:
            await event.wait()
            event.clear()
            await action()

    task = None if event is None else asyncio.create_task(follow())
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
