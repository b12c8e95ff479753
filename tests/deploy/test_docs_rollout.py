"""The rollout the docs describe works when pasted: every shell block parses (`bash -n`),
every install of the chart uses the image the documented push step pushed and the one
namespace, a block that switches NVIDIA's plugin off first keeps the agents' nodes selected,
each migration step has a check and a way back, and every page says what a value that the
agent accepts without effect really does. test_docs_commands.py renders each command."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from chart_kit import CHART, ROOT, tool
from test_docs_commands import DOCS, FENCE, OUR_CHART, commands, values_of

from gpuslice.config.flags import FLAGS_BY_NAME

NAMESPACE = "gpuslice"
LOCAL_IMAGE = "localhost/gpuslice"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
PUSH = re.compile(r"buildah push (\S+) docker://(\S+)")
ROLLOUT_DOCS = ("README.md", "install.md", "migrate.md")


def shell_blocks(text: str) -> list[str]:
    return [block for lang, block in FENCE.findall(text) if lang in ("sh", "bash")]


def parse_errors(block: str) -> str:
    """bash's own syntax errors for a block, empty when it parses."""
    done = subprocess.run(["bash", "-n"], input=block, text=True, capture_output=True, timeout=30)
    return done.stderr if done.returncode else ""


def our_helm(doc_name: str) -> list[list[str]]:
    """The helm commands of a doc that name this chart, as argv."""
    doc = next(d for d in DOCS if d.name == doc_name)
    lines = [line for line in commands(doc.read_text()) if line.startswith("helm ")]
    return [argv for argv in map(shlex.split, lines) if OUR_CHART in argv]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_shell_block_parses(doc: Path) -> None:
    for block in shell_blocks(doc.read_text()):
        assert not parse_errors(block), f"{block}\n{parse_errors(block)}"


def test_a_block_bash_cannot_parse_is_caught() -> None:
    assert parse_errors("kubectl get pod -o jsonpath='{.items}\n")
    assert shell_blocks("```sh\necho a\n```\n```\nout (put\n```\n") == ["echo a\n"]


def pushed() -> set[tuple[str, str]]:
    """(repository, tag) of every image the docs push."""
    found = set()
    for name in ("README.md", "install.md"):
        doc = next(d for d in DOCS if d.name == name)
        for block in shell_blocks(doc.read_text()):
            for source, target in PUSH.findall(block):
                assert source == f"{LOCAL_IMAGE}:{APP_VERSION}", "push what build.sh built"
                repository, _, tag = target.rpartition(":")
                found.add((repository, tag))
    return found


def test_the_push_step_pushes_the_chart_version_to_one_registry() -> None:
    assert pushed() == {("registry.example.com/gpuslice", APP_VERSION)}


WITH_HELM = [d.name for d in DOCS if our_helm(d.name)]


def test_the_rollout_docs_run_helm() -> None:
    assert set(ROLLOUT_DOCS) <= set(WITH_HELM)


@pytest.mark.parametrize("doc", WITH_HELM)
def test_every_helm_command_of_the_chart_uses_the_one_namespace(doc: str) -> None:
    for argv in our_helm(doc):
        assert argv[argv.index("-n") + 1] == NAMESPACE, " ".join(argv)


