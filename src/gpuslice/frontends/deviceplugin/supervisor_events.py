"""A resource supervisor's vocabulary: its states and the events it is fed (those of
services.supervision, plus the kubelet's), and what it shares with the plugin manager
(counters, timing, the give-up callback)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpuslice.services import supervision
from gpuslice.services.supervision import (
    OnFailed,
    ServerDown,
    Start,
    Stop,
    TimerDue,
    Timing,
)

__all__ = [
    "Counters",
    "Event",
    "KubeletRestarted",
    "MayRegister",
    "OnFailed",
    "PluginState",
    "RegisterDone",
    "RegisterFailed",
    "ServerDown",
    "SocketDeleted",
    "Start",
    "Stop",
    "StreamDropped",
    "TimerDue",
    "Timing",
]


class PluginState(supervision.State):
    """The base states, and a plugin server's own between its start and registration."""

    __slots__ = ()
    REGISTERING: ClassVar[PluginState]  # serving, a Register call in flight
    SERVING: ClassVar[PluginState]  # serving, not registered, a Register retry due
    REGISTERED: ClassVar[PluginState]
    BLOCKED: ClassVar[PluginState]  # another plugin serves our socket path


PluginState.REGISTERING = PluginState("registering", up=True)
PluginState.SERVING = PluginState("serving", up=True)
PluginState.REGISTERED = PluginState("registered", up=True)
PluginState.BLOCKED = PluginState("blocked")


@dataclass(frozen=True)
class KubeletRestarted: ...


@dataclass(frozen=True)
class SocketDeleted: ...


@dataclass(frozen=True)
class MayRegister:
    """Registrations were held (a predecessor still streamed): register now."""


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


Event = (
    Start
    | KubeletRestarted
    | SocketDeleted
    | Stop
    | ServerDown
    | StreamDropped
    | MayRegister
    | RegisterDone
    | RegisterFailed
    | TimerDue
)


@dataclass
class Counters:
    registrations: int = 0  # successful Register calls
    server_failures: int = 0  # servers that could not start or went down
