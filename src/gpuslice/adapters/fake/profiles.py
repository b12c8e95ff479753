"""Built-in node profiles (YAML files shipped in this package) and spec lookup."""

from __future__ import annotations

from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from gpuslice.adapters.fake.nodefile import NodeFile, parse_node_file
from gpuslice.adapters.outside_files import read_text, reason
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import ConfigError

NODE_FILE_MAX_BYTES = 1 << 20  # a node of many GPUs is a few KiB
_SUFFIX = ".yaml"


def _profile_dir() -> Traversable:
    return resources.files(__package__).joinpath("profiles")


def profile_names() -> tuple[str, ...]:
    """Names of the built-in profiles, sorted."""
    return tuple(
        sorted(
            entry.name.removesuffix(_SUFFIX)
            for entry in _profile_dir().iterdir()
            if entry.name.endswith(_SUFFIX)
        )
    )


def profile_text(name: str) -> str:
    """The YAML of a built-in profile (documentation and starting point for node files)."""
    if name not in profile_names():
        raise ConfigError(f"unknown profile {name!r} (built-in: {', '.join(profile_names())})")
    return _profile_dir().joinpath(name + _SUFFIX).read_text(encoding="utf-8")


def load_spec(spec: str) -> HardwareSnapshot:
    """A built-in profile name, or a path to a YAML node file."""
    return load_node(spec).snapshot


def imex_channels(spec: str) -> frozenset[int]:
    """The IMEX channels whose device nodes exist on the simulated node (`imex_channels`
    of its node file; none on the built-in profiles). Asked at each config load."""
    if spec in profile_names():
        return _profile_imex_channels(spec)  # a profile never changes: parse it once
    return load_node(spec).imex_channels


@cache
def _profile_imex_channels(name: str) -> frozenset[int]:
    return load_node(name).imex_channels


def load_node(spec: str) -> NodeFile:
    """The node described by a built-in profile name or a YAML node file."""
    if spec in profile_names():
        return parse_node_file(profile_text(spec), f"profile {spec}")
    path = Path(spec)
    try:
        text = read_text(path, limit=NODE_FILE_MAX_BYTES)
    except OSError as exc:
        why = reason(exc)
        raise ConfigError(
            f"fake hardware {spec!r}: not a built-in profile ({', '.join(profile_names())})"
            f" and not a readable node file ({why})"
        ) from None
    return parse_node_file(text, f"node file {spec}")
