"""`gpuslice inspect`: what a config advertises on some hardware, without a kubelet: the
resources, the labels the agent publishes and the memory limit each share carries, each
computed by the agent's own code."""

from __future__ import annotations

import platform
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuslice.config.options import RunOptions
from gpuslice.config.settings import load_config
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.dra.devices import DraOptions, build_devices, dra_settings
from gpuslice.core.dra.partitions import owned, partition_node
from gpuslice.core.dra.slices import build_slices, published
from gpuslice.core.front_ends import dra_resources
from gpuslice.core.isolation import (
    Limit,
    detect,
    device_limit,
    limited_gpus,
    missing_line,
    mps_gpus,
    node_mode,
)
from gpuslice.core.isolation import labels as isolation_labels
from gpuslice.core.labels import label_node
from gpuslice.core.mig import MigProfileSpec
from gpuslice.core.resources import (
    AdvertisedDevice,
    Resource,
    build_resources,
    unmatched_rule_warnings,
)
from gpuslice.core.serving import plan_serving
from gpuslice.core.sharing import ResourceSettings
from gpuslice.wiring.agent import toolkit_problem
from gpuslice.wiring.host import host, plugin_settings
from gpuslice.wiring.node import isolation_facts, pod_cgroups

# A device's limit per share, as the isolation service sets it (None: unlimited).
ShareLimit = Callable[[AdvertisedDevice, str], Limit | None]


def inspect_node(opts: RunOptions) -> dict[str, Any]:
    """One JSON-able report; `resources` maps each advertised name to its device count,
    `gpus` lists each GPU with the resources serving it (`servedAs`, with the memory limit
    each share carries), `labels` each node label the agent publishes (without the
    timestamp) to its value, `memoryIsolation` the node's mode and where the pods' cgroups
    are (or why none is found). With --dra, `frontEnds` names the
    front-end serving each resource and `resourceSlices` holds the ResourceSlices this
    node would publish, as they are sent to the API server."""
    host_now = host(opts)
    loaded = load_config(opts)
    cfg = plugin_settings(loaded, opts, host_now)
    cgroups = pod_cgroups(opts, host_now)
    backend = host_now.open_backend()
    try:
        snapshot = backend.snapshot()
        facts = isolation_facts(cgroups, backend)
        control = backend.mig_control() if opts.dra.enabled and opts.dra.dynamic_mig else None
        tables = {}  # --dra-dynamic-mig: the MIG profile tables of the partitions
        if control is not None:
            tables = {g.uuid: control.profiles(g.uuid) for g in snapshot.gpus if g.mig_capable}
    finally:
        backend.close()
    pinned = opts.mps.pinned_memory_limit_mib
    resources = tuple(build_resources(snapshot, cfg.resources))
    # the agent's own planning: refuses (ConfigError, HardwareError) what `run` refuses
    plan_serving(snapshot, resources, cfg.memory, cfg.allocate.mps_root, pinned_limit_mib=pinned)
    modes = detect(snapshot, facts, mps_gpus(resources))
    isolation = {g.uuid: g for g in modes}
    cgroups.watched()  # searches for the kubepods cgroups
    kubepods, pods_missing = cgroups.kubepods(), cgroups.missing()
    limited = limited_gpus(modes, cfg.memory, pods_missing)

    def share_limit(device: AdvertisedDevice, resource: str) -> Limit | None:
        return device_limit(device, resource, cfg.memory) if device.gpu_uuid in limited else None

    machine = host_now.machine_type(cfg.labels.machine_type_file)
    slicer = host_now.time_slicer()
    # the agent's labeller adds the isolation service's labels when --memory-isolation
    more = isolation_labels(modes) if opts.isolation.enabled else None
    labelled = label_node(snapshot, cfg.resources, machine=machine, more=more)
    report: dict[str, Any] = {
        "resources": {r.name: len(r.devices) for r in resources},
        "details": [
            {
                "name": r.name,
                "socket": r.socket_name,
                "devices": len(r.devices),
                "physical": len({d.physical_id for d in r.devices}),
                "sharing": r.sharing,
                "failRequestsGreaterThanOne": r.fail_requests_greater_than_one,
            }
            for r in resources
        ],
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "uuid": g.uuid,
                "memoryMiB": g.memory_mib,
                "migEnabled": g.mig_enabled,
                **({"timeSlice": ts} if (ts := slicer.time_slice(g.uuid)) else {}),
                "migDevices": len(g.mig_devices),
                "servedAs": served_as(g.uuid, resources, share_limit),
                "memoryIsolation": {
                    "mode": isolation[g.uuid].mode,
                    "missing": isolation[g.uuid].missing,
                    "enabled": cfg.memory.enabled,
                },
            }
            for g in sorted(snapshot.gpus, key=lambda g: g.index)
        ],
        "labels": labelled.labels,
        "memoryIsolation": {
            "enabled": cfg.memory.enabled,
            "mode": node_mode(modes),
            "missing": missing_line(modes),
            "kubepods": list(kubepods),
            "podCgroups": pods_missing,
            "cgroups": cgroups.where(),
        },
        "config": loaded.source or "(defaults)",
        "warnings": [
            *cfg.warnings,
            *filter(None, [toolkit_problem(opts, cfg.allocate)]),
            *unmatched_rule_warnings(snapshot.gpus, cfg.resources),
            *labelled.warnings,
        ],
    }
    if (dra := opts.dra.served) is not None:
        report.update(dra_report(snapshot, resources, cfg.resources, dra, opts, tables))
    return report


