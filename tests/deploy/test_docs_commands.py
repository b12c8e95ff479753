"""Every `helm` command in README.md and docs/*.md works as written: its --set, --set-string,
--set-file and -f values go through Helm's own value parser (strvals, as `helm` parses them),
are coalesced with the chart's defaults and checked against the chart's schema; an install
is rendered too. A value Helm types differently from what the schema wants (a label value
`true` given with --set) fails here as it fails for the user."""

from __future__ import annotations

import re
import shlex
from typing import Any

import helm_python as helm
import pytest
import yaml
from chart_kit import CHART, ROOT, tool

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OUR_CHART = "deploy/helm/gpuslice"
PARSERS = {
    "--set": helm.parse_set_string,
    "--set-string": helm.parse_set_string_values,
    "--set-json": helm.parse_set_json,
    "--set-literal": helm.parse_set_literal,
}
STUB_CONFIG = "version: v1\n"  # a --set-file or -f the reader brings (a100.yaml)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`((?:helm|kubectl) [^`]+)`")
CHART_REF = re.compile(r"^[\w.-]+/[\w./-]+$")  # deploy/helm/gpuslice, nvdp/nvidia-device-plugin


def commands(text: str) -> list[str]:
    """The helm and kubectl commands of a Markdown text: lines of its sh code blocks (with
    continuation lines joined) and inline code spans, which may wrap across lines."""
    found = []
    for lang, block in FENCE.findall(text):
        if lang not in ("sh", "bash", "console", ""):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            line = line.split(" #", 1)[0].split(" | ", 1)[0].strip()
            if line.startswith(("helm ", "kubectl ")):
                found.append(" ".join(line.split()))
    prose = FENCE.sub("", text)
    found += [" ".join(span.split()) for span in INLINE.findall(prose)]
    return found


def merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


def values_of(argv: list[str]) -> dict[str, Any]:
    """The values of a helm command line, parsed in order as Helm does."""
    values: dict[str, Any] = {}
    words = iter(argv)
    for word in words:
        flag, _, inline = word.partition("=")
        if flag in PARSERS or flag in ("--set-file", "-f", "--values"):
            arg = inline or next(words, "")
            if not arg:  # prose naming the flag, not a command
                continue
            if flag in PARSERS:
                merge(values, PARSERS[flag](arg))
            elif flag == "--set-file":
                for pair in arg.split(","):
                    key, _, path = pair.partition("=")
                    file = ROOT / path
                    text = file.read_text() if file.is_file() else STUB_CONFIG
                    merge(values, helm.parse_set_literal(f"{key}={text}"))
            else:
                file = ROOT / arg
                merge(values, yaml.safe_load(file.read_text()) if file.is_file() else {})
    return values


def check(line: str) -> None:
    """Raises helm's error when the command's values fail the chart's schema or render."""
    if not line.startswith("helm "):
        return
    argv = shlex.split(line)
    if not any(CHART_REF.match(word) for word in argv[2:]):
        return  # prose naming a command and a flag, not one to run
    values = values_of(argv)
    if OUR_CHART not in argv:
        return
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(chart.merge_values(values))
    if argv[1] == "install":  # an upgrade with --reuse-values adds to values not shown
        tool().render(CHART, values)


def all_commands() -> list[tuple[str, str]]:
    return [(doc.name, line) for doc in DOCS for line in commands(doc.read_text())]


def test_the_docs_have_commands_to_check() -> None:
    found = all_commands()
    ours = [line for _, line in found if line.startswith("helm ") and OUR_CHART in line]
    assert len(ours) >= 8, ours
    assert any("--set-string" in line for line in ours)
    assert any("--set-file" in line for line in ours)


@pytest.mark.parametrize(("doc", "line"), all_commands(), ids=lambda v: str(v)[:70])
def test_every_command_passes_helms_parser_and_the_schema(doc: str, line: str) -> None:
    check(line)


@pytest.mark.parametrize(
    "line",
    [
        # Helm types true as a boolean; a nodeSelector value must be a string
        f"helm install gpuslice {OUR_CHART} --set 'nodeSelector.gpuslice\\.io/agent=true'",
        f"helm upgrade gpuslice {OUR_CHART} --reuse-values --set statusPort=http",
        f"helm install gpuslice {OUR_CHART} --set simulat=t4",
    ],
)
def test_a_command_the_schema_refuses_fails_here(line: str) -> None:
    with pytest.raises(helm.HelmError):
        check(line)


def test_prose_naming_a_flag_is_not_a_command() -> None:
    check("helm upgrade --set config.default")  # no chart: nothing to run
    with pytest.raises(helm.HelmError):
        check(f"helm upgrade gpuslice {OUR_CHART} --set config.default")


def test_inline_commands_wrapping_across_lines_are_found() -> None:
    text = "run `helm upgrade gpuslice deploy/helm/gpuslice --reuse-values --set\nx=1` now"
    assert commands(text) == ["helm upgrade gpuslice deploy/helm/gpuslice --reuse-values --set x=1"]
    block = "```sh\nhelm install a b \\\n    --set c=d   # note\n```\n"
    assert commands(block) == ["helm install a b --set c=d"]
    assert values_of(shlex.split("helm install a b --set c=d --set-string e=true")) == {
        "c": "d",
        "e": "true",
    }
