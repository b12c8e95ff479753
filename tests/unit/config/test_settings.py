"""config.settings: one complete value per load (file, flags, env, XID and recovery
policies), where it came from, and the rule that an empty document never silently
replaces a config that had content."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.config.loader import load_config, load_configmap
from gpuslice.config.options import resolve_options
from gpuslice.config.settings import (
    DEFAULTS_SOURCE,
    check_not_truncated,
    load_settings,
    settings_from,
)
from gpuslice.core.errors import ConfigError
from gpuslice.core.sharing import MIG_MIXED, TIME_SLICING

TS4 = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 4\n"
)
BLANK = ["", " \n  \n", "# the whole config\n# was cut here\n", "---\n", "\ufeff"]
DELIBERATE = ["version: v1\n", "version: v1 # nothing else\n", "{}\n", "{version: v1}"]


@pytest.mark.parametrize("text", BLANK)
def test_a_document_with_no_content_is_blank(text: str) -> None:
    assert load_config(text, source="c.yaml").blank


@pytest.mark.parametrize("text", DELIBERATE)
def test_a_document_with_any_content_is_not_blank(text: str) -> None:
    assert not load_config(text, source="c.yaml").blank


def test_a_blank_configmap_entry_is_blank() -> None:
    manifest = "kind: ConfigMap\ndata:\n  cut: ''\n  kept: 'version: v1'\n"
    configs = load_configmap(manifest, source="cm.yaml")
    assert configs["cut"].blank
    assert not configs["kept"].blank


def test_blank_replacing_content_is_refused_in_one_line() -> None:
    """A truncated write would drop all sharing; `version: v1` alone is how to ask."""
    in_force = load_config(TS4, source="c.yaml")
    blank = load_config("# nothing\n", source="c.yaml")
    with pytest.raises(ConfigError) as caught:
        check_not_truncated(blank, in_force)
    assert str(caught.value) == (
        "c.yaml: the config is empty (no content: zero bytes, whitespace or comments only), "
        "most likely a truncated write; write `version: v1` to serve the defaults on purpose"
    )
    check_not_truncated(load_config("version: v1\n", source="c.yaml"), in_force)
    check_not_truncated(blank, blank)  # empty since the start: nothing is lost


def test_settings_of_a_file_carry_name_source_summary_and_warnings(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(TS4.replace("replicas: 4", "replicas: 4\n      rename: gpu-ts"))
    settings = load_settings(resolve_options({"config-file": str(path)}, {"MIG_STRATEGY": "mixed"}))
    assert settings.resources.mig_strategy == MIG_MIXED  # the env var over the default
    assert settings.resources.sharing.strategy == TIME_SLICING
    assert (settings.name, settings.source, settings.shown) == (None, str(path), str(path))
    assert settings.summary.startswith("migStrategy: mixed; sharing: time-slicing")
    assert "nvidia.com/gpu: 4 replicas" in settings.summary
    assert "\n" not in settings.summary
    assert "advertised as nvidia.com/gpu-ts" in settings.summary  # the rename is honoured
    assert settings.warnings == ()
    assert not settings.blank


def test_without_a_file_the_source_says_defaults() -> None:
    settings = load_settings(resolve_options({}, {}))
    assert settings.source == DEFAULTS_SOURCE
    assert settings.shown == DEFAULTS_SOURCE
    assert not settings.blank


def test_an_explicit_flag_beats_the_env_var_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("version: v1\nflags:\n  migStrategy: single\n")
    settings = load_settings(
        resolve_options(
            {"config-file": str(path), "mig-strategy": "mixed"}, {"MIG_STRATEGY": "none"}
        )
    )
    assert settings.resources.mig_strategy == MIG_MIXED


def test_health_policies_come_from_the_environment() -> None:
    loaded = load_config("version: v1\n", source="c.yaml")
    env = {
        "DP_DISABLE_HEALTHCHECKS": "48,bogus",
        "GPUSLICE_HEALTH_HOLDDOWN": "1m",
        "GPUSLICE_HEALTH_MAX_FLAPS": "7",
    }
    settings = settings_from(loaded, resolve_options({}, env))
    assert not settings.xid_policy.counts(48)
    assert settings.xid_policy.warnings == (
        "DP_DISABLE_HEALTHCHECKS: ignoring 'bogus': not an XID number, 'all' or 'xids'",
    )
    assert (settings.recovery.holddown_s, settings.recovery.max_flaps) == (60.0, 7)


def test_a_bad_health_variable_is_a_one_line_config_error() -> None:
    loaded = load_config("version: v1\n", source="c.yaml")
    with pytest.raises(ConfigError) as caught:
        settings_from(loaded, resolve_options({}, {"GPUSLICE_HEALTH_MAX_FLAPS": "lots"}))
    assert str(caught.value) == (
        'GPUSLICE_HEALTH_MAX_FLAPS: got "lots"; expected a whole number, 0 or more '
        "(0: never recover)"
    )


def test_the_settings_value_is_immutable() -> None:
    settings = load_settings(resolve_options({}, {}))
    with pytest.raises(AttributeError):
        settings.name = "other"  # type: ignore[misc]
