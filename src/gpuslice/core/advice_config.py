"""A proposed v1 config from right-sizing advice: per GPU model, each resource's
replicas are the fewest any of its workloads' peaks allow (never more), with a comment
line above each resource saying why. One model: one config file; several: a ConfigMap
with an entry per model, for the nodes of each pool to select by label."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from gpuslice.core.advice import MIB, Advice

BASE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"


def propose_config(advice: Sequence[Advice], configmap: str = "gpuslice-advised") -> str:
    models = sorted({a.model for a in advice})
    if len(models) == 1:
        return "\n".join(_config(models[0], advice)) + "\n"
    lines = [
        "# One entry per GPU model: label each pool's nodes",
        "# nvidia.com/device-plugin.config=<entry> to select its own.",
        "apiVersion: v1",
        "kind: ConfigMap",
        "metadata:",
        f"  name: {configmap}",
        "data:",
    ]
    for model in models:
        lines.append(f"  {entry_name(model)}: |-")
        lines.extend(f"    {line}" for line in _config(model, advice))
    return "\n".join(lines) + "\n"


def entry_name(model: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", (model or "unknown-gpu").lower()).strip("-")


def _config(model: str, advice: Sequence[Advice]) -> list[str]:
    on_model = [a for a in advice if a.model == model]
    lines = [f"# Proposed for {model or 'GPUs of unknown model'} from measured peaks."]
    body: list[str] = []
    for resource in sorted({a.resource for a in on_model}):
        users = [a for a in on_model if a.resource == resource]
        measured = [a for a in users if a.replicas is not None]
        current = max((a.current_replicas or 1 for a in users), default=1)
        if not measured:
            lines.append(f"# {resource}: left out, no workload on it has a measured peak")
            continue
        # Fewest replicas first; among equals the highest peak, which sets the margin.
        tightest = min(measured, key=lambda a: (a.replicas or 0, -(a.memory_max or 0), a.workload))
        replicas = max(1, tightest.replicas or 0)
        why = (
            f"# {resource}: {current} -> {replicas} replicas"
            if replicas != current
            else f"# {resource}: {replicas} replicas, as now"
        )
        why += f"; the tightest, {tightest.namespace}/{tightest.workload}, peaks at "
        why += f"{(tightest.memory_max or 0) / MIB:,.0f} MiB"
        if replicas < 2:
            lines.append(why + ": not shared")
            continue
        body.append("    " + why)
        body.extend(_resource(resource, replicas))
    if any(r.startswith(MIG_PREFIX) for r in {a.resource for a in on_model}):
        lines += ["version: v1", "flags:", "  migStrategy: mixed"]
    else:
        lines.append("version: v1")
    if body:
        lines += ["sharing:", "  timeSlicing:", "    resources:", *body]
    return lines


def _resource(resource: str, replicas: int) -> list[str]:
    if resource == BASE or resource.startswith(MIG_PREFIX):
        return [f"    - name: {json.dumps(resource)}", f"      replicas: {replicas}"]
    return [  # a renamed resource: shared from nvidia.com/gpu under its name
        f"    - name: {BASE}",
        f"      rename: {json.dumps(resource)}",
        f"      replicas: {replicas}",
    ]
