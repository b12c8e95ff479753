"""The host the agent runs on, chosen once by the composition root: the real one (NVML,
the node's device nodes and cgroups, nvidia-smi, the MPS binary) or a simulated one (a
node file of GPUs, the testing kit's MPS binary). Nothing else asks whether the hardware
is simulated; a new kind of host is one more class with these methods (core.ports.Host)."""

from __future__ import annotations

from gpuslice.adapters.outside_files import read_text

MACHINE_TYPE_MAX_BYTES = 64 * 1024  # sysfs reports a page; a name is a line


def read_machine_type(path: str) -> str | None:
    """The machine type in `path` (a regular file of a machine's name, read without
    blocking or growing); None when unreadable or empty."""
    try:
        return read_text(path, limit=MACHINE_TYPE_MAX_BYTES, errors="replace").strip() or None
    except OSError:
        return None
