"""The planner's steps, run on the simulated GPUs, make exactly the wanted layout; its
placements never overlap and stay within the GPU's 8 memory slices."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.fake.models import MODELS
from gpuslice.adapters.fake.nodefile import parse_node
from gpuslice.config.mig_parted import load_mig_parted_file
from gpuslice.core.errors import ConfigError
from gpuslice.core.mig import MEMORY_SLICES, MigConfigEntry, MigError, MigProfileSpec, Placement
from gpuslice.core.mig_layout import Create, Destroy, MigGpu, SetMode, Step, plan_layout
from gpuslice.core.ports import MigControl

MIG_MODELS = sorted(k for k, m in MODELS.items() if m.mig_table)
Creates = list[tuple[int, int]]  # (profile's row in the model's table, placement start)
creates = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 7)), max_size=9)


def simulated(model: str, enabled: bool, made: Creates) -> tuple[FakeBackend, str]:
    """A GPU of `model`, with MIG `enabled` and whichever of `made` the driver accepts."""
    backend = FakeBackend(parse_node(f"name: n\ngpus: [{{model: {model}}}]\n", "node"))
    uuid = backend.snapshot().gpus[0].uuid
    mig = control(backend)
    if enabled:
        mig.set_mig_mode(uuid, True)
        for row, start in made:
            # Occupied, overlapping or not a placement: refused, as NVML refuses it.
            with contextlib.suppress(MigError):
                mig.create(uuid, MODELS[model].mig_table[row].name, start)
    return backend, uuid


def control(backend: FakeBackend) -> MigControl:
    found = backend.mig_control()
    assert found is not None
    return found


def run(mig: MigControl, uuid: str, steps: Sequence[Step]) -> None:
    """A plan's steps, in order, as the reconciler will run them."""
    for step in steps:
        if isinstance(step, Destroy):
            mig.destroy(uuid, step.gi)
        elif isinstance(step, SetMode):
            mig.set_mig_mode(uuid, step.enabled)
        else:
            mig.create(uuid, step.profile, step.placement.start)


def planned(backend: FakeBackend, uuid: str) -> MigGpu:
    mig = control(backend)
    return MigGpu(backend.snapshot().gpus[0], mig.profiles(uuid), mig.instances(uuid))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(MIG_MODELS),
    st.booleans(),
    creates,
    st.booleans(),
    creates,
)
def test_a_plan_run_on_the_simulated_gpu_makes_exactly_the_wanted_layout(
    model: str, enabled_now: bool, now: Creates, enable: bool, wanted_creates: Creates
) -> None:
    # Any layout the driver accepts is a layout a config can ask for.
    scratch, scratch_uuid = simulated(model, True, wanted_creates)
    wanted = sorted(i.profile for i in control(scratch).instances(scratch_uuid))
    counts = sorted({p: wanted.count(p) for p in wanted}.items())
    entry = MigConfigEntry(None, enable, tuple(counts) if enable else ())
    backend, uuid = simulated(model, enabled_now, now)
    (plan,) = plan_layout([entry], [planned(backend, uuid)])

    kept = {i.gi: i.placement for i in control(backend).instances(uuid)}
    for step in plan.steps:
        if isinstance(step, Destroy):
            kept.pop(step.gi)
    made = [s.placement for s in plan.steps if isinstance(s, Create)]
    final = [*kept.values(), *made]
    assert all(p.start >= 0 and p.end <= MEMORY_SLICES for p in final)
    assert not any(a.overlaps(b) for i, a in enumerate(final) for b in final[i + 1 :])

    mig = control(backend)
    run(mig, uuid, plan.steps)
    assert mig.mig_mode(uuid) == (enable, enable)
    assert sorted(i.profile for i in mig.instances(uuid)) == (wanted if enable else [])
    gpu = backend.snapshot().gpus[0]
    assert sorted(m.profile for m in gpu.mig_devices) == (wanted if enable else [])
    (again,) = plan_layout([entry], [planned(backend, uuid)])
    assert again.steps == ()  # converged: a second pass changes nothing


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(MIG_MODELS), st.lists(st.integers(0, 6), min_size=1, max_size=9))
def test_a_layout_is_refused_only_when_no_placement_holds_it(model: str, rows: list[int]) -> None:
    table = MODELS[model].mig_table
    names = [table[r].name for r in rows]
    entry = MigConfigEntry(None, True, tuple((n, names.count(n)) for n in sorted(set(names))))
    backend, uuid = simulated(model, False, [])
    try:
        (plan,) = plan_layout([entry], [planned(backend, uuid)])
    except ConfigError:
        assert not _fits_somewhere(table, rows)
        return
    assert len([s for s in plan.steps if isinstance(s, Create)]) == len(rows)


def _fits_somewhere(table: Sequence[MigProfileSpec], rows: list[int]) -> bool:
    """Every assignment of placements tried, without the planner's order or its rules."""
    specs = [table[r] for r in rows]
    if any(specs.count(s) > s.instance_count for s in specs):
        return False

    def search(i: int, taken: list[Placement]) -> bool:
        if i == len(specs):
            return True
        return any(
            search(i + 1, [*taken, p])
            for p in specs[i].placements
            if not any(p.overlaps(t) for t in taken)
        )

    return search(0, [])


DEFAULTS = Path(__file__).parents[1] / "unit/config/mig_parted/default-mig-parted-config.yaml"


@pytest.mark.parametrize("model", MIG_MODELS)
def test_every_default_layout_is_made_on_each_simulated_model_it_names(model: str) -> None:
    config = load_mig_parted_file(DEFAULTS)
    made = set()
    for name in config.configs:
        backend, uuid = simulated(model, False, [])
        (plan,) = plan_layout(config.entries(name), [planned(backend, uuid)])
        if plan.wanted is None:
            continue  # its device filters name other parts
        run(control(backend), uuid, plan.steps)
        wanted = list(plan.wanted.devices)
        assert sorted(i.profile for i in control(backend).instances(uuid)) == wanted, name
        made.add(name)
    assert {"all-disabled", "all-enabled", "all-balanced"} <= made
    assert len(made) >= 6  # and the all-<profile> layouts of its part
