"""`gpuslice admission render`: the admission policy objects for a set of configs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuslice.config.convert import resource_settings
from gpuslice.config.loader import load_each
from gpuslice.config.yaml_text import dump_documents
from gpuslice.core.admission import CappedNames, admission_objects, capped_names, check_names
from gpuslice.core.errors import ConfigError


def capped_in(path: str | Path, *, name: str | None = None) -> CappedNames:
    """The capped names of every config a file, ConfigMap manifest or directory holds (only
    `name` when given). Raises the first config's error: a policy is never made from a
    partial set of configs."""
    loaded = load_each(path, name=name)
    for result in loaded:
        if isinstance(result, ConfigError):
            raise result
    return capped_names(
        resource_settings(r.config) for r in loaded if not isinstance(r, ConfigError)
    )


def render(objects: list[dict[str, Any]], output: str) -> str:
    if output == "json":
        listing = {"apiVersion": "v1", "kind": "List", "items": objects}
        return json.dumps(listing, indent=2)
    return dump_documents(objects)


def render_admission(
    path: str | Path, *, config_name: str | None, name: str, namespace: str, output: str
) -> str:
    check_names(name, namespace)  # before reading configs: a bad option is said first
    capped = capped_in(path, name=config_name)
    return render(admission_objects(capped, name=name, namespace=namespace), output)
