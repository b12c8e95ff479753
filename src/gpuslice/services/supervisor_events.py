"""A resource supervisor's vocabulary: its states, the events it is fed, and what
it shares with the plugin manager (counters, timing, the give-up callback)."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


class State(enum.Enum):
    NEW = "new"
    STARTING = "starting"
    REGISTERING = "registering"  # serving, a Register call in flight
    SERVING = "serving"  # serving, not registered: a Register retry is due
    REGISTERED = "registered"
    BLOCKED = "blocked"  # another plugin serves our socket path: looked at again later
    BACKING_OFF = "backing_off"  # the server failed: started again after a backoff
    STOPPED = "stopped"
    FAILED = "failed"  # the restart budget is spent


UP = frozenset({State.REGISTERING, State.SERVING, State.REGISTERED})


@dataclass(frozen=True)
class Start: ...


@dataclass(frozen=True)
class KubeletRestarted: ...


@dataclass(frozen=True)
class SocketDeleted: ...


@dataclass(frozen=True)
class Stop: ...


@dataclass(frozen=True)
class ServerDown:
    incarnation: int
    reason: str


@dataclass(frozen=True)
class StreamDropped:
    """The kubelet cancelled a ListAndWatch stream of this server: it dropped the resource."""

    incarnation: int


@dataclass(frozen=True)
class RegisterDone:
    step: int


@dataclass(frozen=True)
class RegisterFailed:
    step: int
    error: str


@dataclass(frozen=True)
class TimerDue:
    step: int


Event = (
    Start
    | KubeletRestarted
    | SocketDeleted
    | Stop
    | ServerDown
    | StreamDropped
    | RegisterDone
    | RegisterFailed
    | TimerDue
)


@dataclass
class Counters:
    registrations: int = 0  # successful Register calls
    server_failures: int = 0  # servers that could not start or went down


@dataclass(frozen=True)
class Timing:
    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[None]]


OnFailed = Callable[[str, int, str], None]  # (resource, failures, last reason)
