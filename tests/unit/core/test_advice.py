"""Right-sizing rules over samples: distributions, workload names, what fits, verdicts,
thin data called out, and the proposed config (checked by the real config loader)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.config.loader import load_each
from gpuslice.core.advice import (
    FITS,
    MIB,
    OVER,
    UNKNOWN,
    WASTEFUL,
    Advice,
    Rules,
    Series,
    SeriesFacts,
    advise,
    memory_limit,
    replicas_for,
    smallest_profile,
    workload_of,
)
from gpuslice.core.advice_config import propose_config
from gpuslice.core.advice_stats import MAX_EXACT, PRECISION, Distribution

T4 = "Tesla T4"
A100 = "NVIDIA A100-SXM4-40GB"
GPU = "nvidia.com/gpu"
PROFILES = {A100: {"1g.5gb": 4864, "2g.10gb": 9984, "3g.20gb": 20096, "7g.40gb": 40537}}
RULES = Rules(step_s=30, min_samples=10, mig_profiles=PROFILES)


def facts(memory_mib: list[float], *, share: float | None = 0.25, gpu_mib: int = 15360,
          smallest: float | None = None, owner: str | None = None,
          limit: float | None = None) -> SeriesFacts:  # fmt: skip
    f = SeriesFacts(share=share, smallest_share=smallest if smallest is not None else share,
                    gpu_memory=gpu_mib * MIB, owner=owner, limit=limit)  # fmt: skip
    for m in memory_mib:
        f.memory.add(m * MIB)
        f.utilization.add(0.5)
    return f


def one(pod: str, f: SeriesFacts, model: str = T4, resource: str = GPU) -> Advice:
    (found,) = advise({Series("ns", pod, "main", resource, model, "GPU-1"): f}, RULES)
    return found


def test_quantiles_are_nearest_rank_and_exact_while_few_values() -> None:
    d = Distribution()
    for v in range(1, 101):
        d.add(float(v))
    assert (d.quantile(0.95), d.quantile(0.5), d.max, d.count) == (95.0, 50.0, 100.0, 100)
    assert d.exact


def test_nan_and_inf_are_counted_apart() -> None:
    d = Distribution()
    d.add(math.nan, 3)
    d.add(math.inf)
    d.add(5.0)
    assert (d.count, d.not_finite, d.quantile(0.95)) == (1, 4, 5.0)
    assert Distribution().quantile(0.95) is None


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32), st.integers(MAX_EXACT + 1, MAX_EXACT + 500), st.floats(1, 1e12))
def test_past_max_exact_values_are_bucketed_and_quantiles_err_upwards_by_little(
    seed: int, n: int, scale: float
) -> None:
    rng = random.Random(seed)
    values = [rng.uniform(1, scale) for _ in range(n)]
    d = Distribution()
    for v in values:
        d.add(v)
    ordered = sorted(values)
    exact = ordered[math.ceil(0.95 * len(ordered)) - 1]
    got = d.quantile(0.95)
    assert got is not None
    if len(set(values)) > MAX_EXACT:
        assert not d.exact
    assert exact * (1 - 1e-9) <= got <= exact * (1 + 2 * PRECISION)
    assert d.max == max(values)


def test_workloads_by_owner_else_by_name_prefix_said_as_such() -> None:
    assert workload_of("web-6f7d9c8b4-k2m9z", None) == ("web", "name prefix")
    assert workload_of("train-0", None) == ("train", "name prefix")
    assert workload_of("batch-x7k2p", None) == ("batch", "name prefix")
    assert workload_of("sweep-abc123-7", None) == ("sweep", "name prefix")
    assert workload_of("solo", None) == ("solo", "name prefix")
    assert workload_of("web-6f7d9c8b4-k2m9z", "ReplicaSet/web-6f7d9c8b4") == (
        "ReplicaSet/web-6f7d9c8b4",
        "owner",
    )


def test_what_fits() -> None:
    assert replicas_for(3000 * MIB, 15360 * MIB) == 4  # 15,360 / 3,300
    assert replicas_for(3000 * MIB, 15360 * MIB, 0.0) == 5
    assert replicas_for(0, 15360 * MIB) == 1024
    assert smallest_profile(4000 * MIB, PROFILES[A100]) == "1g.5gb"  # 4,400 <= 4,864
    assert smallest_profile(4500 * MIB, PROFILES[A100]) == "2g.10gb"  # 4,950 > 4,864
    assert smallest_profile(40000 * MIB, PROFILES[A100]) is None
    assert memory_limit(None, 15360 * MIB, 4) == (3840 * MIB, "recommended")
    assert memory_limit(2048 * MIB, 15360 * MIB, 4) == (2048 * MIB, "enforced")


def test_verdicts() -> None:
    fits = one("infer-0", facts([2000] * 9 + [3000]))
    assert (fits.verdict, fits.replicas, fits.gpus_back) == (FITS, 4, 0.0)
    over = one("train-0", facts([3000] * 9 + [3600]))
    assert (over.verdict, over.replicas) == (OVER, 3)
    waste = one("api-0", facts([500] * 9 + [800]))
    assert (waste.verdict, waste.replicas) == (WASTEFUL, 17)
    assert waste.gpus_back == math.floor((0.25 - 1 / 17) * 100) / 100
    assert waste.memory_limit == math.floor(15360 * MIB / 17)
    assert (waste.memory_p95, waste.memory_max, waste.samples) == (800 * MIB, 800 * MIB, 10)
    assert waste.hours == pytest.approx(10 * 30 / 3600)


def test_a_workload_pools_its_pods() -> None:
    found = advise(
        {
            Series("ns", "api-6f7d9c8b4-aaaaa", "main", GPU, T4, "GPU-1"): facts([500] * 10),
            Series("ns", "api-6f7d9c8b4-bbbbb", "main", GPU, T4, "GPU-2"): facts([900] * 10),
        },
        RULES,
    )
    (api,) = found
    assert (api.pods, api.samples, api.memory_max, api.grouped_by) == (
        2, 20, 900 * MIB, "name prefix")  # fmt: skip
    assert api.gpus_back == math.floor((0.5 - 2 / api.replicas) * 100) / 100  # type: ignore[operator]


def test_thin_data_is_called_out_not_judged() -> None:
    thin = one("new-0", facts([1000] * 3))
    assert thin.verdict == UNKNOWN
    assert "too few samples: 3 (fewer than 10)" in thin.notes
    alone = one("solo-0", facts([9000] * 10, share=1.0))
    assert "never ran on a shared GPU: what fits is a projection" in alone.notes
    huge = one("big-0", facts([15000] * 10, share=1.0))
    assert huge.replicas == 0
    assert any(n.startswith("peak above any share: 15,000 MiB") for n in huge.notes)
    unshared = one("x-0", facts([1000] * 10, share=None))
    assert unshared.verdict == UNKNOWN
    assert "no share held in the window (not allocated through gpuslice)" in unshared.notes


def test_mig_profile_from_the_models_table() -> None:
    a100 = one("m-0", facts([4500] * 10, gpu_mib=40960), model=A100)
    assert (a100.mig_profile, a100.mig_note) == ("2g.10gb", "")
    t4 = one("m-0", facts([4500] * 10))
    assert (t4.mig_profile, t4.mig_note) == (None, "no MIG profile known for Tesla T4")


def test_an_enforced_limit_is_reported_as_such() -> None:
    found = one("l-0", facts([1000] * 10, limit=3840 * MIB))
    assert (found.memory_limit, found.limit_source) == (3840 * MIB, "enforced")


def _validate(tmp_path: Path, text: str) -> list[object]:
    path = tmp_path / "advised.yaml"
    path.write_text(text)
    results = load_each(str(path))
    assert all(not isinstance(r, Exception) for r in results), results
    return results


def test_proposed_config_never_has_more_replicas_than_the_tightest_peak_allows(
    tmp_path: Path,
) -> None:
    advice = advise(
        {
            Series("a", "infer-0", "main", GPU, T4, "GPU-1"): facts([3000] * 10),
            Series("b", "train-0", "main", GPU, T4, "GPU-2"): facts([3600] * 10),
            Series("c", "api-0", "main", GPU, T4, "GPU-3"): facts([800] * 10),
        },
        RULES,
    )
    text = propose_config(advice)
    assert "# nvidia.com/gpu: 4 -> 3 replicas; the tightest, b/train, peaks at 3,600 MiB" in text
    assert "replicas: 3" in text
    (_result,) = _validate(tmp_path, text)


def test_the_tightest_is_the_highest_peak_among_workloads_allowing_the_same_replicas() -> None:
    # A daily spike of 3,700 MiB and a steady 3,600 MiB both allow 3 replicas of a T4;
    # the spike sets the margin, whatever the workloads' names sort as.
    advice = advise(
        {
            Series("ml", "spike-0", "main", GPU, T4, "GPU-1"): facts([1000] * 9 + [3700]),
            Series("ml", "grow-0", "main", GPU, T4, "GPU-2"): facts([3600] * 10),
        },
        RULES,
    )
    assert {a.replicas for a in advice} == {3}
    text = propose_config(advice)
    assert "# nvidia.com/gpu: 4 -> 3 replicas; the tightest, ml/spike, peaks at 3,700 MiB" in text


def test_several_models_give_a_configmap_of_one_entry_each(tmp_path: Path) -> None:
    advice = advise(
        {
            Series("a", "infer-0", "main", GPU, T4, "GPU-1"): facts([1000] * 10),
            Series("b", "big-0", "main", GPU, A100, "GPU-2"): facts([30000] * 10, gpu_mib=40960),
            Series("c", "mig-0", "main", "nvidia.com/mig-1g.5gb", A100, "GPU-3"): facts(
                [1000] * 10, share=4864 / 40960, gpu_mib=40960),
            Series("d", "ren-0", "main", "nvidia.com/gpu.shared", T4, "GPU-4"): facts([1000] * 10),
        },
        RULES,
    )  # fmt: skip
    text = propose_config(advice)
    assert "kind: ConfigMap" in text
    assert "  tesla-t4: |-" in text
    assert "  nvidia-a100-sxm4-40gb: |-" in text
    assert (
        "# nvidia.com/gpu: 4 -> 1 replicas; the tightest, b/big, peaks at 30,000 MiB: not shared"
        in text
    )
    assert 'rename: "nvidia.com/gpu.shared"' in text
    # a MIG slice's replicas split the slice (4,864 MiB), not the GPU
    assert '- name: "nvidia.com/mig-1g.5gb"\n          replicas: 4' in text
    assert "migStrategy: mixed" in text
    assert len(_validate(tmp_path, text)) == 2
