"""`gpuslice mps-control`: the process that MPS control daemons are started from, so
that they live in its pod rather than in the agent's, and the agent's side of it.

The host listens on a unix socket (0600: root on the node only) and does for the agent
what the LocalLauncher does in one process: start a daemon for a plan, tell which
daemon runs in a directory or under the MPS root, and say when one exits. It decides
nothing: which daemons run, their limits, when one is retired, is the agent's. It
refuses any directory outside its own MPS root. One JSON line each way a connection;
a line is at most LINE_MAX bytes and must arrive within REQUEST_TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import posixpath
import re
from typing import Any

import structlog

from gpuslice.adapters.mps.local import LocalLauncher
from gpuslice.core.mps import DaemonPlan, RunningDaemon
from gpuslice.core.ports import MpsError, MpsHostAbsent

log = structlog.get_logger("gpuslice.mps_control")

LINE_MAX = 64 * 1024
REQUEST_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 30.0  # a start runs `-d` and waits for the daemon to answer
MAX_CONNECTIONS = 64
_UUID = re.compile(r"^[A-Za-z0-9-]{1,80}$")


class HostError(ValueError):
    """A request the host refuses; its text is the answer."""


class MpsHost:
    def __init__(self, launcher: LocalLauncher, mps_root: str) -> None:
        self._launcher = launcher
        self.mps_root = posixpath.normpath(mps_root)
        self.serving = asyncio.Event()  # set once the socket answers
        self._open = 0

    async def serve(self, path: str, stop: asyncio.Event) -> None:
        """Answer on `path` until `stop` is set; the daemons started stay running."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = await asyncio.start_unix_server(self._connection, path=path, limit=LINE_MAX)
        os.chmod(path, 0o600)
        self.serving.set()
        log.info("mps_control_serving", socket=path, mps_root=self.mps_root)
        try:
            await stop.wait()
        finally:
            server.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            log.info("mps_control_stopped", daemons_left_running=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open += 1
        try:
            if self._open > MAX_CONNECTIONS:
                answer: dict[str, Any] = {"error": "too many connections"}
            else:
                try:
                    line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT_S)
                    answer = await self.answer(json.loads(line))
                except (HostError, MpsError) as exc:
                    answer = {"error": str(exc)}
                except (
                    ValueError,
                    TypeError,
                    KeyError,
                    RecursionError,  # JSON nested deeper than the parser goes
                    TimeoutError,
                    asyncio.LimitOverrunError,
                ):
                    answer = {"error": "not a request this host answers"}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except OSError:
            pass
        finally:
            self._open -= 1
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "start":
            plan = self._plan(request["plan"])
            daemon = await self._launcher.start(plan)
            log.info("mps_daemon_started_here", resource=plan.resource, pid=daemon.pid)
            return {"daemon": _daemon_json(daemon)}
        if op == "running":
            found = await self._launcher.running(self._root(request["root"]))
            return {"daemon": None if found is None else _daemon_json(found)}
        if op == "found":
            if posixpath.normpath(str(request["root"])) != self.mps_root:
                raise HostError(self._outside(request["root"]))
            return {"daemons": [_daemon_json(d) for d in await self._launcher.found(self.mps_root)]}
        if op == "exited":
            daemon = RunningDaemon(self._root(request["root"]), int(request["pid"]), None)
            await self._launcher.exited(daemon)
            return {"exited": True}
        raise HostError(f"unknown request {op!r}")

    def _root(self, root: object) -> str:
        """A resource's directory `<mpsRoot>/<domain>/<name>` under this host's root."""
        text = str(root)
        rel = posixpath.relpath(text, self.mps_root) if text.startswith("/") else ".."
        parts = rel.split("/")
        if posixpath.normpath(text) != text or len(parts) != 2 or ".." in parts:
            raise HostError(self._outside(text))
        return text

    def _outside(self, root: object) -> str:
        return f"{root} is not a resource directory under this host's MPS root {self.mps_root}"

    def _plan(self, raw: dict[str, Any]) -> DaemonPlan:
        gpus = tuple(str(g) for g in raw["gpus"])
        if not gpus or not all(_UUID.match(g) for g in gpus):
            raise HostError("gpus must be GPU UUIDs")
        root = self._root(raw["root"])
        return DaemonPlan(posixpath.relpath(root, self.mps_root), root, gpus, (), 100)


class RemoteLauncher:
    """The agent's side: a LocalLauncher whose work `gpuslice mps-control` does."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path

    async def start(self, plan: DaemonPlan) -> RunningDaemon:
        raw = {"resource": plan.resource, "root": plan.root, "gpus": list(plan.gpu_uuids)}
        answer = await self._ask({"op": "start", "plan": raw}, ANSWER_TIMEOUT_S)
        return _daemon(answer.get("daemon"))

    async def running(self, root: str) -> RunningDaemon | None:
        answer = await self._ask({"op": "running", "root": root}, ANSWER_TIMEOUT_S)
        return None if answer.get("daemon") is None else _daemon(answer["daemon"])

    async def found(self, mps_root: str) -> tuple[RunningDaemon, ...]:
        answer = await self._ask({"op": "found", "root": mps_root}, ANSWER_TIMEOUT_S)
        daemons = answer.get("daemons") or []
        if not isinstance(daemons, list):
            raise MpsError(f"the MPS control host answered {str(answer)[:200]!r}")
        return tuple(_daemon(d) for d in daemons)

    async def exited(self, daemon: RunningDaemon) -> None:
        """Return once `daemon` exits, or once the host can no longer tell (its
        connection ends): the caller looks again."""
        with contextlib.suppress(MpsError):
            await self._ask({"op": "exited", "root": daemon.root, "pid": daemon.pid}, None)

    async def _ask(self, request: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
        where = f"the MPS control host at {self.socket_path}"
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(self.socket_path, limit=LINE_MAX), REQUEST_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            raise MpsHostAbsent(f"{where} does not answer: {_why(exc)}") from None
        try:
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), timeout_s)
            answer = json.loads(line)
            if not isinstance(answer, dict):
                raise ValueError
        except (
            OSError,
            TimeoutError,
            ValueError,
            RecursionError,
            asyncio.LimitOverrunError,
        ) as exc:
            raise MpsError(f"{where} did not answer: {_why(exc)}") from None
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if "error" in answer:
            raise MpsError(f"{where}: {answer['error']}")
        return answer


def _daemon_json(daemon: RunningDaemon) -> dict[str, Any]:
    gpus = None if daemon.gpu_uuids is None else list(daemon.gpu_uuids)
    return {"root": daemon.root, "pid": daemon.pid, "gpus": gpus}


def _daemon(raw: Any) -> RunningDaemon:
    try:
        gpus = raw["gpus"]
        return RunningDaemon(
            str(raw["root"]), int(raw["pid"]), None if gpus is None else tuple(map(str, gpus))
        )
    except (KeyError, TypeError, ValueError):
        raise MpsError(f"the MPS control host answered {str(raw)[:200]!r}") from None


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return "no answer" if isinstance(exc, TimeoutError) else "not an answer"
