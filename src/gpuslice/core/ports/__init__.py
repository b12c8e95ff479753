"""Ports: what the services need from the outside world, as Protocols, split by concern
(hardware, kubelet, cluster, metrics, mps, node, dra); every name is re-exported here."""

from gpuslice.core.ports.cluster import (
    ConfigMapView,
    LabelSink,
    NodeApi,
    PodEvents,
)
from gpuslice.core.ports.dra import (
    ClaimCheckpoint,
    ClaimSpecs,
    DraApi,
    DraEndpoint,
    DraHandler,
)
from gpuslice.core.ports.hardware import (
    GpuBackend,
    Host,
    MemoryLimits,
    MigControl,
    PodCgroups,
    ProcessOwners,
    TimeSlicer,
)
from gpuslice.core.ports.kubelet import (
    ClaimDir,
    DirectoryClaim,
    DirEvents,
    DirWatch,
    PluginEndpoint,
    PluginHandler,
    PodResources,
    SocketTaken,
)
from gpuslice.core.ports.metrics import (
    Metrics,
)
from gpuslice.core.ports.mps import (
    MpsCommands,
    MpsError,
    MpsHostAbsent,
    MpsLauncher,
)
from gpuslice.core.ports.node import (
    AgentNode,
    CdiStore,
    Committed,
    DevicePlan,
    FrontEnd,
    FrontEndStep,
    NodeView,
    OpenNode,
    UnhealthyListener,
)

__all__ = [
    "AgentNode",
    "CdiStore",
    "ClaimCheckpoint",
    "ClaimDir",
    "ClaimSpecs",
    "Committed",
    "ConfigMapView",
    "DevicePlan",
    "DirEvents",
    "DirWatch",
    "DirectoryClaim",
    "DraApi",
    "DraEndpoint",
    "DraHandler",
    "FrontEnd",
    "FrontEndStep",
    "GpuBackend",
    "Host",
    "LabelSink",
    "MemoryLimits",
    "Metrics",
    "MigControl",
    "MpsCommands",
    "MpsError",
    "MpsHostAbsent",
    "MpsLauncher",
    "NodeApi",
    "NodeView",
    "OpenNode",
    "PluginEndpoint",
    "PluginHandler",
    "PodCgroups",
    "PodEvents",
    "PodResources",
    "ProcessOwners",
    "SocketTaken",
    "TimeSlicer",
    "UnhealthyListener",
]
