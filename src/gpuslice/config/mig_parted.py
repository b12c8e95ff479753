"""NVIDIA's mig-parted config (`version: v1`, `mig-configs`), accepted as a user has it:
the file the GPU Operator's `default-mig-parted-config` ConfigMap holds, or one's own.

Each named config is a list of entries: `devices` (`all` or GPU indexes), an optional
`device-filter` (a PCI device ID such as "0x20B010DE", optionally with a subsystem ID,
"0x20B010DE:0x134F10DE", or a list of them), `mig-enabled`, and `mig-devices` (profile ->
count), required when MIG is enabled and refused when it is not. Any mistake is one
ConfigError naming the file and the path in it; the file is read as configs are (a
regular file of at most MAX_BYTES, config.loader).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from gpuslice.config.checks import show, suggest
from gpuslice.config.decode import config_error
from gpuslice.config.loader import parse_document, read_config_text
from gpuslice.core.mig import PROFILE, DeviceFilter, MigConfigEntry

VERSION = "v1"
TOP_KEYS = ("version", "mig-configs")
ENTRY_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")
_PCI_ID = re.compile(r"0x([0-9a-f]{8})", re.I)


@dataclass(frozen=True, slots=True)
class MigPartedConfig:
    """The named MIG configs of one file."""

    configs: Mapping[str, tuple[MigConfigEntry, ...]]
    source: str = ""

    def entries(self, name: str) -> tuple[MigConfigEntry, ...]:
        """The entries of config `name`; ConfigError naming those the file has."""
        found = self.configs.get(name)
        if found is None:
            hint = suggest(name, self.configs)
            known = f"did you mean {hint}?" if hint else "it has: " + ", ".join(self.configs)
            raise config_error(self.source, "mig-configs", f"no config {show(name)}; {known}")
        return found


def load_mig_parted_file(path: str | os.PathLike[str]) -> MigPartedConfig:
    return parse_mig_parted(read_config_text(Path(path)), str(path))


def parse_mig_parted(text: str, source: str = "<mig-parted config>") -> MigPartedConfig:
    doc = parse_document(text, source)
    where = _Where(source)
    top = where.mapping(doc, "", TOP_KEYS)
    if top.get("version") != VERSION:
        where.fail("version", f"got {show(top.get('version'))}; expected {VERSION}")
    named = where.mapping(top.get("mig-configs"), "mig-configs", None)
    configs: dict[str, tuple[MigConfigEntry, ...]] = {}
    for name, raw in named.items():
        at = f"mig-configs.{name}"
        if not isinstance(name, str) or not name:
            where.fail("mig-configs", f"key {show(name)} is not a config name")
        if not isinstance(raw, list) or not raw:
            where.fail(at, f"got {show(raw)}; expected a list of entries")
        configs[name] = tuple(_entry(where, item, f"{at}[{i}]") for i, item in enumerate(raw))
    return MigPartedConfig(configs, source)


def _entry(where: _Where, raw: object, at: str) -> MigConfigEntry:
    entry = where.mapping(raw, at, ENTRY_KEYS)
    for key in ("devices", "mig-enabled"):
        if key not in entry:
            where.fail(f"{at}.{key}", "missing")
    enabled = entry["mig-enabled"]
    if not isinstance(enabled, bool):
        where.fail(f"{at}.mig-enabled", f"got {show(enabled)}; expected true or false")
    if enabled and "mig-devices" not in entry:
        where.fail(f"{at}.mig-devices", "missing; required when mig-enabled is true")
    if not enabled and "mig-devices" in entry:
        where.fail(f"{at}.mig-devices", "not allowed when mig-enabled is false")
    return MigConfigEntry(
        devices=_devices(where, entry["devices"], f"{at}.devices"),
        mig_enabled=enabled,
        mig_devices=_mig_devices(where, entry.get("mig-devices"), f"{at}.mig-devices"),
        device_filter=_filters(where, entry.get("device-filter"), f"{at}.device-filter"),
    )


def _devices(where: _Where, raw: object, at: str) -> tuple[int, ...] | None:
    if raw == "all":
        return None
    if not isinstance(raw, list) or not raw or not all(_index(i) for i in raw):
        where.fail(at, f"got {show(raw)}; expected all, or a list of GPU indexes")
    if len(set(raw)) != len(raw):
        where.fail(at, f"got {show(raw)}; a GPU index is listed twice")
    return tuple(raw)


def _index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _mig_devices(where: _Where, raw: object, at: str) -> tuple[tuple[str, int], ...]:
    if raw is None:
        return ()
    devices = where.mapping(raw, at, None)
    out = []
    for profile, count in devices.items():
        if not isinstance(profile, str) or PROFILE.fullmatch(profile) is None:
            problem = 'expected a MIG profile such as "1g.5gb", "1g.5gb+me" or "1c.3g.20gb"'
            where.fail(at, f"key {show(profile)}: {problem}")
        if not isinstance(count, int) or not _index(count):
            where.fail(f"{at}.{profile}", f"got {show(count)}; expected a count >= 0")
        out.append((profile, count))
    return tuple(out)


def _filters(where: _Where, raw: object, at: str) -> tuple[DeviceFilter, ...]:
    if raw is None:
        return ()
    items = raw if isinstance(raw, list) else [raw]
    return tuple(_filter(where, item, at) for item in items)


def _filter(where: _Where, raw: object, at: str) -> DeviceFilter:
    parts = raw.split(":") if isinstance(raw, str) else []
    matches = [_PCI_ID.fullmatch(p) for p in parts]
    if not 1 <= len(parts) <= 2 or None in matches:
        expected = 'a PCI device ID such as "0x20B010DE", or "0x20B010DE:0x134F10DE"'
        where.fail(at, f"got {show(raw)}; expected {expected}")
    ids = [int(m[1], 16) for m in matches if m is not None]
    return DeviceFilter(ids[0], ids[1] if len(ids) == 2 else None)


class _Where:
    """Errors that name the file and the path in it."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, problem: str) -> NoReturn:
        raise config_error(self.source, path, problem)

    def mapping(self, raw: object, at: str, keys: tuple[str, ...] | None) -> dict[object, object]:
        if not isinstance(raw, dict):
            self.fail(at, f"got {show(raw)}; expected a mapping")
        for key in raw:
            if keys is not None and key not in keys:
                hint = suggest(str(key), keys)
                known = f"did you mean {hint}?" if hint else "known: " + ", ".join(keys)
                self.fail(f"{at}.{key}" if at else str(key), f"unknown key; {known}")
        return raw
