"""The device-plugin API adapter: one gRPC server per resource (ListAndWatch, Allocate,
GetPreferredAllocation), its endpoint with its crash watch, Register with the kubelet,
and the device-plugin directory's lock. adapters.podresources speaks the kubelet's
other API; both use the generated modules of adapters.kubelet."""

from gpuslice.adapters.deviceplugin.api import API_VERSION, DEVICE_PLUGIN_DIR, KUBELET_SOCKET_NAME
from gpuslice.adapters.deviceplugin.endpoint import KubeletEndpoint
from gpuslice.adapters.deviceplugin.registration import RegistrationError, register
from gpuslice.adapters.deviceplugin.server import DevicePluginServer, ServerError

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
