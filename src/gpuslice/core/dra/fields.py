"""Checked reads of decoded JSON parameters (NVIDIA's opaque DRA config): every error is
one ConfigError line naming the field and what it allows."""

from __future__ import annotations

from collections.abc import Mapping

from gpuslice.core.errors import ConfigError
from gpuslice.core.quantity import parse_bytes

MIB = 2**20


def json_object(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def only_fields(obj: Mapping[str, object], where: str, *allowed: str) -> None:
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}; allowed: {', '.join(allowed)}")


def quantity_mib(value: object, where: str) -> int:
    """A memory Quantity (10Gi, 512Mi, 1G, 1073741824) in whole MiB, at least 1."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    try:
        mib = parse_bytes(text) // MIB
    except ValueError:
        raise ConfigError(
            f"{where}: {value!r} is not a memory quantity such as 10Gi or 512Mi"
        ) from None
    if mib < 1:
        raise ConfigError(f"{where}: {value!r} is below 1Mi")
    return mib
