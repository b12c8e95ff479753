"""CDI spec files in the CDI spec directory (default /var/run/cdi), where CDI-aware
runtimes (containerd, CRI-O) look up the device names the kubelet passes them.

Each file is replaced atomically and only when its content changed; the directory is
created 0755 whatever the umask (anyone who can add a spec there chooses what a
container gets), and an existing file is read only when it is a regular file of at
most MAX_BYTES, without following a link. A file this
process was asked to hold (written by it, or found already in place with the same
content, as after a restart) and no longer wants is deleted. Other files are left
alone: another vendor's, or a spec from before a restart that is not wanted now.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from gpuslice.adapters.outside_files import read_text, replace_atomically
from gpuslice.config.yaml_text import YAMLError, load_yaml
from gpuslice.core.cdi_toolkit import ToolkitDevices, missing, toolkit_names
from gpuslice.core.errors import BackendError

MAX_BYTES = 4 << 20  # far above any spec of a node's GPUs
MAX_SPECS = 64  # spec files looked at for the toolkit's
OWN_PREFIX = "k8s.device-plugin.nvidia.com-"  # gpuslice's spec files (core.cdi)
TOOLKIT_FILES = ("nvidia.yaml", "nvidia.json")  # the toolkit's names, looked at first


class CdiSpecDir:
    """A CdiStore writing into `directory` (created when missing)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._held: set[str] = set()

    async def sync(self, specs: Mapping[str, str]) -> tuple[str, ...]:
        """Make the directory hold exactly `specs` (file name -> content) among the
        files this store holds. Returns the names written or deleted. Raises
        BackendError (transient) when a file cannot be written or deleted."""
        return await asyncio.to_thread(self._sync, dict(specs))

    def _sync(self, specs: dict[str, str]) -> tuple[str, ...]:
        changed = [name for name, text in specs.items() if self._current(name) != text]
        for name in changed:
            with self._failing("write", name):
                replace_atomically(self.directory / name, specs[name])
            self._held.add(name)
        self._held.update(specs)  # the unchanged ones too: already in place
        stale = sorted(self._held - specs.keys())
        for name in stale:
            with self._failing("remove", name):
                (self.directory / name).unlink(missing_ok=True)
            self._held.discard(name)
        return (*changed, *stale)

    def _current(self, name: str) -> str | None:
        try:
            return read_text(self.directory / name, limit=MAX_BYTES, follow=False)
        except OSError:
            return None

    @contextlib.contextmanager
    def _failing(self, verb: str, name: str) -> Iterator[None]:
        """OSError -> a one-line BackendError naming the file."""
        path = self.directory / name
        try:
            yield
        except OSError as exc:
            raise BackendError(
                f"CDI spec {path}: cannot {verb}: {exc.strerror or exc}", transient=True
            ) from None


def present_nodes(patterns: Iterable[str]) -> tuple[str, ...]:
    """The device nodes matching `patterns` (globs) that exist here, sorted per pattern."""
    return tuple(path for pattern in patterns for path in sorted(glob.glob(pattern)))


def find_toolkit_devices(
    directories: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> ToolkitDevices:
    """The NVIDIA Container Toolkit's CDI devices: the first spec of kind nvidia.com/gpu
    among the .yaml/.json files of `directories`, in order (the toolkit's own names first
    in each, at most MAX_SPECS files in all, each a regular file of at most MAX_BYTES read
    without following a link, parsed bounded). A directory that does not exist is passed
    over. Never raises: what cannot be read is said in `problem`."""
    dirs = [directories] if isinstance(directories, str | os.PathLike) else list(directories)
    wheres = [os.fspath(d) for d in dirs]
    details: list[str] = []
    budget = MAX_SPECS
    for where in wheres:
        try:
            listed = os.listdir(where)
        except FileNotFoundError:
            continue
        except OSError as exc:
            details.append(f"cannot list {where}: {exc.strerror or exc}")
            continue
        for path in _spec_paths(where, listed)[:budget]:
            budget -= 1
            try:
                names = toolkit_names(load_yaml(read_text(path, limit=MAX_BYTES, follow=False)))
            except (OSError, YAMLError, RecursionError):
                continue
            if names:
                return ToolkitDevices(names, path, None)
    return missing(" or ".join(wheres), "; ".join(details))


def is_spec_name(name: str) -> bool:
    """Whether the lookup reads a file of this name (not gpuslice's own, not hidden)."""
    return name.endswith((".yaml", ".yml", ".json")) and not name.startswith((".", OWN_PREFIX))


def _spec_paths(where: str, listed: Iterable[str]) -> list[str]:
    specs = sorted(n for n in listed if is_spec_name(n))
    ordered = [n for n in TOOLKIT_FILES if n in specs] + [
        n for n in specs if n not in TOOLKIT_FILES
    ]
    return [os.path.join(where, n) for n in ordered]
