"""What DRA takes from outside: ResourceClaims and their opaque config from the API, and
broken answers to the claim read. Any JSON is a claim the node prepares or a one-line
refusal on that claim, never an exception out of the plugin; a broken answer refuses
that prepare in one line and the next good answer is prepared."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_harness import remove_dir, short_dir
from dra_harness import DRIVER, NODE, dra_rig
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.core.devices import Gpu, HardwareSnapshot
from gpuslice.core.dra.claims import ClaimError, ClaimRef, check_devices, parse_claim, sharing_for
from gpuslice.core.dra.devices import build_devices
from gpuslice.core.dra.opaque import parse_config
from gpuslice.core.errors import ConfigError
from gpuslice.core.resources import build_resources
from gpuslice.core.sharing import ResourceSettings
from gpuslice.testing.apiserver import BAD_GZIP, GARBAGE

REF = ClaimRef("ns", "u1", "c")
GPU = Gpu(0, "GPU-0", "NVIDIA A100-SXM4-40GB", 0, 40960, (8, 0), "00000000:07:00.0")
SNAPSHOT = HardwareSnapshot((GPU,))
DEVICES = {
    d.name: d for d in build_devices(SNAPSHOT, build_resources(SNAPSHOT, ResourceSettings()))
}
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=30,
)
SOURCES = st.sampled_from(["FromClass", "FromClaim"]) | JSON
# Claims shaped like the API's, with any value at any place.
CLAIMS = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({"uid": st.sampled_from(["u1", "u2"]) | JSON})},
    optional={
        "status": st.fixed_dictionaries(
            {
                "allocation": st.fixed_dictionaries(
                    {
                        "devices": st.fixed_dictionaries(
                            {},
                            optional={
                                "results": st.lists(
                                    st.fixed_dictionaries(
                                        {"driver": st.just(DRIVER) | JSON},
                                        optional={
                                            "request": JSON, "pool": st.just(NODE) | JSON,
                                            "device": st.sampled_from(sorted(DEVICES)) | JSON,
                                            "shareID": JSON, "adminAccess": JSON,
                                        },
                                    ) | JSON,
                                    max_size=3,
                                ) | JSON,
                                "config": st.lists(
                                    st.fixed_dictionaries(
                                        {"source": SOURCES,
                                         "opaque": st.fixed_dictionaries(
                                             {"driver": st.just(DRIVER), "parameters": JSON})},
                                        optional={"requests": JSON},
                                    ) | JSON,
                                    max_size=3,
                                ) | JSON,
                            },
                        )
                    }
                )
            }
        )
    },
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(CLAIMS)
def test_any_claim_is_prepared_or_refused_in_one_line(claim: dict[str, object]) -> None:
    why = refusal(claim)
    assert why is None or (why.startswith("claim ns/c: ") and "\n" not in why)


def refusal(claim: dict[str, object]) -> str | None:
    try:
        parsed = parse_claim(claim, REF, DRIVER)
        devices = check_devices(parsed, DEVICES, pool=NODE, unhealthy=(), prepared={})
        sharing_for(parsed, devices, mps_root="/run/nvidia/mps")
    except ClaimError as exc:
        return str(exc)
    return None


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_opaque_parameters_are_a_config_or_a_one_line_error(params: object) -> None:
    try:
        parse_config(params)
        why = ""
    except ConfigError as exc:
        why = str(exc)
    assert "\n" not in why


@pytest.fixture
def root() -> AsyncIterator[str]:
    path = short_dir("gsx-")
    yield path
    remove_dir(path)


@pytest.mark.parametrize("how", [GARBAGE, BAD_GZIP])
async def test_a_broken_claim_answer_refuses_that_prepare_only(
    root: str, tmp_path: Path, how: str
) -> None:
    async with dra_rig(root, tmp_path) as rig:
        await rig.kubelet.discover(DRIVER)
        device = next(iter(await rig.published(lambda d: len(d) == 8)))
        claim = rig.put_claim("a", device)
        rig.api.corrupt_next("GET", "resourceclaims", how)
        refused = (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]]
        assert refused.error.startswith("claim ml/a: cannot read it:")
        assert "\n" not in refused.error
        assert rig.spec_files() == []
        assert (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]].error == ""


async def test_an_unprepare_of_any_unknown_uid_succeeds_and_touches_nothing_else(
    root: str, tmp_path: Path
) -> None:
    """An unknown claim's spec is removed by its UID's name; a UID no spec of ours could
    be named after (a path, a control character, too long) removes nothing."""
    async with dra_rig(root, tmp_path) as rig:
        device = next(iter(await rig.published(lambda d: len(d) == 8)))
        claim = rig.put_claim("a", device)
        assert (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]].error == ""
        held = rig.spec_files()
        uids = ["../cdi", f"../cdi/{held[0]}", "a\x00b", "x" * 5000, "", "u/../../etc"]
        answers = await rig.kubelet.unprepare(DRIVER, [("ml", uid, "x") for uid in uids])
        assert answers == dict.fromkeys(uids, "")
        assert rig.spec_files() == held
