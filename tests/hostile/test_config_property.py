"""Property: whatever YAML text arrives (tags, anchors and aliases, merge keys,
nesting), loading it answers a config or one ConfigError line, within the size and
expansion bounds, and never anything else."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.config.loader import load_config
from gpuslice.core.errors import ConfigError

TAGS = ["", "!!str ", "!!int ", "!!float ", "!!bool ", "!!null ", "!!timestamp ", "!!binary ",
        "!!set ", "!!omap ", "!!map ", "!!seq ", "!x ", "!python/object:os.system "]  # fmt: skip
WORDS = ["v1", "1", "-1", "0x1f", "1e400", "yes", "maybe", "~", "''", "2024-01-01",
         "2024-01-01x", "nvidia.com/gpu", ".inf", "[]", "{}", "a: b"]  # fmt: skip
KEYS = ["version", "flags", "sharing", "timeSlicing", "resources", "name", "replicas",
        "migStrategy", "<<", "x"]  # fmt: skip


@st.composite
def documents(draw: st.DrawFn) -> str:
    """A YAML document of keys, tagged scalars, anchors and aliases to them."""
    anchors: list[str] = []
    out = []
    for i in range(draw(st.integers(1, 8))):
        indent = "  " * draw(st.integers(0, min(i, 3)))
        key = draw(st.sampled_from(KEYS))
        alias: bool = draw(st.booleans())
        if anchors and alias:
            value = "*" + draw(st.sampled_from(anchors))
        else:
            value = draw(st.sampled_from(TAGS)) + draw(st.sampled_from(WORDS))
            if draw(st.booleans()):
                anchors.append(f"a{i}")
                value = f"&a{i} [{value}, {value}]"
        out.append(f"{indent}{key}: {value}")
    return "\n".join(out) + "\n"


@settings(max_examples=400, deadline=None)
@given(documents() | st.text(max_size=200))
def test_any_text_is_a_config_or_one_line(text: str) -> None:
    try:
        load_config(text)
    except ConfigError as exc:
        message = str(exc)
    else:
        return
    assert "\n" not in message
    assert message.startswith("<config>")
