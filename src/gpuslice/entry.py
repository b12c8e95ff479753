"""The `gpuslice` command's entry point, kept free of imports.

A SIGHUP (reload) may come while the process is still importing its modules; its default
action would end the process. It is held from the first line here, before anything heavy
is imported, and handed to the command's loop once it takes signals (`take_held_reload`).
"""

from __future__ import annotations

import signal
from types import FrameType

_held: list[int] = []


def _hold(signum: int, frame: FrameType | None) -> None:
    _held.append(signum)


def take_held_reload() -> bool:
    """True (once) when a SIGHUP came before the command's own handler took over."""
    held = bool(_held)
    _held.clear()
    return held


def main() -> None:
    signal.signal(signal.SIGHUP, _hold)
    from gpuslice.cli import main as command

    command()
