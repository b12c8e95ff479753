"""The mig-parted config `advise --output mig-config` proposes is one the agent takes
unchanged: it parses as mig-parted's v1, and on a node of the pool's simulated GPUs the
layout planner's steps make every proposed MIG device, one per pod."""

from __future__ import annotations

import re
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from test_mig_plan_fake import MIG_MODELS, control, run

from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.fake.models import MODELS
from gpuslice.adapters.fake.nodefile import parse_node
from gpuslice.config.mig_parted import parse_mig_parted
from gpuslice.core.advice import HEADROOM, Rules, Series, SeriesFacts, advise
from gpuslice.core.advice_config import entry_name
from gpuslice.core.advice_mig import propose_mig_config
from gpuslice.core.mig_layout import MigGpu, plan_layout

MIB = 1024 * 1024
TABLES = {MODELS[k].name: MODELS[k].mig_table for k in MIG_MODELS}
# (peak as a share of the GPU's memory, pods); a peak past every profile is left out
loads = st.lists(st.tuples(st.floats(0.001, 1.0), st.integers(1, 9)), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(MIG_MODELS), loads)
def test_the_proposed_layout_is_made_on_the_pools_simulated_gpus(
    model: str, rows: list[tuple[float, int]]
) -> None:
    gpu_mib = MODELS[model].memory_mib
    name = MODELS[model].name
    facts = {}
    for w, (share, pods) in enumerate(rows):
        for p in range(pods):
            f = SeriesFacts(share=1.0, smallest_share=1.0, gpu_memory=gpu_mib * MIB)
            f.memory.add(share * gpu_mib * MIB)
            facts[Series("ns", f"w{w}-{p}", "main", "nvidia.com/gpu", name, f"GPU-{p}")] = f
    advice = advise(facts, Rules(step_s=30, min_samples=1))
    largest = max(s.memory_mib for s in TABLES[name] if "+" not in s.name) * MIB
    served = [a for a in advice if (a.memory_max or 0) * (1 + HEADROOM) <= largest]
    if not served:
        return  # one error line instead, as the unit tests show
    text = propose_mig_config(advice, TABLES)
    config = parse_mig_parted(text)
    entries = config.entries(f"advised-{entry_name(name)}")
    count = int(re.search(r"# (\d+) GPUs?[ :]", text)[1])  # type: ignore[index]
    node = f"name: n\ngpus: [{{model: {model}, count: {count}}}]\n"
    backend = FakeBackend(parse_node(node, "n"))
    mig = control(backend)
    gpus = [MigGpu(g, mig.profiles(g.uuid)) for g in backend.snapshot().gpus]
    made: Counter[str] = Counter()
    for plan in plan_layout(entries, gpus):
        run(mig, plan.uuid, plan.steps)
        made.update(i.profile for i in mig.instances(plan.uuid))
    assert sum(made.values()) == sum(a.pods for a in served)
