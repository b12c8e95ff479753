"""Read configs from text, files, ConfigMap manifests and mounted ConfigMap directories.

With config.yaml_text, the only modules of the package that read YAML. A file is read
only when it is a regular file of at most MAX_BYTES, opened non-blocking (a FIFO or a
device in its place is refused with one line, never waited on). A document is either a
plain v1 config or a ConfigMap manifest whose `data` maps config names to config text.
Every failure is a ConfigError with a one-line message; nothing else escapes.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from gpuslice.config.checks import show
from gpuslice.config.decode import config_error, decode_config
from gpuslice.config.load_rules import apply_load_rules
from gpuslice.config.v1 import Config
from gpuslice.config.yaml_text import MarkedYAMLError, YAMLError, load_yaml
from gpuslice.core.errors import ConfigError
from gpuslice.core.selection import find_entry

MAX_BYTES = 1 << 20  # what a ConfigMap can hold; anything larger is not a config
_NO_FILES = "holds no config files (entries starting with .. and subdirectories are skipped)"


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    config: Config
    warnings: tuple[str, ...] = ()
    source: str = ""  # where it came from: a path, or "path[entry]" for a ConfigMap entry
    name: str | None = None  # the ConfigMap entry or directory file it was chosen from
    # The document had no content at all (zero bytes, whitespace, comments, a bare `---`):
    # on a reload that is read as a truncated write, not as a wish for the defaults.
    blank: bool = False


def load_config(text: str, *, source: str = "<config>", name: str | None = None) -> LoadedConfig:
    """A config from YAML/JSON text; `name` picks a ConfigMap entry (optional for one entry)."""
    doc = parse_document(text, source)
    entries = _configmap_entries(doc, source)
    if entries is None:
        if name is not None:
            problem = f"a config name ({show(name)}) was given, but this is not a ConfigMap"
            raise config_error(source, "", problem)
        return _build(doc, source, None)
    return _load_entry(entries, select_config_name(entries, name, source=source), source)


def load_configmap(text: str, *, source: str = "<configmap>") -> dict[str, LoadedConfig]:
    """Every config of a ConfigMap manifest, by entry name."""
    entries = _configmap_entries(parse_document(text, source), source)
    if entries is None:
        raise config_error(source, "kind", "missing; expected a ConfigMap manifest")
    return {key: _load_entry(entries, key, source) for key in entries}


def load_config_file(path: str | os.PathLike[str], *, name: str | None = None) -> LoadedConfig:
    """A config from a file (plain or ConfigMap manifest) or a mounted ConfigMap directory."""
    where = Path(path)
    if os.path.isdir(where):  # False for a path the OS refuses: read_config_text says why
        files = config_dir_entries(where)
        chosen = select_config_name(files, name, source=str(where))
        return replace(load_config_file(files[chosen]), name=chosen)
    return load_config(read_config_text(where), source=str(where), name=name)


def config_dir_entries(path: str | os.PathLike[str]) -> dict[str, Path]:
    """The config files of a mounted ConfigMap directory by name, without its `..` entries."""
    where = Path(path)
    try:
        names = sorted(os.listdir(where))
    except OSError as exc:
        raise config_error(str(where), "", f"cannot list the directory: {exc.strerror}") from None
    return {n: where / n for n in names if not n.startswith("..") and (where / n).is_file()}


def load_config_dir(path: str | os.PathLike[str]) -> dict[str, LoadedConfig]:
    """Every config of a mounted ConfigMap directory, by file name."""
    return {n: _load_dir_file(n, f) for n, f in config_dir_entries(path).items()}


def select_config_name(available: Iterable[str], wanted: str | None, *, source: str) -> str:
    """The entry `wanted` names: exact, or a file name without its extension (a100 ->
    a100.yaml). With no name, the only entry. Raises listing what is available."""
    names = sorted(available)
    if not names:
        raise config_error(source, "", _NO_FILES)
    if wanted is None:
        if len(names) == 1:
            return names[0]
        listing = ", ".join(names)
        raise config_error(
            source,
            "",
            f"holds {len(names)} configs ({listing}); name the one to use with --config-name",
        )
    try:
        return find_entry(wanted, names)
    except ConfigError as exc:
        raise config_error(source, "", str(exc)) from None


def read_config_text(path: Path) -> str:
    """A config file's text: a regular file of at most MAX_BYTES, UTF-8; ConfigError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise config_error(str(path), "", f"cannot read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) and not _is_dev_null(st):
            raise config_error(str(path), "", "not a regular file (a FIFO or device?); refused")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise config_error(str(path), "", f"cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise config_error(str(path), "", f"larger than {MAX_BYTES} bytes; not a config")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        where = f"byte {show(data[exc.start : exc.start + 1].hex())} at offset {exc.start}"
        raise config_error(str(path), "", f"not UTF-8 text ({where})") from None


def _is_dev_null(st: os.stat_result) -> bool:
    """/dev/null: the empty config (config-manager's "empty" fallback points at it)."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)


def parse_document(text: str, source: str) -> object:
    """YAML or JSON text as plain data (bounded: config.yaml_text); ConfigError naming
    the line and column of a syntax error."""
    if len(text) > MAX_BYTES:
        raise config_error(source, "", f"larger than {MAX_BYTES} bytes; not a config")
    if text.lstrip(" \t\r\n\ufeff")[:1] in ("{", "["):
        try:
            return json.loads(text, object_pairs_hook=_unique_pairs)
        except (ValueError, RecursionError):
            pass  # YAML flow style (`{version: v1}`) is not JSON; YAML reports the error
    try:
        return load_yaml(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        context = exc.context if exc.context and not exc.context.startswith("while ") else None
        problem = ", ".join(p for p in (context, exc.problem) if p) or "malformed"
        raise config_error(source, "", f"{where}not valid YAML or JSON: {problem}") from None
    except RecursionError:
        raise config_error(source, "", "not a config: nested too deeply") from None
    except (YAMLError, ValueError, TypeError, OverflowError) as exc:
        detail = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise config_error(source, "", f"not valid YAML or JSON: {detail}") from None


def _configmap_entries(doc: object, source: str) -> dict[str, str] | None:
    """A ConfigMap's data, checked; None when `doc` is a plain config document."""
    if not isinstance(doc, dict) or not ({"kind", "apiVersion"} & doc.keys()):
        return None
    if doc.get("kind") != "ConfigMap":
        problem = f"got {show(doc.get('kind'))}; expected ConfigMap (or a plain config)"
        raise config_error(source, "kind", problem)
    data = doc.get("data") or {}
    if not isinstance(data, dict):
        raise config_error(source, "data", f"got {show(data)}; expected a mapping of named configs")
    for key, value in data.items():
        if not isinstance(key, str):
            raise config_error(
                source, "data", f"key {show(key)} is not a string; each config needs a text name"
            )
        if not isinstance(value, str):
            problem = f"got {show(value)}; expected the config's text (a YAML | block)"
            raise config_error(source, f"data.{key}", problem)
    if not data:
        raise config_error(source, "data", "the ConfigMap holds no configs")
    return data


def _load_entry(entries: dict[str, str], key: str, source: str) -> LoadedConfig:
    where = f"{source}[{key}]"
    return _build(parse_document(entries[key], where), where, key)


def _build(doc: object, source: str, name: str | None) -> LoadedConfig:
    config, warnings = apply_load_rules(decode_config(doc, source), source)
    return LoadedConfig(config, warnings, source, name, blank=doc is None)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key")
    return out


def load_each(
    path: str | os.PathLike[str], *, name: str | None = None
) -> list[LoadedConfig | ConfigError]:
    """Every config a file or directory holds (only `name` when given), each loaded as the
    agent would load it, or the error that refuses it: what `gpuslice config validate`
    checks. Raises ConfigError when the path itself holds nothing to check."""
    where = Path(path)
    if name is not None:
        return [_attempt(partial(load_config_file, where, name=name))]
    if os.path.isdir(where):
        files = config_dir_entries(where)
        if not files:
            raise config_error(str(where), "", _NO_FILES)
        return [r for n, f in files.items() for r in _each_dir_file(n, f)]
    text = read_config_text(where)
    entries = _configmap_entries(parse_document(text, str(where)), str(where))
    if entries is None:
        return [_attempt(partial(load_config, text, source=str(where)))]
    return [_attempt(partial(_load_entry, entries, key, str(where))) for key in entries]


def _each_dir_file(name: str, path: Path) -> list[LoadedConfig | ConfigError]:
    """A directory's file checked as checking it alone does: each entry of a ConfigMap
    manifest. A manifest of several entries is also told apart: the agent, reading the
    directory as a mounted ConfigMap, takes one config per file and refuses it."""
    try:
        found = load_each(path)
    except ConfigError as exc:
        return [exc]
    if len(found) == 1:
        return [replace(r, name=name) if isinstance(r, LoadedConfig) else r for r in found]
    note = (
        f"{path}: a ConfigMap manifest of {len(found)} configs, each checked; as a file of a "
        "mounted ConfigMap directory (--config-file-srcdir, --config-file DIR) the agent "
        "would refuse it: it takes one config per file"
    )
    for i, result in enumerate(found):  # said once, with the first entry that loads
        if isinstance(result, LoadedConfig):
            found[i] = replace(result, warnings=(note, *result.warnings))
            break
    return found


def _load_dir_file(name: str, path: Path) -> LoadedConfig:
    return replace(load_config_file(path), name=name)


def _attempt(load: Callable[[], LoadedConfig]) -> LoadedConfig | ConfigError:
    try:
        return load()
    except ConfigError as exc:
        return exc