def dra_report(
    snapshot: HardwareSnapshot,
    resources: Sequence[Resource],
    settings: ResourceSettings,
    dra: DraOptions,
    opts: RunOptions,
    tables: Mapping[str, Sequence[MigProfileSpec]],
) -> dict[str, Any]:
    """Which front-end serves each resource, and the slices of the DRA devices (DRA's
    own resources: MIG devices of MIG-enabled GPUs unless --dra-mig-devices=false; with
    --dra-dynamic-mig the partitions of the GPUs it partitions, from their `tables`)."""
    own = build_resources(snapshot, dra_settings(settings, dra))
    served = dra_resources(own, opts.dra.device_plugin_resources)
    kept = opts.dra.device_plugin_resources
    gpus = owned(snapshot, [r for r in own if r.name in kept])
    parts = partition_node(snapshot, gpus, tables, settings, kept)
    devices = parts.served(build_devices(snapshot, served))
    entries, counters = parts.publish(published(devices, frozenset(), dra))
    node = opts.api.node_name or platform.node()
    return {
        "frontEnds": {
            **{r.name: "device-plugin" for r in resources if r.name in kept},
            **{r.name: "dra" for r in served},
        },
        **({"dynamicMigGpus": sorted(parts.gpus)} if dra.dynamic_mig else {}),
        "resourceSlices": build_slices(
            entries, node=node, opts=dra, generation=1, counter_sets=counters
        ),
    }


def served_as(
    gpu_uuid: str, resources: Sequence[Resource], share_limit: ShareLimit
) -> list[dict[str, Any]]:
    """Each device of the GPU that is advertised (the GPU itself, or its MIG devices),
    with the resource serving it and how: whole, or as `replicas` shares, and the memory
    limit each share carries (`hardLimitBytes`, `softLimitBytes`; null: none)."""
    out: dict[str, dict[str, Any]] = {}
    for res in resources:
        for d in res.devices:
            if d.gpu_uuid == gpu_uuid and d.physical_id not in out:
                limit = share_limit(d, res.name)
                out[d.physical_id] = {
                    "resource": res.name,
                    "device": d.physical_id,
                    "index": d.index,
                    "mig": d.is_mig,
                    "replicas": d.replicas,
                    "hardLimitBytes": None if limit is None else limit.hard,
                    "softLimitBytes": None if limit is None or not limit.soft else limit.soft,
                }
    return sorted(out.values(), key=lambda s: [int(p) for p in s["index"].split(":")])


def render_table(report: dict[str, Any]) -> str:
    rows = [("RESOURCE", "DEVICES", "BACKED BY", "SHARING", "SOCKET")]
    rows += [
        (d["name"], str(d["devices"]), str(d["physical"]), d["sharing"], d["socket"])
        for d in report["details"]
    ]
    # Warnings first: a rule that matches no device matters more than the tables.
    lines = [f"warning: {w}" for w in report["warnings"]]
    lines += _columns(rows)
    if not report["details"]:
        lines.append("(nothing advertised)")
    if report["gpus"]:
        gpu_rows = [("GPU", "MODEL", "MEMORY ISOLATION", "SERVED AS")]
        gpu_rows += [
            (
                str(g["index"]),
                g["name"],
                g["memoryIsolation"]["mode"],
                ", ".join(map(_how, g["servedAs"])) or "(not served)",
            )
            for g in report["gpus"]
        ]
        lines += ["", *_columns(gpu_rows)]
        missing = sorted({g["memoryIsolation"]["missing"] for g in report["gpus"]} - {""})
        if report["memoryIsolation"]["enabled"]:  # no pod found: nothing would be limited
            missing += filter(None, [report["memoryIsolation"]["podCgroups"]])
        lines.append(f"memory isolation facts: {report['memoryIsolation']['cgroups']}")
        lines += [f"memory isolation: {line}" for line in missing]
    if report["labels"]:
        lines += ["", *_columns([("LABEL", "VALUE"), *sorted(report["labels"].items())])]
    if "resourceSlices" in report:
        slices = report["resourceSlices"]
        names = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
        sets = [c["name"] for s in slices for c in s["spec"].get("sharedCounters", [])]
        driver = slices[0]["spec"]["driver"]
        lines += ["", f"DRA: driver {driver}, {len(names)} devices in {len(slices)} ResourceSlices"]
        lines += [f"  {name}" for name in names]
        if "dynamicMigGpus" in report:
            lines.append(f"partitioned GPUs: {', '.join(report['dynamicMigGpus']) or 'none'}")
            lines += [f"  counter set {name}" for name in sets]
        lines += [f"front-end of {r}: {fe}" for r, fe in sorted(report["frontEnds"].items())]
    return "\n".join(lines)


def _how(served: dict[str, Any]) -> str:
    """ "nvidia.com/gpu.shared (4 replicas, 3840 MiB limit each)",
    "nvidia.com/mig-1g.5gb (MIG 0:1, whole)"."""
    how = "whole" if served["replicas"] == 1 else f"{served['replicas']} replicas"
    if served["hardLimitBytes"] is not None:
        each = "" if served["replicas"] == 1 else " each"
        how += f", {_size(served['hardLimitBytes'])} limit{each}"
    if served["mig"]:
        how = f"MIG {served['index']}, {how}"
    return f"{served['resource']} ({how})"


def _size(n: int) -> str:
    """Bytes as MiB, exact when whole ("3840 MiB"), else bytes ("1000000 B")."""
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n} B"


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
