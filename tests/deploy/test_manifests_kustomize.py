"""The static manifests' image override is a kustomization, which can be applied again and
again: install.md's site kustomization over deploy/manifests, built by kubectl's own kustomize,
gives the manifests with only the image changed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from chart_kit import MANIFESTS, ROOT

KUBECTL = shutil.which("kubectl")
INSTALL = ROOT / "docs" / "install.md"


def site_kustomization() -> str:
    """The kustomization install.md has the reader write."""
    found = re.search(r"<<'EOF'\n(.*?)\nEOF\n", INSTALL.read_text(), re.DOTALL)
    assert found, "install.md shows no site kustomization"
    return found.group(1) + "\n"


@pytest.mark.skipif(KUBECTL is None, reason="kubectl (its built-in kustomize) is not installed")
def test_the_documented_site_kustomization_changes_the_image_and_nothing_else(
    tmp_path: Path,
) -> None:
    assert KUBECTL is not None
    site = tmp_path / "gpuslice-site"
    site.mkdir()
    base = os.path.relpath(MANIFESTS.parent, site)
    text = site_kustomization().replace("../deploy/manifests", base)
    (site / "kustomization.yaml").write_text(text)
    built = subprocess.run(
        [KUBECTL, "kustomize", str(site)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    objects = [o for o in yaml.safe_load_all(built) if o]
    manifests = [o for o in yaml.safe_load_all(MANIFESTS.read_text()) if o]
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    (agent,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert agent["image"] == "registry.example.com/gpuslice:0.1.0"
    agent["image"] = "localhost/gpuslice:0.1.0"
    key = lambda o: (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", ""))  # noqa: E731
    assert sorted(objects, key=key) == sorted(manifests, key=key)
