"""What the agent reports about itself: the state read at scrape time, and the
outcome vocabulary of its counters. The Metrics port is in core.ports; NoMetrics
is its silent implementation, for agents without /metrics and tests of parts."""

from __future__ import annotations

from dataclasses import dataclass

# Outcomes of a device-plugin request (Allocate, GetPreferredAllocation).
OK = "ok"
INVALID = "invalid"  # refused with INVALID_ARGUMENT: the request was wrong
ERROR = "error"  # failed with INTERNAL: a bug or an unexpected state

# Classes of an XID as the health policy treats it.
XID_FATAL = "fatal"  # marks the GPU until the agent restarts after a reset
XID_TRANSIENT = "transient"  # marks the GPU until a probe or a recovered event
XID_IGNORED = "ignored"  # skipped by the policy (upstream's list, DP_* env vars)


@dataclass(frozen=True, slots=True)
class GpuRef:
    """Which physical GPU a series is about (index None: no longer on the node)."""

    index: int | None
    uuid: str
    model_name: str = ""


@dataclass(frozen=True, slots=True)
class ResourceState:
    """One served resource as the kubelet sees it now."""

    name: str
    advertised: int
    healthy: int
    registered: bool


@dataclass(frozen=True, slots=True)
class GpuState:
    """One physical GPU of the node, as last enumerated."""

    index: int
    uuid: str
    model_name: str
    memory_total_bytes: int
    healthy: bool  # False while it, or any MIG device on it, is marked unhealthy


@dataclass(frozen=True, slots=True)
class NodeSummary:
    resources: tuple[ResourceState, ...] = ()
    gpus: tuple[GpuState, ...] = ()
    config: str | None = None  # the config in force (None before the first one)
    config_ok: bool = True  # False while a newer config is refused or unreadable


class NoMetrics:
    """The Metrics port that records nothing."""

    def request_observed(self, resource: str, method: str, seconds: float, outcome: str) -> None:
        pass

    def registered(self, resource: str) -> None:
        pass

    def server_failed(self, resource: str) -> None:
        pass

    def kubelet_restart_seen(self) -> None:
        pass

    def xid_seen(self, gpu: GpuRef, xid: int, xid_class: str) -> None:
        pass

    def health_transition(self, gpu: GpuRef, device: str, transition: str, cause: str) -> None:
        pass

    def config_applied(self, name: str) -> None:
        pass

    def config_rejected(self, name: str) -> None:
        pass

    def sampled(self, at_unix_s: float, interval_s: float) -> None:
        pass

    def sample_failed(self) -> None:
        pass

    def budget_action(self, gpu: GpuRef, resource: str, policy: str, outcome: str) -> None:
        pass


NO_METRICS = NoMetrics()
