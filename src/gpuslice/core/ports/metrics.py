"""Ports: What the services report for /metrics."""

from __future__ import annotations

from typing import Protocol

from gpuslice.core.metrics import GpuRef


class Metrics(Protocol):
    """What the services report for /metrics (core.metrics.NoMetrics records nothing).
    Every call is cheap, made on the loop, and never raises."""

    def request_observed(self, resource: str, method: str, seconds: float, outcome: str) -> None:
        """One Allocate or GetPreferredAllocation call and its outcome (core.metrics)."""
        ...

    def registered(self, resource: str) -> None:
        """A Register call the kubelet accepted."""
        ...

    def server_failed(self, resource: str) -> None:
        """A device-plugin server that could not start or went down on its own."""
        ...

    def kubelet_restart_seen(self) -> None: ...

    def xid_seen(self, gpu: GpuRef, xid: int, xid_class: str) -> None:
        """An XID event, with its class under the health policy (core.metrics.XID_*)."""
        ...

    def health_transition(self, gpu: GpuRef, device: str, transition: str, cause: str) -> None:
        """`device` (the GPU or a MIG device on it) was marked, escalated or recovered."""
        ...

    def config_applied(self, name: str) -> None: ...

    def config_rejected(self, name: str) -> None: ...

    def sampled(self, at_unix_s: float, interval_s: float) -> None:
        """A per-process sample succeeded at this wall-clock time; they are `interval_s` apart."""
        ...

    def sample_failed(self) -> None: ...

    def budget_action(self, gpu: GpuRef, resource: str, policy: str, outcome: str) -> None:
        """The memory-budget watchdog acted on a container over its budget on `gpu`."""
        ...
