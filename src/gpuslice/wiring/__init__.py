"""The composition root: the one place that chooses the host (wiring.host) and builds
the nodes of `gpuslice run`, `gpuslice labels` and `gpuslice demo` from the command's
resolved options (config.options.RunOptions). It composes; it decides nothing."""

from gpuslice.adapters.hosts import MACHINE_TYPE_MAX_BYTES
from gpuslice.config.options import RunOptions, resolve_options
from gpuslice.frontends.deviceplugin import device_plugin_of
from gpuslice.services.node import Node
from gpuslice.wiring.agent import Parts, agent, parts, toolkit_problem
from gpuslice.wiring.commands import labels_node, mig_profiles, prometheus_facts, run_labels
from gpuslice.wiring.host import host, machine_type, open_backend, plugin_settings, time_slicer
from gpuslice.wiring.node import build_node, config_entries, isolation_facts, node_api
from gpuslice.wiring.run import run_node

__all__ = [
    "MACHINE_TYPE_MAX_BYTES",
    "Node",
    "Parts",
    "RunOptions",
    "agent",
    "build_node",
    "config_entries",
    "device_plugin_of",
    "host",
    "isolation_facts",
    "labels_node",
    "machine_type",
    "mig_profiles",
    "node_api",
    "open_backend",
    "parts",
    "plugin_settings",
    "prometheus_facts",
    "resolve_options",
    "run_labels",
    "run_node",
    "time_slicer",
    "toolkit_problem",
]
