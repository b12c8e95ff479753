"""What a sharing rule may name: device references in upstream's forms only, and a
resource that some GPU can have (a typo is refused with a suggestion)."""

from __future__ import annotations

import pytest

from gpuslice.config.checks import EXPECTED
from gpuslice.config.loader import load_config
from gpuslice.config.resource_names import SERVABLE_TEXT
from gpuslice.core.errors import ConfigError

UUID = "8f2a1c3e-1d4b-4c5a-9e8f-0a1b2c3d4e5f"
DEVICES_RULE = EXPECTED["devices"]


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(text, source="cfg.yaml")
    message = str(caught.value)
    assert "\n" not in message
    return message.removeprefix("cfg.yaml: ")


def sharing(entry: str, block: str = "timeSlicing") -> str:
    return f"sharing:\n  {block}:\n    resources:\n    - {entry}\n"


def devices(*refs: str) -> str:
    listed = ", ".join(f"'{r}'" for r in refs)
    return sharing(f"{{name: gpu, replicas: 2, devices: [{listed}]}}")


@pytest.mark.parametrize(
    "ref",
    [
        "GPU-UUID",  # a placeholder left in
        "MIG-UUID",
        f"MIG-GPU-{UUID}",  # the pre-R470 form without /<gi>/<ci>
        f"MIG-GPU-{UUID}/1",
        f"MIG-GPU-{UUID}/1/x",
        f"GPU-{UUID[:-1]}",  # one digit short
        f"GPU-{UUID}-extra",
        f"GPU-{UUID.replace('-', '')}",  # the UUID without its dashes
        f"gpu-{UUID}",
        UUID,  # no GPU- or MIG- prefix
        "0:1:2",
        "1:",
    ],
)
def test_a_device_reference_outside_upstreams_forms_is_refused(ref: str) -> None:
    """Each bad item fails with its own path, the value and every allowed form."""
    assert error_of(devices("0", ref)) == (
        f'sharing.timeSlicing.resources[0].devices[1]: got "{ref}"; expected {DEVICES_RULE}'
    )


@pytest.mark.parametrize(
    "ref",
    [
        "3",
        "0:1",
        f"GPU-{UUID}",
        f"GPU-{UUID.upper()}",
        f"MIG-{UUID}",
        f"MIG-GPU-{UUID}/7/0",
    ],
)
def test_every_upstream_device_reference_form_is_accepted(ref: str) -> None:
    """Accepted in the file and kept for per-GPU sharing, without a warning."""
    loaded = load_config(devices(ref), source="cfg.yaml")
    block = loaded.config.sharing.replicated
    assert block is not None
    assert [str(d) for d in block.resources[0].devices] == [ref]
    assert loaded.warnings == ()


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("nvidia.com/gpus", "nvidia.com/gpu"),
        ("gpus", "nvidia.com/gpu"),
        ("nvidia.com/gpu0", "nvidia.com/gpu"),
        ("nvidia.com/mig-1g5gb", "nvidia.com/mig-1g.5gb"),
        ("mig1g.5gb", "nvidia.com/mig-1g.5gb"),
        ("nvidia.com/mig-1g.10gb+me", None),  # '+' is not allowed in a name: the name rule
        ("nvidia.com/mig-1g.10gb.mee", "nvidia.com/mig-1g.10gb.me"),
        ("nvidia.com/gpu.shared", "nvidia.com/gpu"),  # the renamed name, given as the name
        ("nvidia.com/mig-1g.5gb.shared", "nvidia.com/mig-1g.5gb"),
        ("nvidia.com/mig-1c.3g.20gb", "nvidia.com/mig-3g.20gb"),  # never advertised
        ("nvidia.com/mig-2g10gb", "nvidia.com/mig-2g.10gb"),
        ("nvidia.com/a100", None),
    ],
)
def test_a_resource_no_gpu_can_have_is_refused_with_a_suggestion(
    name: str, hint: str | None
) -> None:
    """A T4 node would silently serve 1 device instead of 4: refuse the typo instead."""
    message = error_of(sharing(f"{{name: '{name}', replicas: 4}}"))
    assert message.startswith(f'sharing.timeSlicing.resources[0].name: got "{name}"; expected ')
    if "+" in name:
        assert "DNS subdomain" in message
        return
    suffix = f" (did you mean {hint}?)" if hint else ""
    assert message.endswith(SERVABLE_TEXT + suffix)


def test_the_mps_block_is_checked_the_same_way() -> None:
    message = error_of(sharing("{name: nvidia.com/gpus, replicas: 4}", "mps"))
    assert message.startswith('sharing.mps.resources[0].name: got "nvidia.com/gpus"')
    assert message.endswith("(did you mean nvidia.com/gpu?)")


@pytest.mark.parametrize(
    "name",
    [
        "gpu",
        "nvidia.com/gpu",
        "mig-1g.5gb",
        "nvidia.com/mig-3g.20gb",
        "nvidia.com/mig-1g.10gb.me",  # 1g.10gb+me
        "nvidia.com/mig-1g.24gb.me.all",  # +me.all
        "nvidia.com/mig-2g.24gb.gfx",  # +gfx
        "nvidia.com/mig-1g.24gb-me",  # -me
        "nvidia.com/mig-7g.141gb",  # a profile not in any suggestion table
    ],
)
def test_every_resource_a_gpu_can_have_is_accepted(name: str) -> None:
    """Whole GPUs, and MIG profiles of the mixed strategy with NVML's attributes."""
    text = sharing(f"{{name: '{name}', replicas: 4}}")
    config = load_config(text, source="cfg.yaml").config
    assert config.sharing.time_slicing is not None
    assert config.sharing.time_slicing.resources[0].name.startswith("nvidia.com/")


def test_an_invalid_name_is_one_line_naming_the_source() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(sharing("{name: gpus, replicas: 4}"), source="cm.yaml[t4]")
    assert str(caught.value).startswith("cm.yaml[t4]: sharing.timeSlicing.resources[0].name")
    assert "\n" not in str(caught.value)
