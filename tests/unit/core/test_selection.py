"""choose_config follows upstream config-manager's rules: label, then default, then fallbacks."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import pytest

from gpuslice.core.errors import ConfigError
from gpuslice.core.selection import (
    DEFAULT_FALLBACKS,
    DEFAULT_LABEL,
    EMPTY,
    FALLBACKS,
    Choice,
    check_fallbacks,
    choose_config,
    find_entry,
)

ALL = (*FALLBACKS,)


def choose(
    label: str | None,
    available: Collection[str],
    default: str | None = None,
    fallbacks: Sequence[str] = ALL,
) -> Choice:
    return choose_config(label, available, default=default, fallbacks=fallbacks)


# label set


def test_label_names_an_existing_config() -> None:
    choice = choose("a100", ["default", "a100", "t4"])
    assert choice == Choice("a100", f"label {DEFAULT_LABEL}=a100")


def test_label_wins_over_default_and_fallbacks() -> None:
    assert choose("t4", ["default", "t4"], default="default").name == "t4"


def test_label_may_leave_out_the_file_extension() -> None:
    assert choose("a100", ["a100.yaml", "t4.yaml"]).name == "a100.yaml"


def test_exact_name_wins_over_a_stem() -> None:
    assert choose("a100", ["a100", "a100.yaml"]).name == "a100"


def test_label_matching_two_extensions_is_ambiguous() -> None:
    with pytest.raises(ConfigError, match=r'config "a100" is ambiguous; available: a100.json'):
        choose("a100", ["a100.yaml", "a100.json"])


def test_unknown_label_is_an_error_listing_the_configs() -> None:
    with pytest.raises(
        ConfigError, match=r'^specified config "h100" does not exist; available: a100, t4$'
    ):
        choose("h100", ["t4", "a100"])


def test_unknown_label_is_an_error_even_with_a_default_and_empty_fallback() -> None:
    """Upstream never falls back when the label names a missing config."""
    with pytest.raises(ConfigError, match="does not exist"):
        choose("h100", ["default"], default="default", fallbacks=["empty"])


def test_empty_label_value_counts_as_unset() -> None:
    assert choose("", ["default", "t4"]).reason.endswith("fallback named")


def test_label_cannot_name_a_configmap_bookkeeping_entry() -> None:
    with pytest.raises(ConfigError, match=r'"..data" does not exist; available: t4$'):
        choose("..data", ["..data", "..2024_01_01", "t4"])


def test_label_name_appears_in_the_reason() -> None:
    choice = choose_config("x", ["x"], default=None, fallbacks=(), label="example.com/cfg")
    assert choice.reason == "label example.com/cfg=x"


# default config


def test_default_is_used_when_the_label_is_unset() -> None:
    choice = choose(None, ["default", "a100", "t4"], default="t4")
    assert choice == Choice("t4", f"label {DEFAULT_LABEL} unset; default config")


def test_default_may_leave_out_the_file_extension() -> None:
    assert choose(None, ["t4.yaml", "a100.yaml"], default="t4").name == "t4.yaml"


def test_missing_default_is_an_error_naming_it_not_a_fallback() -> None:
    """Upstream's message names the (empty) label here; ours names the default."""
    with pytest.raises(ConfigError, match=r'^specified config "h100" does not exist'):
        choose(None, ["default", "t4"], default="h100")


# fallbacks


def test_named_fallback_takes_the_entry_called_default() -> None:
    choice = choose(None, ["a100", "default", "t4"], fallbacks=["named"])
    assert choice.name == "default"
    assert choice.reason.endswith("fallback named")


def test_named_fallback_wants_the_literal_name() -> None:
    with pytest.raises(ConfigError, match="fallbacks named all failed"):
        choose(None, ["default.yaml", "t4"], fallbacks=["named"])


def test_single_fallback_takes_the_only_entry() -> None:
    choice = choose(None, ["t4"], fallbacks=["single"])
    assert choice.name == "t4"
    assert choice.reason.endswith("fallback single")


def test_single_fallback_fails_with_two_entries() -> None:
    with pytest.raises(ConfigError, match=r"fallbacks single all failed; available: a, b$"):
        choose(None, ["a", "b"], fallbacks=["single"])


def test_single_ignores_configmap_bookkeeping_entries() -> None:
    assert choose(None, ["..data", "..2024_01_01", "t4"], fallbacks=["single"]).name == "t4"


def test_empty_fallback_gives_the_empty_config() -> None:
    choice = choose(None, ["a", "b"], fallbacks=["empty"])
    assert choice.name is EMPTY
    assert choice.is_empty
    assert choice.shown == "(empty)"
    assert choice.reason.endswith("fallback empty")


def test_fallbacks_are_tried_in_the_given_order() -> None:
    configs = ["default"]
    assert choose(None, configs, fallbacks=["single", "named"]).reason.endswith("single")
    assert choose(None, configs, fallbacks=["named", "single"]).reason.endswith("named")
    assert choose(None, configs, fallbacks=["empty", "named"]).is_empty
    assert choose(None, ["a", "b"], fallbacks=["named", "single", "empty"]).is_empty


def test_all_fallbacks_failing_lists_what_was_tried() -> None:
    with pytest.raises(
        ConfigError,
        match=(
            rf"^no config selected: label {DEFAULT_LABEL} is unset, no default config is set, "
            r"and fallbacks named, single all failed; available: a, b$"
        ),
    ):
        choose(None, ["a", "b"], fallbacks=DEFAULT_FALLBACKS)


def test_no_fallbacks_and_no_label_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"no fallbacks are set; available: t4$"):
        choose(None, ["t4"], fallbacks=())


# no configs at all


def test_no_configs_with_a_label_says_none_are_available() -> None:
    with pytest.raises(ConfigError, match=r'"t4" does not exist; available: none$'):
        choose("t4", [])


def test_no_configs_fails_named_and_single() -> None:
    with pytest.raises(ConfigError, match=r"named, single all failed; available: none$"):
        choose(None, ["..data"], fallbacks=["named", "single"])


def test_no_configs_with_the_empty_fallback_gives_the_empty_config() -> None:
    assert choose(None, [], fallbacks=["named", "single", "empty"]).is_empty


# fallback names


def test_fallback_names_are_checked() -> None:
    assert check_fallbacks(["empty", "named"]) == ("empty", "named")
    with pytest.raises(
        ConfigError, match=r'^fallback strategy "first" is unknown; allowed: named, single, empty$'
    ):
        check_fallbacks(["named", "first"])


def test_an_unknown_fallback_is_refused_even_when_the_label_is_set() -> None:
    """Checked up front, not only when reached as upstream does."""
    with pytest.raises(ConfigError, match='"Named" is unknown'):
        choose("t4", ["t4"], fallbacks=["Named"])


def test_find_entry_is_the_same_rule_for_labels_and_defaults() -> None:
    assert find_entry("t4", ["t4.yml"]) == "t4.yml"
    with pytest.raises(ConfigError, match='"t" does not exist'):
        find_entry("t", ["t4.yml"])
