"""The CDI specs (cdi.k8s.io, JSON) that make every CDI name Allocate returns resolvable.

Under a `cdi-*` device-list strategy Allocate answers with fully qualified names
(container_spec): `<cdi_kind>=<id>` per visible device, `<vendor>/imex-channel=<n>`
per IMEX channel and `<vendor>/{gdrcopy,gds,mofed}=all` when enabled. A CDI file holds
one kind, so each kind gets its own spec, named `<vendor>-<class>.json` as upstream
names its specs. A GPU device injects its /dev/nvidiaN node, a MIG device its parent's
node plus its GI and CI capability nodes; the common edits inject the driver's control
nodes and NVIDIA_VISIBLE_DEVICES=void (no second injection by a legacy hook).

Health does not enter here: an unhealthy device stays in the spec, since a container of
a running pod that holds it may restart and must still resolve its name. A spec with no
devices is not emitted. cdiVersion is the lowest that allows what a spec uses.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Mapping, Sequence

from gpuslice.core.container_spec import CDI_VENDOR, IMEX_CHANNEL_DEV, visible_ids
from gpuslice.core.resources import Resource
from gpuslice.core.response import CDI_ANNOTATIONS, CDI_CRI, AllocateOptions

CONTROL_NODE = "/dev/nvidiactl"  # always present where a GPU is usable
# Device nodes of the `=all` extras, as globs (the adapter resolves them on the node).
EXTRA_NODES: Mapping[str, tuple[str, ...]] = {
    "gdrcopy": ("/dev/gdrdrv",),
    "gds": ("/dev/nvidia-fs*",),
    "mofed": ("/dev/infiniband/*",),
}
_BASE_VERSION = "0.3.0"
_V050 = "0.5.0"  # device names not starting with a letter; deviceNodes[].hostPath
VOID = ("NVIDIA_VISIBLE_DEVICES=void",)

Json = dict[str, object]


def uses_cdi(opts: AllocateOptions) -> bool:
    return bool({CDI_ANNOTATIONS, CDI_CRI} & set(opts.list_strategies))


def spec_file_name(kind: str) -> str:
    """k8s.device-plugin.nvidia.com/gpu -> k8s.device-plugin.nvidia.com-gpu.json"""
    return kind.replace("/", "-") + ".json"


def build_specs(
    resources: Iterable[Resource],
    opts: AllocateOptions,
    *,
    control_devices: Sequence[str] = (),
    extra_nodes: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, str]:
    """File name -> JSON text of every spec the options ask for (none without a CDI
    strategy). `control_devices` and `extra_nodes` (extra -> device nodes) are what
    exists on this node."""
    if not uses_cdi(opts):
        return {}
    nodes: dict[str, list[str]] = {}
    for resource in resources:
        for device in resource.devices:
            (name,) = visible_ids([device], opts.id_strategy)
            paths = nodes.setdefault(name, [])
            paths += [p for p in device.paths if p not in paths]
    root = opts.dev_root
    common = _edits(dict.fromkeys((CONTROL_NODE, *control_devices)), root, VOID)
    channels = {str(c): [IMEX_CHANNEL_DEV.format(c)] for c in opts.imex_channel_ids}
    specs = [
        _spec(opts.cdi_kind, {n: _edits(p, root) for n, p in nodes.items()}, common),
        _spec(f"{CDI_VENDOR}/imex-channel", {n: _edits(p, root) for n, p in channels.items()}),
    ]
    found = extra_nodes or {}
    for extra in _extras(opts):
        # The env var keeps the edits non-empty where the node has none of the devices.
        edits = _edits(found.get(extra, ()), root, (f"NVIDIA_{extra.upper()}=enabled",))
        specs.append(_spec(f"{CDI_VENDOR}/{extra}", {"all": edits}))
    return {spec_file_name(str(s["kind"])): render(s) for s in specs if s["devices"]}


def render(spec: Json) -> str:
    return json.dumps(spec, indent=2) + "\n"


def qualified_names(spec: Mapping[str, object]) -> set[str]:
    """The fully qualified device names (`kind=name`) a parsed spec resolves."""
    devices = spec.get("devices")
    assert isinstance(devices, list)
    return {f"{spec['kind']}={d['name']}" for d in devices}


def _extras(opts: AllocateOptions) -> list[str]:
    flags = (("gdrcopy", opts.gdrcopy_enabled), ("gds", opts.gds_enabled))
    return [name for name, on in (*flags, ("mofed", opts.mofed_enabled)) if on]


def _spec(kind: str, devices: Mapping[str, Json], common: Json | None = None) -> Json:
    spec: Json = {"cdiVersion": _version(devices, common), "kind": kind}
    spec["devices"] = [{"name": name, "containerEdits": e} for name, e in devices.items()]
    if common:
        spec["containerEdits"] = common
    return spec


def _version(devices: Mapping[str, Json], common: Json | None) -> str:
    named = any(not name[:1].isalpha() for name in devices)
    edits = [*devices.values(), common or {}]
    host_paths = any("hostPath" in n for e in edits for n in _nodes(e))
    return _V050 if named or host_paths else _BASE_VERSION


def _nodes(edits: Json) -> list[Json]:
    nodes = edits.get("deviceNodes", [])
    assert isinstance(nodes, list)
    return nodes


def _edits(paths: Iterable[str], dev_root: str, env: Sequence[str] = ()) -> Json:
    edits: Json = {}
    if env:
        edits["env"] = list(env)
    nodes = [_node(p, dev_root) for p in paths]
    if nodes:
        edits["deviceNodes"] = nodes
    return edits


def _node(path: str, dev_root: str) -> Json:
    node: Json = {"path": path}
    if dev_root.rstrip("/"):
        node["hostPath"] = posixpath.join(dev_root, path.lstrip("/"))
    return node
