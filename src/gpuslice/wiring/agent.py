"""The agent of `gpuslice run`: the node's device state (backend, CDI specs, MPS daemons,
holds) and its front-ends (the device plugin, and DRA with --dra)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from gpuslice.adapters.deviceplugin.endpoint import KubeletEndpoint
from gpuslice.adapters.fswatch import DirWatcher
from gpuslice.config.options import RunOptions
from gpuslice.core.cdi import uses_cdi
from gpuslice.core.dra.devices import DraOptions
from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import (
    ClaimDir,
    DirEvents,
    DirWatch,
    FrontEnd,
    GpuBackend,
    Host,
    Metrics,
    PluginEndpoint,
    PodResources,
)
from gpuslice.core.response import AllocateOptions
from gpuslice.core.restart import RestartBudget
from gpuslice.frontends.deviceplugin import (
    DevicePluginFrontEnd,
    EndpointFactory,
    ResourceHandler,
    device_plugin_of,
)
from gpuslice.services.agent import Agent
from gpuslice.services.cdi import CdiSpecs
from gpuslice.services.claim_shares import ClaimShares
from gpuslice.services.mps import DaemonSettings, MpsDaemons, MpsTools, Notify
from gpuslice.services.node_devices import NodeDevices
from gpuslice.wiring.host import host

if TYPE_CHECKING:
    from gpuslice.frontends.dra.frontend import DraFrontEnd

CHECKPOINT = "kubelet_internal_checkpoint"
__all__ = ["CHECKPOINT", "Parts", "agent", "device_plugin_of", "parts", "toolkit_problem"]


@dataclass(frozen=True)
class Parts:
    """The adapters a node's agent is built from, as `run` picks them (wiring.parts); a
    test or the bench may swap one (dataclasses.replace) before building."""

    host: Host  # the one host of the command (wiring.host), asked for everything else
    open_backend: Callable[[], GpuBackend]  # raises BackendError when NVML cannot start
    endpoint: EndpointFactory  # one device-plugin endpoint per resource
    watch: DirWatch | None  # the device-plugin directory's watch (None: not followed)
    plugin_dir: str
    restart_budget: RestartBudget | None = None  # None: upstream's (5 restarts an hour)
    # Takes the device-plugin directory from a predecessor just before serving, and hands
    # it to a successor on the way out (None: not claimed here, as in tests of parts).
    claim_dir: ClaimDir | None = None


def parts(opts: RunOptions, metrics: Metrics = NO_METRICS) -> Parts:
    """The adapters of `opts`: the host (built here, once per node), its backend, the
    kubelet's directory."""
    plugin_dir, kubelet_socket = opts.kubelet.plugin_dir, opts.kubelet.socket

    def endpoint(handler: ResourceHandler) -> PluginEndpoint:
        return KubeletEndpoint.create(handler, plugin_dir, kubelet_socket, metrics)

    machine = host(opts)
    return Parts(
        host=machine,
        open_backend=machine.open_backend,
        endpoint=endpoint,
        watch=watch if kubelet_socket else None,
        plugin_dir=plugin_dir,
    )


def watch(path: str, names: Collection[str] | None) -> DirEvents:
    return DirWatcher(path, names)


def _cdi_watch(path: str, names: Collection[str] | None) -> DirEvents:
    """A CDI directory: not through a link, polled twice a second where inotify fails."""
    return DirWatcher(path, names, poll_interval=0.5, follow=False)


def agent(
    opts: RunOptions,
    metrics: Metrics = NO_METRICS,
    with_parts: Parts | None = None,
    *,
    shares: ClaimShares | None = None,
    mps_notify: Notify | None = None,
) -> Agent[NodeDevices]:
    """The converge loop over the node's devices and its front-ends: the device plugin,
    and DRA with --dra (`shares`: its prepared claims' shares, for memory isolation)."""
    chosen = with_parts or parts(opts, metrics)
    machine = chosen.host
    devices = NodeDevices(
        chosen.open_backend,
        cdi=cdi_specs(opts, machine),
        mps=mps_daemons(opts, machine, mps_notify),
        pod_resources=lambda: held_back_by(opts),
        metrics=metrics,
    )
    front_ends: list[FrontEnd] = [device_plugin(opts, machine, devices, metrics, chosen)]
    if (dra := opts.dra.served) is not None:
        front_ends.append(dra_front_end(opts, dra, machine, devices, shares))
    return Agent(devices, front_ends, metrics=metrics)


def device_plugin(
    opts: RunOptions, machine: Host, devices: NodeDevices, metrics: Metrics, parts: Parts
) -> DevicePluginFrontEnd:
    """The device-plugin front-end: one endpoint per resource in the kubelet's directory
    (with DRA on, only those --dra-device-plugin-resources names)."""
    return DevicePluginFrontEnd(
        devices,
        parts.endpoint,
        parts.plugin_dir,
        watch=parts.watch,
        control_devices=machine.control_devices(),
        budget=parts.restart_budget,
        claim_dir=parts.claim_dir,
        metrics=metrics,
        kept=opts.dra.device_plugin_resources if opts.dra.enabled else None,
    )


