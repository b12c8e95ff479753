"""Built-in node profiles (YAML files shipped in this package) and spec lookup."""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from gpuslice.adapters.fake.nodefile import parse_node
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import ConfigError

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
    if spec in profile_names():
        return parse_node(profile_text(spec), f"profile {spec}")
    path = Path(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(
            f"fake hardware {spec!r}: not a built-in profile ({', '.join(profile_names())})"
            f" and not a readable node file ({reason})"
        ) from None
    return parse_node(text, f"node file {spec}")
