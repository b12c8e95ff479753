"""Typed reads from parsed YAML with one-line errors that name the field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NoReturn

from gpuslice.core.errors import ConfigError


def describe(value: object) -> str:
    """A short, human name for what was found instead of the expected value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


class Fields:
    """One YAML mapping at `path` inside `source`; rejects keys not in `allowed`."""

    def __init__(self, raw: object, path: str, source: str, allowed: tuple[str, ...]) -> None:
        self.path = path
        self.source = source
        if not isinstance(raw, dict):
            self.fail(path, f"expected a mapping, got {describe(raw)}")
        self._raw: dict[Any, Any] = raw
        for key in raw:
            if key not in allowed:
                self.fail(self.at(str(key)), f"unknown key (allowed: {', '.join(allowed)})")

    def fail(self, path: str, problem: str) -> NoReturn:
        where = f"{self.source}: {path}" if path else self.source
        raise ConfigError(f"{where}: {problem}")

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return self._raw.get(key) is not None

    def _get(self, key: str, kinds: tuple[type, ...], what: str, required: bool) -> object:
        value = self._raw.get(key)
        if value is None:
            if required:
                self.fail(self.at(key), f"missing ({what})")
            return None
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            self.fail(self.at(key), f"expected {what}, got {describe(value)}")
        return value

    def opt_text(self, key: str, what: str = "a string") -> str | None:
        value = self._get(key, (str,), what, required=False)
        return value if isinstance(value, str) else None

    def text(self, key: str, what: str = "a string") -> str:
        value = self._get(key, (str,), what, required=True)
        assert isinstance(value, str)
        return value

    def opt_integer(self, key: str, minimum: int = 0) -> int | None:
        what = f"an integer >= {minimum}"
        value = self._get(key, (int,), what, required=False)
        if not isinstance(value, int):
            return None
        if value < minimum:
            self.fail(self.at(key), f"expected {what}, got {value}")
        return value

    def integer(self, key: str, minimum: int = 0) -> int:
        value = self.opt_integer(key, minimum)
        if value is None:
            self.fail(self.at(key), f"missing (an integer >= {minimum})")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key, (bool,), "true or false", required=False)
        return value if isinstance(value, bool) else default

    def section(self, key: str, allowed: tuple[str, ...]) -> Fields | None:
        """The mapping under `key` (None when absent), rejecting keys not in `allowed`."""
        value = self._get(key, (dict,), "a mapping", required=False)
        return None if value is None else Fields(value, self.at(key), self.source, allowed)

    def items(self, key: str, required: bool = False) -> Iterator[tuple[str, object]]:
        """(path, item) for each element of a list field."""
        value = self._get(key, (list,), "a list", required)
        for i, item in enumerate(value if isinstance(value, list) else []):
            yield f"{self.at(key)}[{i}]", item
