"""The kubelet adapter: device-plugin gRPC servers, their endpoints and registration.

The only package that imports grpc and the generated protobuf modules.
"""

from gpuslice.adapters.kubelet.api import API_VERSION, DEVICE_PLUGIN_DIR, KUBELET_SOCKET_NAME
from gpuslice.adapters.kubelet.endpoint import KubeletEndpoint
from gpuslice.adapters.kubelet.registration import RegistrationError, register
from gpuslice.adapters.kubelet.server import DevicePluginServer, ServerError

__all__ = [
    "API_VERSION",
    "DEVICE_PLUGIN_DIR",
    "KUBELET_SOCKET_NAME",
    "DevicePluginServer",
    "KubeletEndpoint",
    "RegistrationError",
    "ServerError",
    "register",
]
