"""Typed option sections filled from the flag table: a section's field names the flag row
it comes from (`flag_field`), and `fill` reads every such field from the parsed flags.
A flag lives in its row and in one field; nothing maps them by hand."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from gpuslice.config.flags import FLAGS_BY_NAME, FlagValue, FlagValues

T = TypeVar("T")
Parse = Callable[[Any], Any]


def _same(value: FlagValue) -> FlagValue:
    return value


def flag_field(name: str, parse: Parse = _same) -> Any:
    """A section field filled from the flag `name` (its value, or its default, through
    `parse`); the dataclass default is the table's."""
    default, meta = parse(FLAGS_BY_NAME[name].default), {"flag": name, "parse": parse}
    if isinstance(default, dict):  # a fresh one for each instance
        return dataclasses.field(default_factory=default.copy, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag_names(section: type) -> dict[str, str]:
    """Field name -> the flag that fills it, for a section's flag fields."""
    return {f.name: f.metadata["flag"] for f in dataclasses.fields(section) if "flag" in f.metadata}


def fill(section: type[T], flags: FlagValues, **rest: Any) -> T:
    """`section` with each flag field read from `flags`, and `rest` for the others."""
    values = {
        f.name: f.metadata["parse"](flags.value(f.metadata["flag"]))
        for f in dataclasses.fields(section)  # type: ignore[arg-type]
        if "flag" in f.metadata
    }
    return section(**values, **rest)
