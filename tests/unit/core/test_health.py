"""XidPolicy: upstream's skip list and DP_DISABLE/DP_ENABLE_HEALTHCHECKS semantics."""

from __future__ import annotations

import pytest

from gpuslice.config.health_env import xid_policy_from_env
from gpuslice.core.devices import HealthEvent
from gpuslice.core.health import DEFAULT_SKIPPED_XIDS, XidPolicy

from . import builders as b

GPU0, GPU1 = b.gpu_uuid(0), b.gpu_uuid(1)
SAMPLE = (8, 13, 31, 43, 45, 48, 63, 68, 74, 79, 94, 95, 109, 119)


def policy(disable: str | None = None, enable: str | None = None) -> XidPolicy:
    env = {}
    if disable is not None:
        env["DP_DISABLE_HEALTHCHECKS"] = disable
    if enable is not None:
        env["DP_ENABLE_HEALTHCHECKS"] = enable
    return xid_policy_from_env(env)


def counted(p: XidPolicy) -> set[int]:
    return {x for x in SAMPLE if p.counts(x)}


def test_default_skipped_xids_match_upstream() -> None:
    assert frozenset({13, 31, 43, 45, 68, 109}) == DEFAULT_SKIPPED_XIDS
    assert XidPolicy() == policy()


def test_without_env_vars_only_the_default_skip_list_is_ignored() -> None:
    p = policy()
    assert p.watching
    assert counted(p) == set(SAMPLE) - DEFAULT_SKIPPED_XIDS
    assert p.warnings == ()


@pytest.mark.parametrize("value", ["", " ", ",", " , ,"])
def test_empty_values_change_nothing(value: str) -> None:
    assert policy(value, value) == XidPolicy()
    assert policy(value, value).warnings == ()


def test_disable_list_adds_to_the_default_skip_list() -> None:
    p = policy("48, 79")
    assert counted(p) == set(SAMPLE) - DEFAULT_SKIPPED_XIDS - {48, 79}
    assert p.watching


@pytest.mark.parametrize("value", ["all", "xids", "ALL", " Xids ", "48,all", "all,garbage"])
def test_disable_all_or_xids_turns_xid_checking_off(value: str) -> None:
    p = policy(value)
    assert not p.watching
    assert counted(p) == set()


def test_xids_must_be_a_whole_entry_to_disable_everything() -> None:
    p = policy("noxids,48")
    assert p.watching
    assert counted(p) == set(SAMPLE) - DEFAULT_SKIPPED_XIDS - {48}
    assert p.warnings == (
        "DP_DISABLE_HEALTHCHECKS: ignoring 'noxids': not an XID number, 'all' or 'xids'",
    )


def test_enable_list_overrides_the_default_skip_list() -> None:
    p = policy(enable="13,109")
    assert counted(p) == set(SAMPLE) - DEFAULT_SKIPPED_XIDS | {13, 109}


def test_enable_list_overrides_an_explicit_disable() -> None:
    p = policy("48,79", "48")
    assert counted(p) == set(SAMPLE) - DEFAULT_SKIPPED_XIDS - {79}


def test_enable_list_selects_xids_when_everything_is_disabled() -> None:
    """Upstream documents this; its code watches nothing in this case (see docs)."""
    p = policy("all", "79,13")
    assert p.watching
    assert counted(p) == {79, 13}


@pytest.mark.parametrize("disable", [None, "48", "all", "xids"])
def test_enable_all_makes_every_xid_count(disable: str | None) -> None:
    p = policy(disable, "all")
    assert p.watching
    assert counted(p) == set(SAMPLE)
    assert p.counts(1)
    assert p.counts(2**40)


def test_xid_zero_means_all_as_upstream_reads_it() -> None:
    off = policy("0")
    assert not off.watching
    assert off.warnings == (
        "DP_DISABLE_HEALTHCHECKS: XID 0 does not exist; read as 'all', as upstream does",
    )
    assert counted(policy(enable="0")) == set(SAMPLE)


@pytest.mark.parametrize(
    "entry", ["abc", "-1", "+5", "4.8", "0x30", "1_000", "٣", "18446744073709551616", "4 8"]
)
def test_malformed_entries_are_ignored_and_reported(entry: str) -> None:
    p = policy(f"48,{entry}", f"{entry},13")
    assert counted(p) == set(SAMPLE) - DEFAULT_SKIPPED_XIDS - {48} | {13}
    assert len(p.warnings) == 2
    assert p.warnings[0].startswith("DP_DISABLE_HEALTHCHECKS: ignoring")
    assert p.warnings[1].startswith("DP_ENABLE_HEALTHCHECKS: ignoring")


def test_the_largest_64_bit_xid_is_accepted() -> None:
    assert not policy(str(2**64 - 1)).counts(2**64 - 1)


def test_padding_and_leading_zeros_are_accepted() -> None:
    assert not policy(" 048 ,\t79 ").counts(48)
    assert not policy(" 048 ,\t79 ").counts(79)


def test_describe_names_the_effective_policy() -> None:
    assert policy().describe() == "skipped XIDs: 13,31,43,45,68,109"
    assert policy("48", "13").describe() == ("skipped XIDs: 31,43,45,48,68,109; always counted: 13")
    assert policy("all", "79").describe() == "skipped XIDs: all; always counted: 79"
    assert policy("all").describe() == "XID health checks disabled"
    assert policy(enable="all").describe() == "every XID counts"


def xid(code: int, uuid: str = GPU0) -> HealthEvent:
    return HealthEvent(gpu_uuid=uuid, kind="xid", xid=code)
