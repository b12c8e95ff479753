"""Per-claim CDI spec files (DRA): one file per prepared claim in the CDI spec directory,
written atomically when the claim is prepared and removed when it is unprepared.

Not fsync'ed: the runtime reads a spec after the kubelet has our answer, the rename makes
it whole, and /var/run/cdi does not outlive a reboot anyway (a claim prepared before a
crash of the node is prepared again by its kubelet). The directory is created 0755
whatever the umask, as for the device plugin's specs.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gpuslice.adapters.outside_files import make_dir, open_dir, write_in_dir
from gpuslice.core.errors import BackendError


class ClaimSpecDir:
    """The ClaimSpecs port over `directory` (created when missing)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    async def write(self, name: str, text: str) -> None:
        await asyncio.to_thread(self._do, "write", name, text)

    async def remove(self, name: str) -> None:
        await asyncio.to_thread(self._do, "remove", name, None)

    async def names(self) -> list[str]:
        return await asyncio.to_thread(self._names)

    def _names(self) -> list[str]:
        try:
            return sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise BackendError(
                f"CDI spec directory {self.directory}: cannot list it: {exc.strerror or exc}",
                transient=True,
            ) from None

    def _do(self, verb: str, name: str, text: str | None) -> None:
        path = self.directory / name
        if os.sep in name or name.startswith("."):
            raise BackendError(f"CDI spec name {name!r}: not a plain file name")
        try:
            if text is None:
                path.unlink(missing_ok=True)
            else:
                make_dir(self.directory, 0o755)
                dir_fd = open_dir(self.directory)
                try:
                    write_in_dir(dir_fd, name, text, durable=False)
                finally:
                    os.close(dir_fd)
        except OSError as exc:
            raise BackendError(
                f"CDI spec {path}: cannot {verb}: {exc.strerror or exc}", transient=True
            ) from None
