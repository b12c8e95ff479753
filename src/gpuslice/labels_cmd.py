"""`gpuslice labels`: the node's labels without the device plugin (wiring.labels_node,
services.labels_node)."""

from __future__ import annotations

from gpuslice.wiring.commands import run_labels

__all__ = ["run_labels"]
