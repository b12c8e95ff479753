"""A simulated `nvidia-cuda-mps-control`: the same command line, env and stdin commands,
and a daemon that serves clients as the real one does.

`-d` starts the control daemon in the background and returns once it answers; `-f`
runs it in the foreground. Without either, commands are read from stdin, one a line,
each sent to the daemon and its answer printed, as the real client does.

The daemon listens on `control` in its pipe directory (CUDA_MPS_PIPE_DIRECTORY) and
writes `nvidia-cuda-mps-control.pid` there. Simulated CUDA programs
(gpuslice.testing.mps_client) connect to the same socket: a client is served by the
server of its UID, started at its UID's first client with the daemon's defaults at that
moment (set_default_* change only servers started later; set_* <server> change the new
clients of a running server). A server outlives its clients until `quit`, which refuses
new clients, waits for every client to leave, and only then ends the daemon (no
timeout, as the real `quit` without -t). SIGKILL leaves its files behind and cuts every
client off, as a crash would. Run as `python -m gpuslice.testing.mps_control`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL = "control"
LINE_MAX = 4096


def _pipe_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))


def _log_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))


@dataclass
class _Server:
    uid: int
    pinned: dict[str, str]
    threads: float
    clients: dict[int, asyncio.StreamWriter] = field(default_factory=dict)


class _Daemon:
    def __init__(self, visible: str | None) -> None:
        self.count = len(visible.split(",")) if visible else None
        self.pinned: dict[str, str] = {}
        self.threads = 100.0
        self.servers: dict[int, _Server] = {}
        self.quitting = False
        self.left = asyncio.Event()  # set, and replaced, each time a client leaves
        self.done = asyncio.Event()
        self._next_server = os.getpid() * 100

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            words = (await reader.readline())[:LINE_MAX].decode(errors="replace").split()
            if words[:1] == ["client"] and len(words) == 3 and (words[1] + words[2]).isdigit():
                await self._client(int(words[1]), int(words[2]), reader, writer)
            elif words[:1] == ["command"]:
                try:
                    answer = await self._command(words[1:])
                except ValueError:
                    answer = f"error: Invalid value in: {' '.join(words[1:])}\n"
                writer.write(answer.encode())
        except OSError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _client(
        self, pid: int, uid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self.quitting:
            writer.write(b"refused: the MPS control daemon is shutting down\n")
            return
        found = [(i, s) for i, s in self.servers.items() if s.uid == uid]
        server_id, server = found[0] if found else (0, None)
        if server is None:
            self._next_server += 1
            server_id, server = self._next_server, _Server(uid, dict(self.pinned), self.threads)
            self.servers[server_id] = server
        server.clients[pid] = writer
        limits = {"server": server_id, "pinned": server.pinned, "threads": server.threads}
        writer.write(f"ok {json.dumps(limits, sort_keys=True)}\n".encode())
        await writer.drain()
        try:
            await reader.read()  # until the client leaves
        finally:
            server.clients.pop(pid, None)
            left, self.left = self.left, asyncio.Event()
            left.set()

    def clients(self) -> int:
        return sum(len(s.clients) for s in self.servers.values())

    async def _command(self, words: list[str]) -> str:
        """The answer to one command: its lines, or `error: ...`."""
        server = self.servers.get(int(words[1])) if words[1:2] and words[1].isdigit() else None
        match words:
            case ["quit"]:
                self.quitting = True
                while self.clients():
                    await self.left.wait()
                self.done.set()
                return ""
            case ["set_default_device_pinned_mem_limit", index, size]:
                return self._set_pinned(self.pinned, index, size)
            case ["get_default_device_pinned_mem_limit", index]:
                return f"{self.pinned.get(index, '0')}\n"
            case ["set_default_active_thread_percentage", pct]:
                self.threads = float(pct)
                return ""
            case ["get_default_active_thread_percentage"]:
                return f"{self.threads}\n"
            case ["get_server_list"]:
                return "".join(f"{i}\n" for i in self.servers)
            case ["get_client_list", _] if server:
                return "".join(f"{p}\n" for p in server.clients)
            case ["set_active_thread_percentage", _, pct] if server:
                server.threads = float(pct)
                return ""
            case ["get_active_thread_percentage", _] if server:
                return f"{server.threads}\n"
            case ["set_device_pinned_mem_limit", _, index, size] if server:
                return self._set_pinned(server.pinned, index, size)
            case ["get_device_pinned_mem_limit", _, index] if server:
                return f"{server.pinned.get(index, '0')}\n"
        return f"error: Unrecognized command: {' '.join(words)}\n"

    def _set_pinned(self, pinned: dict[str, str], index: str, size: str) -> str:
        if not size[:-1].isdigit():
            return f"error: Invalid memory limit {size}\n"
        if self.count is not None and not (index.isdigit() and int(index) < self.count):
            return f"error: Invalid device index {index}\n"
        pinned[index] = size
        return ""


def _alive(pipe: Path) -> int | None:
    """The daemon's pid when one runs for `pipe`."""
    try:
        pid = int((pipe / PID_FILE).read_text())
        _check_running(pid)
    except (OSError, ValueError):
        return None
    return pid


async def _foreground(pipe: Path) -> None:
    daemon = _Daemon(os.environ.get("CUDA_VISIBLE_DEVICES"))
    (pipe / CONTROL).unlink(missing_ok=True)  # a crashed daemon's socket
    server = await asyncio.start_unix_server(daemon.serve, path=str(pipe / CONTROL))
    os.chmod(pipe / CONTROL, 0o777)  # noqa: S103 - clients of any UID, as the real pipes
    (pipe / PID_FILE).write_text(str(os.getpid()))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # as the real daemon: ignored, quit ends it
        loop.add_signal_handler(sig, lambda: None)
    await daemon.done.wait()
    for name in (PID_FILE, CONTROL):
        (pipe / name).unlink(missing_ok=True)
    server.close()
    for s in daemon.servers.values():
        for writer in s.clients.values():
            writer.close()


def foreground() -> int:
    pipe, logs = _pipe_dir(), _log_dir()
    if _alive(pipe) is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "control.log", "a", encoding="utf-8") as log:
        log.write("Starting control daemon\n")
    asyncio.run(_foreground(pipe))
    return 0


def background() -> int:
    """Start the daemon detached, and return once it answers (as `-d` does)."""
    logs = _log_dir()
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "daemon.out", "ab") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "gpuslice.testing.mps_control", "-f"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    pipe = _pipe_dir()
    fd = os.pidfd_open(child.pid)
    try:
        while _alive(pipe) != child.pid or not (pipe / CONTROL).exists():
            if select.select([fd], [], [], 0.01)[0]:  # it exited: already running, or a failure
                return child.wait() or 1
        return 0
    finally:
        os.close(fd)


def client() -> int:
    """Send each stdin line to the daemon as one command and print its answer."""
    pipe = _pipe_dir()
    for line in sys.stdin:
        if not line.split():
            continue
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(pipe / CONTROL))
                sock.sendall(f"command {line.strip()}\n".encode())
                reply = sock.makefile("rb").read().decode(errors="replace")
        except OSError:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        if reply.startswith("error: "):
            print(reply.removeprefix("error: ").strip(), file=sys.stderr)
            return 1
        print(reply, end="", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "-f" in args:
        return foreground()
    if "-d" in args:
        return background()
    return client()


def _check_running(pid: int) -> None:
    """OSError unless `pid` runs: a zombie (exited, not yet reaped by its parent) does not."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    if state in ("Z", "X"):
        raise ProcessLookupError(pid)


if __name__ == "__main__":
    sys.exit(main())
