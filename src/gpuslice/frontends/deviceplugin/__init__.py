"""The device-plugin front-end: one gRPC server per advertised resource, registered with
the kubelet (the device-plugin API, v1beta1)."""

from gpuslice.frontends.deviceplugin.frontend import NAME, DevicePluginFrontEnd
from gpuslice.frontends.deviceplugin.manager import (
    EndpointFactory,
    PluginManager,
    PluginServerFailed,
)
from gpuslice.frontends.deviceplugin.resource_handler import ResourceHandler

__all__ = [
    "NAME",
    "DevicePluginFrontEnd",
    "EndpointFactory",
    "PluginManager",
    "PluginServerFailed",
    "ResourceHandler",
]
