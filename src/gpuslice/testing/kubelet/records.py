"""What the stand-in records and reports, and the errors it raises."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuslice.core.response import ContainerAllocation

UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"


@dataclass(frozen=True, slots=True)
class PluginOptions:
    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False


@dataclass(frozen=True, slots=True)
class DeviceState:
    id: str
    healthy: bool
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RegistrationRecord:
    """One Register call as the stand-in saw it (`at` is time.monotonic())."""

    at: float
    resource: str
    endpoint: str
    version: str
    accepted: bool
    error: str = ""
    options: PluginOptions | None = None


@dataclass(frozen=True, slots=True)
class StaleStream:
    """An old ListAndWatch stream of a resource outlived a newer registration.

    Once that old stream ends, the kubelet (and the stand-in) marks every device
    of the resource Unhealthy and drops the newer endpoint; a well-behaved plugin
    never causes this.
    """

    at: float
    resource: str
    old_endpoint: str
    new_endpoint: str
    detail: str


@dataclass(frozen=True, slots=True)
class Disconnect:
    """A stream of `ended` ended, and the kubelet dropped the resource's current client,
    `dropped` (the same endpoint, unless a newer one had registered: a StaleStream)."""

    at: float
    resource: str
    ended: str
    dropped: str


@dataclass(frozen=True, slots=True)
class AdmittedContainer:
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    allocation: ContainerAllocation  # what the container runtime would be given
    pod_uid: str = ""  # the UID the stand-in gave the pod


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """Extended resources as `kubectl describe node` shows them.

    capacity counts every device of a registered plugin and allocatable its
    healthy ones, as the Node object has them (both 0 for a resource whose plugin
    has not registered since the last restart). allocated counts the devices held
    by admitted pods and free the healthy devices nobody holds: what a new pod
    can still get.
    """

    capacity: dict[str, int] = field(default_factory=dict)
    allocatable: dict[str, int] = field(default_factory=dict)
    allocated: dict[str, int] = field(default_factory=dict)
    free: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        lines: list[str] = []
        for title, values in (
            ("Capacity", self.capacity),
            ("Allocatable", self.allocatable),
            ("Allocated", self.allocated),
            ("Free", self.free),
        ):
            lines.append(f"{title}:")
            lines.extend(f"  {name}:  {values[name]}" for name in sorted(values))
        return "\n".join(lines)


class StandinError(Exception):
    """Misuse of the stand-in, or a pod it cannot place."""


class InsufficientResourceError(StandinError):
    """The scheduler's view: the pod asks for more than the node's capacity and stays Pending."""

    def __init__(self, pod: str, resource: str) -> None:
        super().__init__(f"pod {pod}: 0/1 nodes are available: 1 Insufficient {resource}")
        self.pod = pod
        self.resource = resource


class AdmissionError(StandinError):
    """Device admission failed; a real kubelet fails the pod with UnexpectedAdmissionError.

    `code` is the gRPC status name when a plugin call failed, else None.
    """

    reason = UNEXPECTED_ADMISSION_ERROR

    def __init__(self, resource: str, message: str, code: str | None = None) -> None:
        super().__init__(f"{self.reason}: {message}")
        self.resource = resource
        self.code = code
        self.message = message
