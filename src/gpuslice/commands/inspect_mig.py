"""`gpuslice inspect --mig-parted-config F --mig-config NAME`: what a mig-parted layout
would do on some hardware, without changing it: per GPU the GPU instances it would
destroy and create (profile and placement), those it keeps, the MIG mode change, the
processes a change would wait for, and the resources the device plugin would then
advertise, each computed by the agent's own code. The GPUs are only read."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuslice.commands.inspect import served_as
from gpuslice.config.mig_parted import load_mig_parted_file
from gpuslice.config.options import RunOptions
from gpuslice.config.settings import load_config
from gpuslice.core.devices import Gpu
from gpuslice.core.errors import ConfigError
from gpuslice.core.mig import GpuInstance, Placement
from gpuslice.core.mig_layout import Create, Destroy, GpuPlan, MigGpu, SetMode, plan_layout
from gpuslice.core.mig_preview import gpu_after
from gpuslice.core.resources import build_resources
from gpuslice.core.serving import plan_serving
from gpuslice.wiring.host import host, plugin_settings


def inspect_mig(opts: RunOptions, path: str, name: str) -> dict[str, Any]:
    """One JSON-able report. ConfigError (one line) for a bad file, an unknown config
    name, a profile a GPU does not have or a layout that does not fit; what `run` would
    refuse of the resulting devices too."""
    entries = load_mig_parted_file(path).entries(name)
    machine = host(opts)
    cfg = plugin_settings(load_config(opts), opts, machine)
    backend = machine.open_backend()
    try:
        snapshot = backend.snapshot()
        mig = backend.mig_control()
        if mig is None and any(g.mig_capable for g in snapshot.gpus):
            raise ConfigError("this GPU backend cannot read MIG profiles")
        holders = {
            d.uuid: tuple(f"pid {p.pid}" for p in d.processes)
            for g in backend.processes().gpus
            for d in g.devices
        }
        gpus = [
            MigGpu(
                g,
                mig.profiles(g.uuid),
                mig.instances(g.uuid) if g.mig_enabled else (),
                holders,
            )
            if mig is not None and g.mig_capable
            else MigGpu(g)
            for g in snapshot.gpus
        ]
    finally:
        backend.close()
    plans = plan_layout(entries, gpus)
    made = (gpu_after(g.gpu, p, g.profiles) for g, p in zip(gpus, plans, strict=True))
    after = replace(snapshot, gpus=tuple(made))
    resources = tuple(build_resources(after, cfg.resources))
    pinned = opts.mps.pinned_memory_limit_mib
    plan_serving(after, resources, cfg.memory, cfg.allocate.mps_root, pinned_limit_mib=pinned)
    return {
        "migParted": {"file": path, "config": name},
        "gpus": [
            _gpu(g, p, a, served_as(g.gpu.uuid, resources, lambda d, r: None))
            for g, p, a in zip(gpus, plans, after.gpus, strict=True)
        ],
        "resources": {r.name: len(r.devices) for r in resources},
    }


def _gpu(node: MigGpu, plan: GpuPlan, after: Gpu, served: list[dict[str, Any]]) -> dict[str, Any]:
    gone = {s.gi for s in plan.steps if isinstance(s, Destroy)}
    modes = [s for s in plan.steps if isinstance(s, SetMode)]
    return {
        "index": node.gpu.index,
        "name": node.gpu.name,
        "uuid": node.gpu.uuid,
        "named": plan.wanted is not None,  # a config entry names the GPU
        "migEnabled": node.gpu.mig_enabled,
        "migEnabledAfter": after.mig_enabled,
        "held": plan.held,  # the change waits for these processes to end
        "modeChangeResets": any(m.resets for m in modes),
        "destroy": [
            _instance(s.profile, s.placement, s.gi) for s in plan.steps if isinstance(s, Destroy)
        ],
        "create": [_instance(s.profile, s.placement) for s in plan.steps if isinstance(s, Create)],
        "unchanged": [_kept(i) for i in node.instances if i.gi not in gone],
        "servedAs": served,
    }


def _instance(profile: str, placement: Placement, gi: int | None = None) -> dict[str, Any]:
    found = {"profile": profile, "start": placement.start, "size": placement.size}
    return found if gi is None else {**found, "gi": gi}


def _kept(i: GpuInstance) -> dict[str, Any]:
    return {**_instance(i.profile, i.placement, i.gi), "uuid": i.uuid}


def render_mig_table(report: dict[str, Any]) -> str:
    where = report["migParted"]
    lines = [f"mig-parted config {where['config']} of {where['file']}:"]
    for g in report["gpus"]:
        lines.append(f"GPU {g['index']} ({g['name']}): {_change(g)}")
        lines += [f"  waits for: {g['held'].rsplit('in use: ', 1)[-1]}"] if g["held"] else []
        lines += [f"  destroy {_at(i)}, GPU instance {i['gi']}" for i in g["destroy"]]
        lines += [f"  create {_at(i)}" for i in g["create"]]
        lines += [f"  unchanged {_at(i)}, GPU instance {i['gi']}" for i in g["unchanged"]]
    lines += ["", "the device plugin would then advertise:"]
    rows = sorted(report["resources"].items()) or [("(nothing)", 0)]
    width = max(len(name) for name, _ in rows)
    lines += [f"  {name.ljust(width)}  {count}" for name, count in rows]
    return "\n".join(lines)


def _change(g: dict[str, Any]) -> str:
    if not g["named"]:
        return "left alone (no entry names it, or it cannot do MIG)"
    before, after = g["migEnabled"], g["migEnabledAfter"]
    if before != after:
        how = ", resetting the GPU" if g["modeChangeResets"] else ""
        return f"MIG {'on' if after else 'off'}{how}"
    if g["destroy"] or g["create"]:
        return "new layout"
    return "unchanged"


def _at(i: dict[str, Any]) -> str:
    return f"{i['profile']} at {{{i['start']},{i['size']}}}"
