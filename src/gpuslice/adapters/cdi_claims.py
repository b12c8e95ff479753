"""Per-claim CDI spec files (DRA): one file per prepared claim in the CDI spec directory,
written atomically when the claim is prepared and removed when it is unprepared."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gpuslice.adapters.atomic_file import replace_atomically
from gpuslice.core.errors import BackendError


class ClaimSpecDir:
    """The ClaimSpecs port over `directory` (created when missing)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    async def write(self, name: str, text: str) -> None:
        await asyncio.to_thread(self._do, "write", name, text)

    async def remove(self, name: str) -> None:
        await asyncio.to_thread(self._do, "remove", name, None)

    def _do(self, verb: str, name: str, text: str | None) -> None:
        path = self.directory / name
        if os.sep in name or name.startswith("."):
            raise BackendError(f"CDI spec name {name!r}: not a plain file name")
        try:
            if text is None:
                path.unlink(missing_ok=True)
            else:
                replace_atomically(path, text)
        except OSError as exc:
            raise BackendError(
                f"CDI spec {path}: cannot {verb}: {exc.strerror or exc}", transient=True
            ) from None