@pytest.mark.parametrize("doc", WITH_HELM)
def test_every_install_uses_the_pushed_image(doc: str) -> None:
    ((repository, tag),) = pushed()
    installs = 0
    for argv in our_helm(doc):
        if argv[1] == "upgrade" and "--reuse-values" in argv:
            continue  # keeps the image the install gave
        installs += 1
        values = values_of(argv)
        out = tool().objects(tool().render(CHART, values, release="gpuslice", namespace=NAMESPACE))
        daemonset = next(o for o in out if o["kind"] == "DaemonSet")
        image = daemonset["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == f"{repository}:{tag}", " ".join(argv)
    assert installs or doc not in ROLLOUT_DOCS, f"{doc} installs nothing"


SWITCHES_OFF = ("helm uninstall nvdp", "devicePlugin.enabled=false", "nodeSelector=null")
KEEPS_NODES = "gpuslice.io/gpu-node=true"


def test_a_block_that_switches_nvidia_off_first_keeps_the_agents_nodes() -> None:
    """Uninstalling NVIDIA's chart takes NFD's labels, the ones the default affinity selects
    on, off every node: a pasted block gives the nodes the label only an administrator
    removes before it switches anything, and checks after."""
    doc = ROOT / "docs" / "migrate.md"
    blocks = [b for b in shell_blocks(doc.read_text()) if any(s in b for s in SWITCHES_OFF)]
    assert blocks
    for block in blocks:
        lines = [line for line in block.splitlines() if not line.lstrip().startswith("#")]
        switches = [i for i, line in enumerate(lines) if any(s in line for s in SWITCHES_OFF)]
        first_switch = switches[0]
        labelled = [i for i, line in enumerate(lines) if KEEPS_NODES in line]
        assert labelled, block
        assert labelled[0] < first_switch, block
        assert any(" get " in line for line in lines[first_switch:]), f"no check after\n{block}"


def test_each_migration_step_has_a_check_and_a_way_back() -> None:
    text = (ROOT / "docs" / "migrate.md").read_text()
    steps = re.split(r"(?m)^(?=## \d\. )", text)[1:]
    assert len(steps) == 5
    for step in steps[:4]:  # step 5 is the way back
        title = step.splitlines()[0]
        assert "**Check**" in step, title
        assert "**Way back**" in step, title


def without_effect() -> dict[str, str]:
    """Chart value -> env var, for the values whose flag the agent accepts without effect
    (those `gpuslice run --help` lists as such)."""
    return {
        value: FLAGS_BY_NAME[flag].env[0]
        for value, flag in tool().VALUE_FLAGS.items()
        if "run" not in FLAGS_BY_NAME[flag].uses
    }


def test_values_the_agent_ignores_are_known() -> None:
    assert {"cdi.nvidiaHookPath", "cdi.featureFlags"} <= set(without_effect())


@pytest.mark.parametrize("value", sorted(without_effect()))
def test_every_page_says_a_value_without_effect_has_none(value: str) -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    node = schema
    for key in value.split("."):
        node = node["properties"][key]
    assert "without effect" in node["description"]
    for doc in DOCS:
        # a table row, or a paragraph, naming the value
        units = re.split(r"\n\s*\n|\n(?=\|)", doc.read_text())
        for unit in units:
            if f"`{value}`" in unit:
                assert "without effect" in unit, f"{doc.name}: {unit[:200]}"


def test_the_readme_offers_a_quick_check_and_keeps_the_full_run_for_ci() -> None:
    readme = (ROOT / "README.md").read_text()
    lines = [line.split("#")[0] for line in readme.splitlines()]
    runs = [shlex.split(line) for line in lines if line.startswith("python3 dev.py test")]
    tests = [argv[3:] for argv in runs]
    assert [] in tests, "the full run"
    quick = [args for args in tests if args]
    assert quick, "a quick subset"
    for args in quick:
        assert all((ROOT / a).exists() for a in args if not a.startswith("-")), args
    assert "python3 dev.py test\n" in (ROOT / ".ci" / "run").read_text()
    assert "every argument after `test`" in readme


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown text's headings (outside code blocks)."""
    headings = re.findall(r"(?m)^#{1,6} (.+)$", FENCE.sub("", text))
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_reaches_a_file_and_its_heading(doc: Path) -> None:
    """Sections moved between pages (install.md's internals to upgrades.md and agent-pod.md)
    leave no link behind."""
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path) if path else doc
        assert file.exists(), f"{doc.name}: {target}"
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file.read_text()), f"{doc.name}: {target}"
