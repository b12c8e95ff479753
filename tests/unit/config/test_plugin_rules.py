"""The device plugin's start-up rules on the effective config: MPS needs mpsRoot and not
the mixed MIG strategy; IMEX channels are checked against the node's device nodes.
GPU Feature Discovery (`gpuslice labels`) applies none of them, as upstream."""

from __future__ import annotations

import pytest

from gpuslice.config.convert import plugin_options
from gpuslice.config.flags import resolve
from gpuslice.config.loader import load_config
from gpuslice.config.options import resolve_options
from gpuslice.config.settings import settings_from
from gpuslice.config.v1 import Config
from gpuslice.core.errors import ConfigError, HardwareError

MPS_NO_ROOT = "sharing: {mps: {resources: [{name: gpu, replicas: 4}]}}\n"
NO_ROOT_ERROR = (
    'flags.mpsRoot: got ""; expected the host directory of the MPS daemons\' pipes while '
    "sharing.mps is in force (--mps-root or MPS_ROOT; NVIDIA's Helm chart uses "
    "/run/nvidia/mps)"
)
IMEX = "imex: {channelIDs: [0]}\n"


def config(text: str, env: dict[str, str] | None = None) -> Config:
    return resolve(load_config(text, source="c.yaml").config, {}, env or {})


def test_mps_without_mps_root_is_refused_in_one_line() -> None:
    """Upstream refuses to start: replicas without the daemon's pipe mounted share nothing."""
    with pytest.raises(ConfigError) as caught:
        plugin_options(config(MPS_NO_ROOT), frozenset())
    assert str(caught.value) == NO_ROOT_ERROR


def test_mps_with_an_mps_root_from_the_file_or_the_env_is_served() -> None:
    from_env = config(MPS_NO_ROOT, {"MPS_ROOT": "/run/nvidia/mps"})
    from_file = config(MPS_NO_ROOT + "flags: {mpsRoot: /run/nvidia/mps}\n")
    for effective in (from_env, from_file):
        options, warnings = plugin_options(effective, frozenset())
        assert (options.mps_root, warnings) == ("/run/nvidia/mps", ())


def test_mps_with_the_mixed_mig_strategy_is_refused() -> None:
    text = MPS_NO_ROOT + "flags: {migStrategy: mixed, mpsRoot: /mps}\n"
    with pytest.raises(ConfigError) as caught:
        plugin_options(config(text), frozenset())
    assert str(caught.value) == (
        'flags.migStrategy: got "mixed"; expected none or single while sharing.mps is in '
        "force (MPS cannot share MIG devices, as upstream)"
    )


def test_time_slicing_needs_no_mps_root() -> None:
    text = "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 4}]}}\n"
    options, _ = plugin_options(config(text), frozenset())
    assert options.mps_root == ""


def test_labels_alone_take_an_mps_config_without_mps_root() -> None:
    """GFD runs beside the plugin without MPS_ROOT (NVIDIA's chart sets it on the plugin)."""
    loaded = load_config(MPS_NO_ROOT, source="c.yaml")
    assert settings_from(loaded, resolve_options({}, {})).resources.sharing.strategy == "mps"
    with pytest.raises(ConfigError, match=r"flags\.mpsRoot"):
        settings_from(loaded, resolve_options({}, {}), imex_present=frozenset())


def test_a_required_imex_channel_missing_on_the_node_stops_the_plugin() -> None:
    loaded = load_config(IMEX, source="c.yaml")
    with pytest.raises(HardwareError, match=r"/dev/nvidia-caps-imex-channels/channel0 does not"):
        settings_from(
            loaded, resolve_options({"imex-required": "true"}, {}), imex_present=frozenset()
        )
    with pytest.raises(HardwareError, match="IMEX channel 0 is required"):
        settings_from(loaded, resolve_options({}, {"IMEX_REQUIRED": "1"}), imex_present=frozenset())


def test_a_missing_imex_channel_not_required_is_dropped_with_a_warning() -> None:
    """Before: NVIDIA_IMEX_CHANNELS=0 was injected for a channel the node does not have."""
    got = settings_from(
        load_config(IMEX, source="c.yaml"), resolve_options({}, {}), imex_present=frozenset()
    )
    assert got.allocate.imex_channel_ids == ()
    assert [w for w in got.warnings if w.startswith("imex.channelIDs: ")] == [
        "imex.channelIDs: /dev/nvidia-caps-imex-channels/channel0 does not exist on this "
        "node; channel 0 is left out of every allocation (imex.required is false)"
    ]


def test_a_present_imex_channel_is_given_to_containers() -> None:
    loaded = load_config("imex: {channelIDs: [0], required: true}\n", source="c.yaml")
    got = settings_from(loaded, resolve_options({}, {}), imex_present=frozenset({0}))
    assert (got.allocate.imex_channel_ids, got.warnings) == ((0,), ())
