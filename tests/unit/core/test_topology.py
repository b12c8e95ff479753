"""Topology: link counts from a snapshot and the NVLink-aware best set."""

from __future__ import annotations

from itertools import combinations
from math import comb

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.core.topology import EXHAUSTIVE_LIMIT, Topology

from . import builders as b


def uuids(*indexes: int) -> list[str]:
    return [b.gpu_uuid(i) for i in indexes]


def topo(count: int, links: dict[tuple[int, int], int]) -> Topology:
    """`count` GPUs with NVLink counts given once per pair (on the lower index)."""
    per_gpu: dict[int, list[tuple[int, int]]] = {i: [] for i in range(count)}
    for (x, y), n in links.items():
        per_gpu[x].append((y, n))
    return Topology.from_snapshot(b.snapshot(*(b.gpu(i, nvlinks=per_gpu[i]) for i in range(count))))


def inside(t: Topology, chosen: list[str]) -> int:
    return sum(t.score(x, y) for x, y in combinations(chosen, 2))


def test_from_snapshot_is_symmetric_when_one_side_reports_the_link() -> None:
    t = topo(3, {(0, 1): 4})
    g0, g1, g2 = uuids(0, 1, 2)
    assert t.score(g0, g1) == t.score(g1, g0) == 4
    assert t.score(g0, g2) == t.score(g2, g1) == 0


def test_from_snapshot_keeps_the_larger_count_and_drops_self_links() -> None:
    snap = b.snapshot(b.gpu(0, nvlinks=[(1, 2), (0, 9)]), b.gpu(1, nvlinks=[(0, 6)]))
    t = Topology.from_snapshot(snap)
    g0, g1 = uuids(0, 1)
    assert t.score(g0, g1) == t.score(g1, g0) == 6
    assert t.score(g0, g0) == 0
    assert t.order == {g0: 0, g1: 1}


def test_best_set_maximises_links_inside_the_set() -> None:
    t = topo(4, {(0, 1): 1, (1, 2): 2, (2, 3): 6})
    assert t.best_set(uuids(0, 1, 2, 3), [], 2) == uuids(2, 3)
    assert t.best_set(uuids(0, 1, 2, 3), [], 3) == uuids(1, 2, 3)


def test_best_set_breaks_ties_by_cutting_fewest_links_to_the_rest() -> None:
    """{0,1} and {2,3} both hold one link; taking {0,1} would cut the 1-4 link
    and strand GPU 4, so {2,3} wins although it comes later."""
    t = topo(5, {(0, 1): 1, (1, 4): 1, (2, 3): 1})
    assert t.best_set(uuids(0, 1, 2, 3, 4), [], 2) == uuids(2, 3)


def test_best_set_cut_counts_links_of_the_required_gpus() -> None:
    """Required GPU 4 links to GPU 2. {4,0,1} and {4,2,3} both hold one link,
    but {4,0,1} cuts the 4-2 link and leaves 2 and 3 unlinked, while {4,2,3}
    cuts nothing and leaves the 0-1 pair whole."""
    t = topo(5, {(0, 1): 1, (2, 4): 1})
    assert t.best_set(uuids(0, 1, 2, 3, 4), uuids(4), 3) == uuids(4, 2, 3)


def test_best_set_ties_without_cut_difference_go_to_the_lowest_indexes() -> None:
    t = topo(4, {(0, 1): 2, (2, 3): 2})
    assert t.best_set(uuids(3, 2, 1, 0), [], 2) == uuids(0, 1)


def test_best_set_puts_required_first_and_picks_their_peers() -> None:
    t = topo(6, {(0, 1): 2, (1, 2): 2, (0, 2): 2, (3, 4): 2, (4, 5): 2, (3, 5): 2})
    assert t.best_set(uuids(0, 1, 2, 3, 4, 5), uuids(4), 3) == uuids(4, 3, 5)


def test_best_set_without_links_takes_gpus_in_index_order() -> None:
    t = topo(4, {})
    assert t.best_set(uuids(3, 1, 2, 0), uuids(2), 3) == uuids(2, 0, 1)


def test_best_set_when_required_fill_the_size() -> None:
    t = topo(3, {(0, 1): 1})
    assert t.best_set(uuids(0, 1, 2), uuids(2, 0), 2) == uuids(2, 0)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_exhaustive_best_set_has_the_most_inside_links(data: st.DataObject) -> None:
    count = data.draw(st.integers(2, 7))
    pairs = list(combinations(range(count), 2))
    links = data.draw(st.dictionaries(st.sampled_from(pairs), st.integers(1, 12)))
    t = topo(count, links)
    available = uuids(*range(count))
    required = data.draw(st.lists(st.sampled_from(available), unique=True, max_size=count - 1))
    size = data.draw(st.integers(max(1, len(required)), count))
    got = t.best_set(available, required, size)
    assert got[: len(required)] == required
    assert len(set(got)) == size
    rest = [u for u in available if u not in required]
    best = max(
        (inside(t, [*required, *c]) for c in combinations(rest, size - len(required))),
        default=inside(t, required),
    )
    assert inside(t, got) == best


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_greedy_fallback_returns_a_valid_set_with_the_required(data: st.DataObject) -> None:
    count = data.draw(st.integers(20, 24))
    pairs = list(combinations(range(count), 2))
    links = data.draw(st.dictionaries(st.sampled_from(pairs), st.integers(1, 12), min_size=1))
    t = topo(count, links)
    available = data.draw(st.permutations(uuids(*range(count))))
    required = data.draw(st.lists(st.sampled_from(available), unique=True, max_size=3))
    needed = data.draw(st.integers(7, 9))
    assert comb(count - len(required), needed) > EXHAUSTIVE_LIMIT  # the greedy path runs
    got = t.best_set(available, required, len(required) + needed)
    assert got[: len(required)] == required
    assert len(got) == len(set(got)) == len(required) + needed
    assert set(got) <= set(available)


def test_greedy_fallback_grows_the_set_along_links() -> None:
    """20 GPUs in islands of 4 fully linked GPUs: a set of 8 starting from GPU 5
    fills its island and then a whole second island."""
    islands = [range(i, i + 4) for i in range(0, 20, 4)]
    t = topo(20, {pair: 2 for isl in islands for pair in combinations(isl, 2)})
    available = uuids(*range(20))
    assert comb(19, 7) > EXHAUSTIVE_LIMIT
    got = t.best_set(available, uuids(5), 8)
    assert got[:4] == uuids(5, 4, 6, 7)
    assert sorted(got[4:]) == uuids(0, 1, 2, 3)
