"""Parsed YAML/JSON data -> a v1 Config, with one-line errors that name the exact path.

msgspec does the type checking; its errors are rewritten here to say where (the path as
written in the file), what was found and what is allowed, with a did-you-mean for typos.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import msgspec
from msgspec import inspect as mi

from gpuslice.config.checks import EXPECTED, FieldError, show, suggest
from gpuslice.config.v1 import VERSION, Config
from gpuslice.core.errors import ConfigError

Segment = str | int

_AT = re.compile(r"^(?P<msg>.*?)(?: - at `(?P<path>[^`]*)`(?: in `(?P<outer>[^`]*)`)?)?$", re.S)
_SEGMENT = re.compile(r"\.([A-Za-z0-9_]+)|\[(\d+)\]")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_\-]+")
_TYPE_WORDS = {
    "int": "an integer",
    "str": "a string",
    "bool": "true or false",
    "object": "a mapping",
    "array": "a list",
    "float": "a number",
}


def config_error(source: str, path: str, problem: str) -> ConfigError:
    """The one ConfigError shape: `source: path: problem`, forced onto a single line."""
    text = ": ".join(part for part in (source, path, problem) if part)
    return ConfigError("".join(c if c.isprintable() else ascii(c)[1:-1] for c in text))


def decode_config(raw: object, source: str) -> Config:
    """Check and convert one parsed config document (None counts as an empty one)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise config_error(source, "", f"got {_kind(raw)}; expected a mapping of config fields")
    version = raw.get("version")
    if version not in (None, "", VERSION):
        problem = f"got {show(version)}; expected {EXPECTED['version']}"
        raise config_error(source, "version", problem)
    raw = _drop_nulls(raw, _schema())
    try:
        return msgspec.convert(raw, Config)
    except msgspec.ValidationError as exc:
        raise _translate(exc, raw, source) from None


def _from_field(source: str, prefix: str, exc: FieldError) -> ConfigError:
    path = f"{prefix}.{exc.field}" if prefix else exc.field
    return config_error(source, path, f"got {show(exc.value)}; expected {exc.expected}")


@functools.cache
def _schema() -> mi.StructType:
    info = mi.type_info(Config)
    assert isinstance(info, mi.StructType)
    return info


def _translate(exc: msgspec.ValidationError, raw: dict[str, Any], source: str) -> ConfigError:
    match = _AT.match(str(exc))
    assert match is not None  # the pattern matches any text
    message, at = match["msg"], match["outer"] or match["path"] or "$"
    segments: list[Segment] = [
        name if name else int(index) for name, index in _SEGMENT.findall(at.removeprefix("$"))
    ]
    path = _render(segments)
    if isinstance(exc.__cause__, FieldError):
        return _from_field(source, path, exc.__cause__)
    found = _lookup(raw, segments)
    if message.startswith("Object contains unknown field"):
        return _unknown_field(source, segments, found)
    if match["outer"] is not None:  # a key that is not a string
        keys = found if isinstance(found, dict) else {}
        bad = next((k for k in keys if not isinstance(k, str)), None)
        return config_error(source, path, f"key {show(bad)} is not a string; keys are field names")
    missing = re.match(r"Object missing required field `(\w+)`", message)
    if missing:
        where = [*segments, missing[1]]
        wanted = _expected(where) or "a value"
        return config_error(source, _render(where), f"missing; expected {wanted}")
    expected_type = re.match(r"Expected `([^`]*)`", message)
    if expected_type:
        specific = _expected(segments)
        wanted = specific or _type_words(expected_type[1])
        hint = _quote_hint(found, specific is None) if "str" in expected_type[1] else ""
        return config_error(source, path, f"got {show(found)}; expected {wanted}{hint}")
    return config_error(source, path, message)


def _unknown_field(source: str, segments: list[Segment], found: object) -> ConfigError:
    struct = _struct_at(segments)
    known = [f.encode_name for f in struct.fields] if struct else []
    mapping = found if isinstance(found, dict) else {}
    key = next((k for k in mapping if k not in known), "?")
    shown = key if isinstance(key, str) and _PLAIN_KEY.fullmatch(key) else show(key)
    hint = suggest(key, known) if isinstance(key, str) else None
    problem = f"did you mean {hint}?" if hint else "known fields here: " + ", ".join(known)
    return config_error(source, _render([*segments, shown]), f"unknown field; {problem}")


def _quote_hint(found: object, any_text: bool) -> str:
    """Why YAML turned an unquoted word into something that is not a string."""
    if isinstance(found, bool):
        return " (YAML reads yes/no/on/off as true/false: quote the value)"
    if not any_text or found is None or isinstance(found, str | list | dict):
        return ""
    return " (YAML did not read it as text: quote the value)"


def _expected(segments: list[Segment]) -> str | None:
    """EXPECTED for the field at `segments`, trying "parent.field" before "field"."""
    names = [s for s in segments if isinstance(s, str)]
    keys = [".".join(names[-2:]), *names[-1:]] if names else []
    return next((EXPECTED[k] for k in keys if k in EXPECTED), None)


def _render(segments: list[Segment]) -> str:
    text = ""
    for s in segments:
        text += f"[{s}]" if isinstance(s, int) else (f".{s}" if text else s)
    return text


def _lookup(raw: object, segments: list[Segment]) -> object:
    node = raw
    for s in segments:
        if isinstance(s, int) and isinstance(node, list) and s < len(node):
            node = node[s]
        elif isinstance(s, str) and isinstance(node, dict):
            node = node.get(s)
        else:
            return None
    return node


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the text {show(value, 40)}"
    return "a single value" if value is not None else "nothing"


def _type_words(expected: str) -> str:
    words = [_TYPE_WORDS.get(t.strip(), t.strip()) for t in expected.split("|")]
    return " or ".join(w for w in words if w != "null")


def _unwrap(t: mi.Type) -> mi.Type:
    """The struct or list inside an optional or union type."""
    if isinstance(t, mi.UnionType):
        for member in t.types:
            if isinstance(member, mi.StructType | mi.ListType | mi.VarTupleType):
                return member
    return t


def _struct_at(segments: list[Segment]) -> mi.StructType | None:
    node: mi.Type = _schema()
    for s in segments:
        node = _unwrap(node)
        if isinstance(s, int) and isinstance(node, mi.ListType | mi.VarTupleType):
            node = node.item_type
        elif isinstance(s, str) and isinstance(node, mi.StructType):
            found = next((f.type for f in node.fields if f.encode_name == s), None)
            if found is None:
                return None
            node = found
        else:
            return None
    node = _unwrap(node)
    return node if isinstance(node, mi.StructType) else None


def _drop_nulls(raw: dict[str, Any], struct: mi.StructType) -> dict[str, Any]:
    """Treat `key: null` as absent for known optional fields (`flags:` with nothing under it),
    as upstream does; unknown keys and required fields are kept for msgspec to report."""
    fields = {f.encode_name: f for f in struct.fields}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        field = fields.get(key) if isinstance(key, str) else None
        if field is None:
            out[key] = value
        elif value is None:
            if field.required:
                out[key] = value
        else:
            out[key] = _drop_nulls_in(value, field.type)
    return out


def _drop_nulls_in(value: object, t: mi.Type) -> object:
    t = _unwrap(t)
    if isinstance(t, mi.StructType) and isinstance(value, dict):
        return _drop_nulls(value, t)
    if isinstance(t, mi.ListType | mi.VarTupleType) and isinstance(value, list):
        return [_drop_nulls_in(item, t.item_type) for item in value]
    return value
