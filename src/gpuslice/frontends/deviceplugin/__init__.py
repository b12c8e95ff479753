"""The device-plugin front-end: one gRPC server per advertised resource, registered with
the kubelet (the device-plugin API, v1beta1)."""

from __future__ import annotations

from typing import Protocol

from gpuslice.frontends.deviceplugin.frontend import NAME, DevicePluginFrontEnd
from gpuslice.frontends.deviceplugin.manager import (
    EndpointFactory,
    PluginManager,
    PluginServerFailed,
)
from gpuslice.frontends.deviceplugin.resource_handler import ResourceHandler
from gpuslice.services.agent import Agent
from gpuslice.services.node_devices import NodeDevices


def device_plugin_of(node: HasAgent) -> DevicePluginFrontEnd:
    """The device-plugin front-end of a node (the demo and the tests drive its handlers)."""
    (plugin,) = (f for f in node.agent.front_ends if isinstance(f, DevicePluginFrontEnd))
    return plugin


class HasAgent(Protocol):
    @property
    def agent(self) -> Agent[NodeDevices]: ...


__all__ = [
    "NAME",
    "DevicePluginFrontEnd",
    "EndpointFactory",
    "PluginManager",
    "PluginServerFailed",
    "ResourceHandler",
    "device_plugin_of",
]
