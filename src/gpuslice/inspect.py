"""`gpuslice inspect`: what a config advertises on some hardware, without a kubelet."""

from __future__ import annotations

from typing import Any

from gpuslice.core.resources import build_resources
from gpuslice.wiring import RunOptions, effective_config, open_backend, settings


def inspect_node(opts: RunOptions) -> dict[str, Any]:
    """One JSON-able report; `resources` maps each advertised name to its device count."""
    cfg = settings(opts)
    backend = open_backend(opts)
    try:
        snapshot = backend.snapshot()
    finally:
        backend.close()
    resources = build_resources(snapshot, cfg.resources)
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
        "config": effective_config(opts).source or "(defaults)",
        "warnings": list(cfg.warnings),
    }


def render_table(report: dict[str, Any]) -> str:
    rows = [("RESOURCE", "DEVICES", "BACKED BY", "SHARING", "SOCKET")]
    rows += [
        (d["name"], str(d["devices"]), str(d["physical"]), d["sharing"], d["socket"])
        for d in report["details"]
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if not report["details"]:
        lines.append("(nothing advertised)")
    lines += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)
