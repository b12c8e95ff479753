"""A kubeconfig file that points a client (the agent's, kubectl) at the stand-in."""

from __future__ import annotations

import json
from pathlib import Path

TOKEN = "t0ken"  # noqa: S105 - a placeholder bearer token; the stand-in accepts any


def write_kubeconfig(directory: Path, url: str) -> str:
    """`directory`/kubeconfig for `url`, with a bearer-token user; returns its path."""
    path = directory / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "fake", "user": {"token": TOKEN}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                "current-context": "fake",
            }
        )
    )
    return str(path)
