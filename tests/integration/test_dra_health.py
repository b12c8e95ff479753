"""DRA and the node's health: a device failing under a prepared claim is withdrawn from
the slices (or tainted), reported Unhealthy on the kubelet's health stream with the
complete list every time, refused to new claims, and its claim still unprepares; a GPU's
failure covers its MIG devices. And the RBAC rules for DRA are exactly what it uses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_harness import remove_dir, short_dir
from dra_harness import DRIVER, NODE, dra_rig

from gpuslice.adapters.kube.rbac import DRA_RULES, RULES, Rule
from gpuslice.core.dra.devices import DraOptions
from gpuslice.testing.apiserver import Grant

GPU0 = "gpu-0000-07-00-0"
HEALTHY, UNHEALTHY = 1, 2
MIXED = "version: v1\nflags:\n  migStrategy: mixed\n"


@pytest.fixture
def root() -> AsyncIterator[str]:
    path = short_dir("gsh-")
    yield path
    remove_dir(path)


async def test_a_device_failing_under_a_claim(root: str, tmp_path: Path) -> None:
    async with dra_rig(root, tmp_path) as rig:
        await rig.kubelet.discover(DRIVER)
        await rig.published(lambda d: GPU0 in d)
        health = await rig.kubelet.wait_health(DRIVER, lambda h: len(h) == 8)
        assert {state for state, _ in health.values()} == {HEALTHY}
        claim = rig.put_claim("running", GPU0)
        assert (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]].error == ""

        await rig.health.mark(rig.gpu(0))
        await rig.published(lambda d: GPU0 not in d and len(d) == 7)
        assert rig.api.dra.node_slices(NODE)[0]["spec"]["pool"]["generation"] == 2
        health = await rig.kubelet.wait_health(
            DRIVER, lambda h: h.get((NODE, GPU0), (0, ""))[0] == UNHEALTHY
        )
        assert len(health) == 8  # the complete list, the failed device included
        assert health[(NODE, GPU0)][1] == "held unhealthy by health"
        late = rig.put_claim("late", GPU0)
        refused = (await rig.kubelet.prepare(DRIVER, [late]))[late[1]]
        assert refused.error == f"claim ml/late: device {GPU0} is unhealthy"
        assert await rig.kubelet.unprepare(DRIVER, [claim]) == {claim[1]: ""}

        await rig.health.mark()  # recovered
        await rig.published(lambda d: GPU0 in d)
        await rig.kubelet.wait_health(DRIVER, lambda h: h[(NODE, GPU0)][0] == HEALTHY)


async def test_unhealthy_devices_are_tainted_when_asked(root: str, tmp_path: Path) -> None:
    async with dra_rig(root, tmp_path, opts=DraOptions(taint_unhealthy=True)) as rig:
        await rig.published(lambda d: GPU0 in d)
        await rig.health.mark(rig.gpu(0))
        devices = await rig.published(lambda d: "taints" in d.get(GPU0, {}))
        assert devices[GPU0]["taints"] == [
            {"key": "gpu.nvidia.com/unhealthy", "effect": "NoSchedule"}
        ]
        assert len(devices) == 8


async def test_a_gpu_failure_fans_out_to_its_mig_devices(root: str, tmp_path: Path) -> None:
    async with dra_rig(root, tmp_path, hardware="a100-40gb-mig-mixed", config=MIXED) as rig:
        await rig.kubelet.discover(DRIVER)
        devices = await rig.published(lambda d: len(d) == 5)
        migs = sorted(n for n in devices if "-mig-" in n)
        assert len(migs) == 4
        assert devices[migs[0]]["attributes"]["parentUUID"] == {"string": rig.gpu(0)}
        await rig.health.mark(rig.gpu(0))
        health = await rig.kubelet.wait_health(
            DRIVER, lambda h: all(h.get((NODE, m), (0, ""))[0] == UNHEALTHY for m in migs)
        )
        assert len(health) == 5
        assert [n for (_, n), (s, _) in health.items() if s == HEALTHY] == ["gpu-0000-00-05-0"]


def grants(rules: list[Rule]) -> list[Grant]:
    return [
        Grant(group, frozenset(r.resources), frozenset(r.verbs), None)
        for r in rules
        for group in r.api_groups
    ]


def without(rule: Rule, verb: str) -> list[Rule]:
    rest = tuple(v for v in rule.verbs if v != verb)
    changed = [Rule(rule.api_groups, rule.resources, rest, rule.scope, rule.needed_for)]
    return [r for r in DRA_RULES if r is not rule] + (changed if rest else [])


def tear(path: Path) -> None:
    path.write_text("{torn")


async def flow(root: str, tmp_path: Path, rules: list[Rule]) -> set[int]:
    """Publish (create, then update and delete on a shrinking pool), prepare and
    unprepare under `rules`; the status codes the API answered."""
    async with dra_rig(root, tmp_path, register=False) as rig:
        rig.api.grants = grants(rules)  # before the registration: every call is under them
        await rig.kubelet.discover(DRIVER)
        claim = rig.put_claim("a", GPU0)
        await rig.kubelet.prepare(DRIVER, [claim])
        await rig.health.mark(rig.gpu(1))
        await rig.api.wait_for(lambda s: bool(s.of("PUT") or s.answered(403)))
        rig.api.dra.slices[f"{NODE}-{DRIVER}-9"] = {
            "metadata": {"name": f"{NODE}-{DRIVER}-9", "resourceVersion": "1"},
            "spec": {"nodeName": NODE, "driver": DRIVER, "pool": {"generation": 0}},
        }
        await rig.stop()  # a new agent finds the stray slice and deletes it,
        tear(Path(rig.plugin_dir, "checkpoint.json"))  # and rebuilds a torn checkpoint
        watches = len(rig.api.watches("resourceslices"))
        await rig.start()
        await rig.kubelet.discover(DRIVER)
        await rig.api.wait_for(lambda s: bool(s.of("DELETE") or s.answered(403)))
        await rig.frontend.driver.settled.wait()  # the claims listed
        await rig.api.wait_for(  # and the slices watched, answered
            lambda s: any(r.code for r in s.watches("resourceslices")[watches:])
        )
        return {r.code or 0 for r in rig.api.requests}


# Granted with or without DRA: the Node's Events (a checkpoint rebuilt writes one).
EVENTS = [r for r in RULES if r.resources == ("events",) and "create" in r.verbs]


async def test_dra_rbac_rules_are_enough(root: str, tmp_path: Path) -> None:
    codes = await flow(root, tmp_path, [*DRA_RULES, *EVENTS])
    assert 403 not in codes


@pytest.mark.parametrize(
    ("rule", "verb"),
    [(rule, verb) for rule in DRA_RULES for verb in rule.verbs],
    ids=[f"{rule.resources[0]}-{verb}" for rule in DRA_RULES for verb in rule.verbs],
)
async def test_each_dra_rule_is_needed(root: str, tmp_path: Path, rule: Rule, verb: str) -> None:
    codes = await flow(root, tmp_path, [*without(rule, verb), *EVENTS])
    assert 403 in codes
