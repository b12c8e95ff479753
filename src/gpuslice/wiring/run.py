"""`gpuslice run`: the node with its probe and metrics servers, once the device-plugin
directory is this agent's."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import shutil
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuslice.adapters.deviceplugin.dirlock import Holder, claim, directory_present
from gpuslice.adapters.deviceplugin.handover import DirClaim
from gpuslice.config.options import RunOptions
from gpuslice.core.errors import BackendError
from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import ClaimDir
from gpuslice.services.node import Node
from gpuslice.services.node_metrics import node_state
from gpuslice.wiring.agent import CHECKPOINT, parts
from gpuslice.wiring.node import accounting, build_node, node_api

if TYPE_CHECKING:
    from gpuslice.adapters.kube import KubeNodeApi
    from gpuslice.adapters.metrics import PrometheusMetrics
    from gpuslice.adapters.podresources import PodResourcesClient
    from gpuslice.adapters.status_http import Authorize, StatusServer


def lock_holder(opts: RunOptions) -> Holder:
    """Who this agent is, for another agent waiting on the device-plugin directory."""
    return Holder(
        os.getpid(),
        opts.api.pod_name,
        opts.api.node_name,
        socket.gethostname(),
        token=secrets.token_hex(8),
    )


async def run_node(opts: RunOptions, stop: asyncio.Event, reload: asyncio.Event) -> None:
    """`gpuslice run`: the whole agent until `stop`, with the probe endpoint if asked.
    It serves once the device-plugin directory exists and no other agent holds it."""
    own_dir = opts.kubelet.own_plugin_dir  # not registering: nothing of the kubelet's is used
    if own_dir:
        os.mkdir(opts.kubelet.plugin_dir, 0o700)
    api = node_api(opts)
    try:
        address, metrics_address = opts.status.address, opts.status.metrics_address
        metrics = prometheus_metrics(opts) if address or metrics_address else None
        chosen = parts(opts, metrics or NO_METRICS)
        pods = pod_resources(opts)
        sampling = (
            None
            if pods is None
            else accounting(opts, chosen.host, api, metrics or NO_METRICS, pods)
        )
        if not own_dir:  # the node's directory: one agent at a time
            claim_dir: ClaimDir = lambda stop, waiting: _claim(opts, stop, waiting)  # noqa: E731
            chosen = dataclasses.replace(chosen, claim_dir=claim_dir)
        node = build_node(opts, api, metrics or NO_METRICS, chosen, accounting=sampling)
        async with contextlib.AsyncExitStack() as stack:
            if pods is not None:
                stack.push_async_callback(pods.aclose)
            if metrics is not None:
                _watch_node(metrics, node)
            for server in _http_servers(opts, api, node, metrics):
                await stack.enter_async_context(server)
            if not own_dir and not await directory_present(opts.kubelet.plugin_dir, stop):
                return  # stopped while waiting for the directory
            await node.run(stop, reload)
    finally:
        if api is not None:
            await api.aclose()
        if own_dir:
            shutil.rmtree(opts.kubelet.plugin_dir, ignore_errors=True)


def _http_servers(
    opts: RunOptions, api: KubeNodeApi | None, node: Node, metrics: PrometheusMetrics | None
) -> list[StatusServer]:
    """The probes on the status address (and its socket), with /metrics there too unless it
    has its own address; /metrics behind the API's token check with --metrics-auth."""
    from gpuslice.adapters.status_http import METRICS_NAME, SharedRender, StatusServer

    address, metrics_address = opts.status.address, opts.status.metrics_address
    page = None if metrics is None else SharedRender(metrics.page, metrics.prepare)
    authorize = metrics_auth(opts, api) if page is not None else None
    servers = []
    if address:
        servers.append(StatusServer(address, node.readiness, None if metrics_address else page,
                                    authorize=authorize, unix_path=opts.status.socket))  # fmt: skip
    if metrics_address:
        servers.append(
            StatusServer(metrics_address, None, page, name=METRICS_NAME, authorize=authorize)
        )
    return servers


def metrics_auth(opts: RunOptions, api: KubeNodeApi | None) -> Authorize | None:
    """The bearer-token check of /metrics (--metrics-auth kubernetes), over the node's API."""
    if opts.status.metrics_auth != "kubernetes":
        return None
    if api is None:
        raise BackendError(
            "--metrics-auth (GPUSLICE_METRICS_AUTH) kubernetes needs the Kubernetes API: "
            "set --node-name (NODE_NAME) and run in a cluster or give --kubeconfig"
        )
    return api.metrics_auth().verdict


async def _claim(
    opts: RunOptions, stop: asyncio.Event, waiting: Callable[[str], None]
) -> DirClaim | None:
    """The device-plugin directory, once no other agent holds it."""
    lock = await claim(opts.kubelet.plugin_dir, lock_holder(opts), stop, waiting)
    return None if lock is None else DirClaim(lock, opts.kubelet.socket)


def prometheus_metrics(opts: RunOptions) -> PrometheusMetrics:
    """The Prometheus adapter, imported only for an agent serving /metrics."""
    from gpuslice.adapters.metrics import PrometheusMetrics

    return PrometheusMetrics(hostname=opts.api.node_name or socket.gethostname())


def _watch_node(metrics: PrometheusMetrics, node: Node) -> None:
    """Series read from the node at each scrape: each front-end's resources, the GPUs,
    the config, isolation, accounting."""
    from gpuslice.adapters.metrics import NodeSummaryCollector

    front_ends = node.agent.front_ends
    served = lambda: [s for f in front_ends for s in f.resource_states()]  # noqa: E731
    metrics.add(NodeSummaryCollector(lambda: node_state(node, served), hostname=metrics.hostname))
    if node.isolation is not None:
        from gpuslice.adapters.metrics import IsolationCollector

        metrics.add(IsolationCollector(node.isolation.view, hostname=metrics.hostname))
    sampler, watchdog = node.sampler, node.watchdog
    if sampler is not None:
        from gpuslice.adapters.metrics import AccountingCollector, BudgetCollector

        metrics.add(AccountingCollector(lambda: sampler.latest, hostname=metrics.hostname))
        if watchdog is not None:
            metrics.add(BudgetCollector(lambda: watchdog.latest, hostname=metrics.hostname))


def pod_resources(opts: RunOptions) -> PodResourcesClient | None:
    """The kubelet's PodResources API and device checkpoint (None: accounting is off).
    Nothing connects until the first sample, and none while no kubelet is there: a missing
    socket fails samples, not the agent."""
    if not opts.accounting.enabled:
        return None
    from gpuslice.adapters.podresources import PodResourcesClient

    checkpoint = os.path.join(opts.kubelet.plugin_dir, CHECKPOINT)
    return PodResourcesClient(
        opts.kubelet.pod_resources_socket, checkpoint, kubelet_socket=opts.kubelet.socket
    )
