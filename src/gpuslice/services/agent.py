"""The agent: the converge loop, and nothing else.

Desired settings (services.desired) go to the node's device state first (the hardware
read again, checked by every front-end, then committed), and then to each front-end,
which serves them. Whoever wants new settings (the config manager) puts them into
`desired` and awaits the outcome; a refusal changes nothing served.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Generic, TypeVar

import structlog

from gpuslice import __version__
from gpuslice.core.errors import GpusliceError
from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import AgentNode, Committed, FrontEnd, Metrics, OpenNode
from gpuslice.core.settings import Settings
from gpuslice.core.waiting import first_of, unless_stopped
from gpuslice.services.changes import counts, gpus, resource_changes, served
from gpuslice.services.desired import DesiredSettings

log = structlog.get_logger("gpuslice.agent")


N = TypeVar("N", bound=AgentNode)


class Agent(Generic[N]):
    """The converge loop over a node's device state (the AgentNode port) and its
    front-ends."""

    def __init__(
        self,
        node: N,
        front_ends: Sequence[FrontEnd],
        *,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.node = node
        self.front_ends = tuple(front_ends)
        self._metrics = metrics
        self.desired = DesiredSettings()  # the settings to serve; the agent converges to them
        self._generation = 0  # the last generation of `desired` tried
        self.ready = asyncio.Event()  # set once every front-end served the first settings

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set. The settings served first are those desired when the
        backend has opened; any put later are served after them, in order of arrival,
        latest wins.

        Raises the error of a front-end that gave up (after stopping everything), and
        AgentTaskFailed when a loop that follows the outside world ended.
        """
        first = await unless_stopped(self.desired.newer_than(0), stop)
        if first is None:
            return
        generation, settings = first.result()
        for warning in settings.warnings:
            log.warning("config_warning", config=settings.shown, detail=warning)
        async with contextlib.AsyncExitStack() as stack:
            try:
                session = await stack.enter_async_context(self.node.session(self._hand_over))
            except GpusliceError as exc:
                if settings.fail_on_init_error:
                    self.desired.settle(generation, exc)
                    raise
                log.error("backend_unavailable_waiting", error=str(exc), fail_on_init_error=False)
                await self._accept_until(stop)
                return
            await self._serve_until(session, generation, settings, stop)

    async def _serve_until(
        self, session: OpenNode, generation: int, settings: Settings, stop: asyncio.Event
    ) -> None:
        node = self.node
        for front_end in self.front_ends:  # one may wait for a predecessor
            started = await unless_stopped(front_end.start(), stop)
            if started is None:
                return
            started.result()  # raises what the start did
        first = await self._serve_first(session, generation, settings)
        async with session.serving(first) as background:  # health and the holds' checks
            self.ready.set()
            log.info(
                "agent_started",
                version=__version__,
                config=settings.shown,
                source=settings.source,
                summary=settings.summary,
                gpus=gpus(node.snapshot),
                serving=served(counts(node.resources)),
            )
            await self._follow(session, background, stop)

    async def _hand_over(self) -> None:
        """The node session's way out, once the MPS daemons run on unsupervised: every
        front-end stops, then lets go, so a successor may serve while the rest closes."""
        for front_end in self.front_ends:
            await front_end.stop()
        for front_end in self.front_ends:
            front_end.release()
        log.info("agent_stopped")

    async def apply_settings(self, settings: Settings) -> None:
        """Make `settings` the desired ones and wait until they are served, touching only
        what changed (before the agent is ready, until it started). Raises GpusliceError
        (nothing changed) when they cannot be served on this hardware."""
        await self.desired.request(settings)

    async def _follow(
        self, session: OpenNode, background: Sequence[asyncio.Task[None]], stop: asyncio.Event
    ) -> None:
        """Converge and run the front-ends until `stop`; the session's `background` tasks
        are watched (one that ends is a crash), and stopped by the session."""
        tasks = [asyncio.create_task(self._converge(session))]
        tasks += [asyncio.create_task(front_end.run()) for front_end in self.front_ends]
        watched = [*tasks, *background]
        try:
            await first_of(*watched, stop.wait(), *(f.failed.wait() for f in self.front_ends))
            crashed = _crashed(watched)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if crashed is not None:
            raise crashed
        for front_end in self.front_ends:
            if front_end.error is not None:
                raise front_end.error

    async def _serve_first(
        self, session: OpenNode, generation: int, settings: Settings
    ) -> Committed:
        try:
            first = await self._apply(session, settings)
        except GpusliceError as exc:
            self.desired.settle(generation, exc)
            raise
        self._generation = generation
        self._metrics.config_applied(settings.shown)
        self.desired.settle(generation, None)
        return first

    async def _converge(self, session: OpenNode) -> None:
        """Serve each newer desired value as it comes; settle each with its outcome."""
        while True:
            generation, settings = await self.desired.newer_than(self._generation)
            self._generation = generation
            try:
                await self._serve(session, settings)
            except GpusliceError as exc:
                self.desired.settle(generation, exc)
            else:
                self.desired.settle(generation, None)

    async def _accept_until(self, stop: asyncio.Event) -> None:
        """Without a backend (failOnInitError false): nothing can be served, so every
        desired value is settled at once, and readiness names the missing backend."""
        while True:
            self._generation = self.desired.generation
            self.desired.settle(self._generation, None)
            newer = await unless_stopped(self.desired.newer_than(self._generation), stop)
            if newer is None:
                return

    async def _serve(self, session: OpenNode, settings: Settings) -> None:
        for warning in settings.warnings:
            log.warning("config_warning", config=settings.shown, detail=warning)
        before = counts(self.node.resources)
        await self._apply(session, settings)
        changes = resource_changes(before, counts(self.node.resources))
        log.info("config_applied", config=settings.shown, changes=changes, source=settings.source)
        self._metrics.config_applied(settings.shown)

    async def _apply(self, session: OpenNode, settings: Settings) -> Committed:
        """Read the hardware, let every front-end check `settings` on it (nothing changes
        if one refuses), commit both to the node state, then serve on each front-end."""
        snapshot = await session.read()  # raises BackendError
        steps = [front_end.prepare(snapshot, settings) for front_end in self.front_ends]
        committed = session.commit(snapshot, settings)
        for step in steps:
            await step()
        return committed


def _crashed(tasks: list[asyncio.Task[None]]) -> AgentTaskFailed | None:
    """A background task that ended on its own: the agent can no longer follow the
    kubelet or the config, so it stops and exits non-zero rather than serve stale."""
    for task in tasks:
        if not task.done() or task.cancelled():
            continue
        exc = task.exception()
        name = task.get_coro().__qualname__  # type: ignore[union-attr]
        why = "returned" if exc is None else repr(exc)
        log.error("agent_task_failed", task=name, error=why, exc_info=exc)
        return AgentTaskFailed(f"internal task {name} ended unexpectedly: {why}")
    return None


class AgentTaskFailed(GpusliceError):  # noqa: N818 - reads as what happened
    """A background task of the agent ended with an error (a bug): exit so the pod restarts."""
