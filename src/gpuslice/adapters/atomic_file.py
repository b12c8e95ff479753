"""Replace a file so that a reader sees the old content or the new, never a part.

The new content goes to a hidden temporary file in the same directory (readers that
scan the directory skip names starting with '.' or ending in '.tmp'), is flushed to
disk, renamed over the old file, and the directory is synced so the rename survives a
crash too.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def replace_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Raises OSError; no temporary file is left behind either way."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # make the rename itself durable
    finally:
        os.close(directory)
