"""The kubelet's DRA side, standing in for tests and demos: its plugin watcher on
plugins_registry, the DRA v1 client it prepares and unprepares claims with, the
DRAResourceHealth stream it follows, and a container runtime's CDI lookup. Test and
demo code, never a replacement for the kubelet.

Over real unix sockets, as the kubelet does: `discover` finds a registration socket,
asks GetInfo, checks the answer (type DRAPlugin, an absolute endpoint, a DRA service it
speaks, first listed first), reports NotifyRegistrationStatus, and dials the endpoint.
`prepare` and `unprepare` call the service chosen, with the kubelet's 45 s timeout, and
check that every claim asked for has an entry. `restart` drops every connection (and
with wipe=True deletes the sockets, as a wiped directory does) and, given the cluster's
slices, deletes every ResourceSlice of its node, as a starting kubelet does, before the
plugin is discovered again. `resolve_cdi` looks the returned CDI IDs up in the CDI spec directory
as containerd does, failing for a name no spec there defines.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from gpuslice.adapters.deviceplugin.api import unix_target
from gpuslice.adapters.kubelet._proto.dra.v1 import api_pb2 as v1
from gpuslice.adapters.kubelet._proto.dra.v1 import api_pb2_grpc as v1_grpc
from gpuslice.adapters.kubelet._proto.dra.v1beta1 import api_pb2 as v1beta1
from gpuslice.adapters.kubelet._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from gpuslice.adapters.kubelet._proto.drahealth.v1alpha1 import api_pb2 as hpb
from gpuslice.adapters.kubelet._proto.drahealth.v1alpha1 import api_pb2_grpc as hpb_grpc
from gpuslice.adapters.kubelet._proto.pluginregistration.v1 import api_pb2 as reg
from gpuslice.adapters.kubelet._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from gpuslice.config.yaml_text import load_yaml
from gpuslice.testing.kubelet.records import StandinError

CALL_TIMEOUT_S = 45.0  # the kubelet's per-call timeout for DRA plugins
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
_SERVICES: dict[str, tuple[Any, Any]] = {
    "v1.DRAPlugin": (v1, v1_grpc.DRAPluginStub),
    "v1beta1.DRAPlugin": (v1beta1, v1beta1_grpc.DRAPluginStub),
}


@dataclass
class DraPlugin:
    """A registered DRA plugin as the kubelet keeps it."""

    driver: str
    endpoint: str
    service: str  # the DRA service chosen: "v1.DRAPlugin" or "v1beta1.DRAPlugin"
    health: bool  # it offers DRAResourceHealth
    registration_socket: str
    channel: grpc.aio.Channel = field(repr=False)
    stub: Any = field(repr=False)


@dataclass(frozen=True)
class PreparedReply:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None


@dataclass(frozen=True)
class ClaimResult:
    devices: tuple[PreparedReply, ...] = ()
    error: str = ""


class NodeSlices(Protocol):
    """The cluster's ResourceSlices as a starting kubelet changes them (the API server
    stand-in's `dra`)."""

    def delete_node_slices(self, node: str) -> list[str]: ...


