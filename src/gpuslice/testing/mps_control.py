"""A simulated `nvidia-cuda-mps-control`: the same command line, env and stdin commands.

`-d` starts the control daemon in the background and returns once it answers; `-f`
runs it in the foreground. Without either, commands are read from stdin, one a line,
and answered on stdout, as the real client does. The daemon keeps the limits it was
given in `state.json` in its pipe directory, writes `nvidia-cuda-mps-control.pid` and a
`control` file there, and dies as a real one does when killed (SIGKILL leaves its
files behind, as a crash would). Run as `python -m gpuslice.testing.mps_control`.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL = "control"
STATE = "state.json"
_START_TIMEOUT_S = 10.0


def _pipe_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))


def _log_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))


def _alive(pipe: Path) -> int | None:
    """The daemon's pid when one runs for `pipe`."""
    try:
        pid = int((pipe / PID_FILE).read_text())
        _check_running(pid)
    except (OSError, ValueError):
        return None
    return pid


def _write_state(pipe: Path, state: dict[str, object]) -> None:
    tmp = pipe / f".{STATE}.tmp"
    tmp.write_text(json.dumps(state, sort_keys=True))
    os.replace(tmp, pipe / STATE)


def _read_state(pipe: Path) -> dict[str, object]:
    state: dict[str, object] = json.loads((pipe / STATE).read_text())
    return state


def foreground() -> int:
    pipe, logs = _pipe_dir(), _log_dir()
    if _alive(pipe) is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    _write_state(pipe, {"visible": visible, "pinned": {}, "threads": 100.0})
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    (pipe / PID_FILE).write_text(str(os.getpid()))
    (pipe / CONTROL).touch()
    with open(logs / "control.log", "a", encoding="utf-8") as log:
        log.write("Starting control daemon\n")
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    for name in (CONTROL, PID_FILE):
        (pipe / name).unlink(missing_ok=True)
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


def _answer(pipe: Path, pid: int, words: list[str]) -> str | None:
    """The reply to one command (None: unrecognised)."""
    state = _read_state(pipe)
    pinned = state["pinned"]
    assert isinstance(pinned, dict)
    visible = state["visible"]
    count = len(str(visible).split(",")) if visible else None
    match words:
        case ["set_default_device_pinned_mem_limit", index, size] if size[:-1].isdigit():
            if count is not None and not (index.isdigit() and int(index) < count):
                return f"Invalid device index {index}"
            pinned[index] = size
        case ["get_default_device_pinned_mem_limit", index]:
            return str(pinned.get(index, "0"))
        case ["set_default_active_thread_percentage", pct]:
            state["threads"] = float(pct)
        case ["get_default_active_thread_percentage"]:
            return f"{state['threads']}"
        case ["get_server_list"]:
            return ""
        case ["quit"]:
            fd = os.pidfd_open(pid)
            os.kill(pid, signal.SIGTERM)
            select.select([fd], [], [])
            os.close(fd)
            return ""
        case _:
            return None
    _write_state(pipe, state)
    return ""


def client() -> int:
    pipe = _pipe_dir()
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        pid = _alive(pipe)
        if pid is None:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        reply = _answer(pipe, pid, words)
        if reply is None:
            print(f"Unrecognized command: {line.strip()}", file=sys.stderr)
            return 1
        if reply:
            print(reply, flush=True)
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
