"""`gpuslice inspect`: what a config advertises on some hardware, without a kubelet."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuslice.core.labels import label_node
from gpuslice.core.resources import build_resources, unmatched_rule_warnings
from gpuslice.wiring import (
    RunOptions,
    effective_config,
    label_flags,
    machine_type,
    open_backend,
    settings_from,
)


def inspect_node(opts: RunOptions) -> dict[str, Any]:
    """One JSON-able report; `resources` maps each advertised name to its device count,
    `labels` each node label (GFD's, without the timestamp) to its value."""
    loaded = effective_config(opts)
    cfg = settings_from(loaded, opts, plugin=True)
    backend = open_backend(opts)
    try:
        snapshot = backend.snapshot()
    finally:
        backend.close()
    resources = build_resources(snapshot, cfg.resources)
    machine_file = label_flags(opts, loaded.config).gfd.machine_type_file or ""
    labelled = label_node(snapshot, cfg.resources, machine=machine_type(opts, machine_file))
    return {
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
                "migDevices": len(g.mig_devices),
            }
            for g in snapshot.gpus
        ],
        "labels": labelled.labels,
        "config": loaded.source or "(defaults)",
        "warnings": [
            *cfg.warnings,
            *unmatched_rule_warnings(snapshot.gpus, cfg.resources),
            *labelled.warnings,
        ],
    }


def render_table(report: dict[str, Any]) -> str:
    rows = [("RESOURCE", "DEVICES", "BACKED BY", "SHARING", "SOCKET")]
    rows += [
        (d["name"], str(d["devices"]), str(d["physical"]), d["sharing"], d["socket"])
        for d in report["details"]
    ]
    lines = _columns(rows)
    if not report["details"]:
        lines.append("(nothing advertised)")
    if report["labels"]:
        lines += ["", *_columns([("LABEL", "VALUE"), *sorted(report["labels"].items())])]
    lines += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