class DraKubeletStandin:
    """The kubelet's DRA manager over `registry_dir` (its plugins_registry), of node
    `node` whose slices are in `slices`."""

    def __init__(
        self,
        registry_dir: str,
        cdi_dir: str | None = None,
        *,
        slices: NodeSlices | None = None,
        node: str = "",
    ) -> None:
        self.registry_dir = registry_dir
        self.cdi_dir = cdi_dir
        self._slices = slices
        self.node = node
        self.slices_deleted: list[str] = []  # by restarts, as a starting kubelet does
        self.plugins: dict[str, DraPlugin] = {}
        self.refused: list[tuple[str, str]] = []  # (socket, why) of registrations refused
        self.health: dict[str, dict[tuple[str, str], tuple[int, str]]] = {}
        self.health_updates = 0
        self._health_tasks: dict[str, asyncio.Task[None]] = {}
        self._cond = asyncio.Condition()

    async def __aenter__(self) -> DraKubeletStandin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # registration

    async def discover(self, driver: str, timeout_s: float = 30.0) -> DraPlugin:
        """Wait for `driver`'s registration socket, register the plugin, dial it."""
        path = os.path.join(self.registry_dir, f"{driver}-reg.sock")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return await self._register(path)
            except StandinError:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.02)

    async def _register(self, path: str) -> DraPlugin:
        if not await asyncio.to_thread(os.path.exists, path):
            raise StandinError(f"no registration socket at {path}")
        async with grpc.aio.insecure_channel(unix_target(path)) as channel:
            stub = reg_grpc.RegistrationStub(channel)
            try:
                info = await stub.GetInfo(reg.InfoRequest(), timeout=5.0)
            except grpc.aio.AioRpcError as exc:
                raise StandinError(f"GetInfo on {path}: {exc.code().name}") from None
            problem = _problem(info)
            await stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=not problem, error=problem), timeout=5.0
            )
        if problem:
            self.refused.append((path, problem))
            raise StandinError(problem)
        await self._drop(info.name)
        service = next(v for v in info.supported_versions if v in _SERVICES)
        stub_type = _SERVICES[service][1]
        dial = grpc.aio.insecure_channel(unix_target(info.endpoint))
        plugin = DraPlugin(
            driver=info.name,
            endpoint=info.endpoint,
            service=service,
            health=HEALTH_SERVICE in info.supported_versions,
            registration_socket=path,
            channel=dial,
            stub=stub_type(dial),
        )
        self.plugins[info.name] = plugin
        if plugin.health:
            self._health_tasks[info.name] = asyncio.create_task(self._watch_health(plugin))
        return plugin

    async def restart(self, *, wipe: bool = False) -> None:
        """A kubelet restart: every connection and stream dropped; with `wipe`, every
        socket in plugins_registry deleted too; then, as the kubelet starts, every
        ResourceSlice of its node deleted. Plugins are found again by discover()."""
        await self._drop_all()
        if wipe:
            for path in glob.glob(os.path.join(self.registry_dir, "*.sock")):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        if self._slices is not None:
            self.slices_deleted += self._slices.delete_node_slices(self.node)

    async def _drop_all(self) -> None:
        for driver in list(self.plugins):
            await self._drop(driver)

    async def close(self) -> None:
        await self._drop_all()

    async def _drop(self, driver: str) -> None:
        plugin = self.plugins.pop(driver, None)
        task = self._health_tasks.pop(driver, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if plugin is not None:
            await plugin.channel.close()

    # calls

    async def prepare(
        self, driver: str, claims: Sequence[tuple[str, str, str]]
    ) -> dict[str, ClaimResult]:
        """NodePrepareResources for (namespace, uid, name) claims; uid -> result."""
        plugin = self._plugin(driver)
        module = _SERVICES[plugin.service][0]
        request = module.NodePrepareResourcesRequest(claims=_claims(module, claims))
        resp = await self._call(plugin, "NodePrepareResources", request)
        out = {}
        for _, uid, _ in claims:
            if uid not in resp.claims:
                raise StandinError(f"NodePrepareResources: no entry for claim {uid}")
            entry = resp.claims[uid]
            devices = tuple(
                PreparedReply(
                    tuple(d.request_names),
                    d.pool_name,
                    d.device_name,
                    tuple(d.cdi_device_ids),
                    d.share_id if d.HasField("share_id") else None,
                )
                for d in entry.devices
            )
            out[uid] = ClaimResult(devices, entry.error)
        return out

    async def unprepare(
        self, driver: str, claims: Sequence[tuple[str, str, str]]
    ) -> dict[str, str]:
        """NodeUnprepareResources; uid -> error ("" when done)."""
        plugin = self._plugin(driver)
        module = _SERVICES[plugin.service][0]
        request = module.NodeUnprepareResourcesRequest(claims=_claims(module, claims))
        resp = await self._call(plugin, "NodeUnprepareResources", request)
        missing = [uid for _, uid, _ in claims if uid not in resp.claims]
        if missing:
            raise StandinError(f"NodeUnprepareResources: no entry for claims {missing}")
        return {uid: resp.claims[uid].error for _, uid, _ in claims}

    async def _call(self, plugin: DraPlugin, method: str, request: Any) -> Any:
        try:
            return await getattr(plugin.stub, method)(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise StandinError(f"{method}: {exc.code().name}: {exc.details()}") from None

    def _plugin(self, driver: str) -> DraPlugin:
        plugin = self.plugins.get(driver)
        if plugin is None:
            raise StandinError(f"DRA driver {driver} is not registered")
        return plugin

    # health

    async def _watch_health(self, plugin: DraPlugin) -> None:
        stub = hpb_grpc.DRAResourceHealthStub(plugin.channel)
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for msg in stub.NodeWatchResources(hpb.NodeWatchResourcesRequest()):
                latest = {
                    (d.device.pool_name, d.device.device_name): (int(d.health), d.message)
                    for d in msg.devices
                }
                async with self._cond:
                    self.health[plugin.driver] = latest
                    self.health_updates += 1
                    self._cond.notify_all()

    async def wait_health(
        self, driver: str, predicate: Callable[[dict[tuple[str, str], tuple[int, str]]], bool]
    ) -> dict[tuple[str, str], tuple[int, str]]:
        """Wait until the latest complete list of `driver` satisfies `predicate`."""
        async with asyncio.timeout(5.0), self._cond:
            await self._cond.wait_for(lambda: predicate(self.health.get(driver, {})))
        return self.health[driver]

    # the runtime's CDI lookup

    def resolve_cdi(self, ids: Sequence[str]) -> dict[str, Any]:
        """The container edits `ids` give, merged as a runtime merges them: each ID must
        name a device of a spec in the CDI directory (kind=name)."""
        if self.cdi_dir is None:
            raise StandinError("no CDI directory to resolve in")
        found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # kind=name -> device, spec
        paths = (glob.glob(os.path.join(self.cdi_dir, f"*.{ext}")) for ext in ("json", "yaml"))
        for path in sorted(p for found_here in paths for p in found_here):
            with open(path, encoding="utf-8") as f:
                spec: Any = load_yaml(f.read())  # JSON is YAML too
            for device in spec.get("devices", []):
                name = f"{spec['kind']}={device['name']}"
                if name in found:  # as the CDI registry: a name two specs define is a conflict
                    raise StandinError(f"CDI device {name} is defined twice in {self.cdi_dir}")
                found[name] = (device, spec)
        env: list[str] = []
        nodes: list[str] = []
        mounts: list[dict[str, Any]] = []
        for cdi_id in ids:
            if cdi_id not in found:
                raise StandinError(f"CDI device {cdi_id} is not in any spec in {self.cdi_dir}")
            device, spec = found[cdi_id]
            for edits in (device["containerEdits"], spec.get("containerEdits", {})):
                env += [e for e in edits.get("env", []) if e not in env]
                nodes += [n["path"] for n in edits.get("deviceNodes", []) if n["path"] not in nodes]
                mounts += [m for m in edits.get("mounts", []) if m not in mounts]
        return {"env": env, "deviceNodes": nodes, "mounts": mounts}


def _problem(info: reg.PluginInfo) -> str:
    if info.type != "DRAPlugin":
        return f"plugin type {info.type!r} is not DRAPlugin"
    if not info.name:
        return "the plugin has no name"
    if not os.path.isabs(info.endpoint):
        return f"endpoint {info.endpoint!r} is not an absolute path"
    if not any(v in _SERVICES for v in info.supported_versions):
        return f"none of {list(info.supported_versions)} is a DRA service this kubelet speaks"
    return ""


def _claims(module: Any, claims: Sequence[tuple[str, str, str]]) -> list[Any]:
    return [module.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
