"""Protocol constants and the one import point of the generated device-plugin modules."""

from __future__ import annotations

from gpuslice.adapters.kubelet._proto.deviceplugin.v1beta1 import api_pb2 as pb
from gpuslice.adapters.kubelet._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from gpuslice.adapters.kubelet_socket import unix_target

API_VERSION = "v1beta1"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET_NAME = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

__all__ = [
    "API_VERSION",
    "DEVICE_PLUGIN_DIR",
    "HEALTHY",
    "KUBELET_SOCKET_NAME",
    "UNHEALTHY",
    "pb",
    "pb_grpc",
    "unix_target",
]
