"""A mounted ConfigMap directory, written as the kubelet writes it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path


def write_configmap_volume(path: str, data: Mapping[str, str]) -> None:
    """Update `path` the way the kubelet updates a mounted ConfigMap: the entries go to a
    new `..<unique>` directory, the `..data` link is swapped to it in one rename, each
    entry is a link `name -> ..data/name`, and the old directory is removed."""
    payload = tempfile.mkdtemp(prefix="..", dir=path)
    for key, text in data.items():
        Path(payload, key).write_text(text, encoding="utf-8")
    data_link = os.path.join(path, "..data")
    old = os.readlink(data_link) if os.path.islink(data_link) else None
    os.symlink(os.path.basename(payload), data_link + "_tmp")
    os.rename(data_link + "_tmp", data_link)
    for key in data:
        if not os.path.lexists(os.path.join(path, key)):
            os.symlink(os.path.join("..data", key), os.path.join(path, key))
    for name in os.listdir(path):
        if not name.startswith("..") and name not in data:
            os.unlink(os.path.join(path, name))
    if old is not None:
        shutil.rmtree(os.path.join(path, old), ignore_errors=True)