def dra_front_end(
    opts: RunOptions,
    dra: DraOptions,
    machine: Host,
    devices: NodeDevices,
    shares: ClaimShares | None,
) -> DraFrontEnd:
    """The DRA front-end (--dra): its sockets in the kubelet's plugin directories, its
    checkpoint beside its socket, a CDI spec per claim and the NVIDIA Container Toolkit's
    devices from the CDI directory, ResourceSlices and ResourceClaims through the API
    (config.options checked that there are both)."""
    from gpuslice.adapters.cdi_file import find_toolkit_devices
    from gpuslice.adapters.dra.checkpoint import ClaimCheckpointFile
    from gpuslice.adapters.dra.claim_specs import ClaimSpecDir
    from gpuslice.adapters.dra.server import DraServer
    from gpuslice.adapters.kube.dra_api import KubeDraApi
    from gpuslice.frontends.dra.claim_mps import HOLDER, ClaimDaemons
    from gpuslice.frontends.dra.driver import DraDriver
    from gpuslice.frontends.dra.dynamic_mig import MigInstances
    from gpuslice.frontends.dra.frontend import DraFrontEnd
    from gpuslice.frontends.dra.publisher import SlicePublisher

    api = KubeDraApi(kubeconfig=opts.api.kubeconfig or None)
    plugin_dir = os.path.join(opts.dra.plugins_dir, dra.driver)
    mps = ClaimDaemons(mps_daemons(opts, machine, holder=HOLDER), devices.hold, opts.mps.root)

    async def stop() -> None:
        await mps.close()  # the claims' daemons run on for the next agent
        await api.aclose()

    driver = DraDriver(
        node=opts.api.node_name,
        opts=dra,
        view=devices,
        api=api,
        checkpoint=ClaimCheckpointFile(plugin_dir),
        specs=ClaimSpecDir(opts.device_plugin.cdi_spec_dir),
        control_devices=machine.control_devices(),
        shares=shares,
        time_slicer=machine.time_slicer(),
        mig=MigInstances(devices.on_backend) if dra.dynamic_mig else None,
        mps=mps,
    )
    return DraFrontEnd(
        devices,
        driver,
        SlicePublisher(api, node=opts.api.node_name, opts=dra),
        DraServer(driver, registry_dir=opts.dra.registry_dir, plugin_dir=plugin_dir),
        device_plugin=opts.dra.device_plugin_resources,
        find_toolkit=partial(find_toolkit_devices, toolkit_dirs(opts)),
        on_stop=stop,
    )


def mps_daemons(
    opts: RunOptions, machine: Host, notify: Notify | None = None, *, holder: str = ""
) -> MpsDaemons:
    """MPS control daemons (started only for MPS resources, or with `holder`, for DRA
    claims): from `gpuslice mps-control` when --mps-control-socket names it, else from the
    agent itself."""
    from gpuslice.adapters.mps import ControlCommands, LocalLauncher, RemoteLauncher

    binary, socket = machine.mps_binary(), opts.mps.control_socket
    launcher = RemoteLauncher(socket) if socket else LocalLauncher(binary)
    return MpsDaemons(
        MpsTools(launcher, ControlCommands(binary), notify),
        DaemonSettings(
            pinned_limit_mib=opts.mps.pinned_memory_limit_mib,
            roots=(opts.mps.root,),
            claims=bool(holder),
            holder=holder or "mps",
        ),
    )


@contextlib.asynccontextmanager
async def held_back_by(opts: RunOptions) -> AsyncIterator[PodResources]:
    """PodResources for holding back moved devices (services.holds), accounting or not:
    a short timeout, since the agent reads it before serving each config."""
    from gpuslice.adapters.podresources import PodResourcesClient

    checkpoint = os.path.join(opts.kubelet.plugin_dir, CHECKPOINT)
    client = PodResourcesClient(
        opts.kubelet.pod_resources_socket,
        checkpoint,
        timeout_s=2.0,
        kubelet_socket=opts.kubelet.socket,
    )
    try:
        yield client
    finally:
        await client.aclose()


def cdi_specs(opts: RunOptions, machine: Host) -> CdiSpecs | None:
    """The CDI spec writer (None: --cdi-spec-dir is empty). It is always wired, since a
    reload may switch to a cdi-* strategy, and writes nothing under the others."""
    if not opts.device_plugin.cdi_spec_dir:
        return None
    from gpuslice.adapters.cdi_file import CdiSpecDir, find_toolkit_devices, is_spec_name

    dirs = toolkit_dirs(opts)
    return CdiSpecs(
        CdiSpecDir(opts.device_plugin.cdi_spec_dir),
        control_devices=machine.control_devices(),
        extra_nodes=dict(machine.extra_cdi_nodes()),
        find_toolkit=partial(find_toolkit_devices, dirs),
        toolkit_dirs=dirs,
        watch=_cdi_watch,
        is_spec=is_spec_name,
    )


def toolkit_dirs(opts: RunOptions) -> tuple[str, ...]:
    """Where the NVIDIA Container Toolkit's CDI spec is looked for, in the runtimes' order
    of precedence: the dynamic directory (--cdi-spec-dir), then the static one."""
    plugin = opts.device_plugin
    return tuple(dict.fromkeys(d for d in (plugin.cdi_spec_dir, plugin.cdi_static_dir) if d))


def toolkit_problem(opts: RunOptions, allocate: AllocateOptions) -> str | None:
    """Under a cdi-* strategy: why the NVIDIA Container Toolkit's spec is not found."""
    if not opts.device_plugin.cdi_spec_dir or not uses_cdi(allocate):
        return None
    from gpuslice.adapters.cdi_file import find_toolkit_devices

    return find_toolkit_devices(toolkit_dirs(opts)).problem
