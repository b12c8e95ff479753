"""A kubelet stand-in for tests and demos (see kubelet.py); never a replacement for the kubelet."""

from gpuslice.testing.kubelet.kubelet import KubeletStandin
from gpuslice.testing.kubelet.names import (
    extended_resource_name_problem,
    is_extended_resource_name,
)
from gpuslice.testing.kubelet.records import (
    UNEXPECTED_ADMISSION_ERROR,
    AdmissionError,
    AdmittedContainer,
    DeviceState,
    Disconnect,
    InsufficientResourceError,
    NodeStatus,
    PluginOptions,
    RegistrationRecord,
    StaleStream,
    StandinError,
)

__all__ = [
    "UNEXPECTED_ADMISSION_ERROR",
    "AdmissionError",
    "AdmittedContainer",
    "DeviceState",
    "Disconnect",
    "InsufficientResourceError",
    "KubeletStandin",
    "NodeStatus",
    "PluginOptions",
    "RegistrationRecord",
    "StaleStream",
    "StandinError",
    "extended_resource_name_problem",
    "is_extended_resource_name",
]
