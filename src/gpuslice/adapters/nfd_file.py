"""Node labels as an NFD local-source feature file (features.d), GFD's file output.

The file holds `key=value` lines, sorted. It is replaced atomically (outside_files; NFD
skips the hidden temporary file), so a reader sees the old file or the new one, never a
part. An unchanged label set (ignoring the timestamp) is not rewritten.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from gpuslice.adapters.outside_files import read_text, replace_atomically
from gpuslice.core.errors import BackendError
from gpuslice.core.labels import labels_changed

DEFAULT_PATH = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
MAX_BYTES = 1 << 20  # far above any label set; a larger file is not ours


def render(labels: Mapping[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in sorted(labels.items()))


def parse(text: str) -> dict[str, str]:
    """The labels of a feature file; lines without '=' are skipped."""
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key: value for key, value in pairs}


class FeatureFile:
    """A LabelSink writing `path`; an empty path prints to `stream` (stdout) instead."""

    def __init__(self, path: str | os.PathLike[str], *, stream: TextIO | None = None) -> None:
        self._path = Path(path) if str(path) else None
        self._stream = stream
        self._printed: dict[str, str] | None = None

    @property
    def path(self) -> Path | None:
        return self._path

    async def publish(self, labels: Mapping[str, str]) -> bool:
        """Write the labels; False (and nothing written) when only the timestamp differs.
        Raises BackendError when the file cannot be written."""
        return await asyncio.to_thread(self._publish, dict(labels))

    async def remove(self) -> None:
        """Delete the file so NFD drops the labels (nothing to do for stdout). Raises
        BackendError when it exists and cannot be deleted."""
        if self._path is None:
            return
        try:
            await asyncio.to_thread(self._path.unlink, missing_ok=True)
        except OSError as exc:
            raise BackendError(
                f"features file {self._path}: cannot remove: {exc.strerror}"
            ) from None

    def _publish(self, labels: dict[str, str]) -> bool:
        if self._path is None:
            if not labels_changed(self._printed, labels):
                return False
            stream = self._stream or sys.stdout
            stream.write(render(labels))
            stream.flush()
            self._printed = labels
            return True
        if not labels_changed(self._current(), labels):
            return False
        try:
            replace_atomically(self._path, render(labels))
        except OSError as exc:
            raise BackendError(
                f"features file {self._path}: cannot write: {exc.strerror or exc}", transient=True
            ) from None
        return True

    def _current(self) -> dict[str, str] | None:
        assert self._path is not None
        try:
            return parse(read_text(self._path, limit=MAX_BYTES, follow=False))
        except OSError:
            return None
