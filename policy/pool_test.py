import dataclasses
import json

import pytest

from tfplace.policy import actions as A
from tfplace.policy.pool import PoolEntry, StrategyPool, strategy_key
from tfplace.formats.strategy import decision, Strategy


def _s(a_share):
    return Strategy(8, 4, decision({"a": a_share, "b": 8 - a_share}), {})


def test_pool_keeps_best_dedups_and_round_trips():
    pool = StrategyPool(3)
    pool.add_baseline(PoolEntry("dp", _s(4), 2.0, 2.0, False, 0))
    act = A.proportional_action(2, 2)
    assert pool.add(PoolEntry("step 1", _s(5), 1.5, 1.5, False, 1, act))
    assert not pool.add(PoolEntry("dup", _s(5), 1.0, 1.0, False, 2))
    pool.add(PoolEntry("oom", _s(6), 0.5, 5.0, True, 3))
    pool.add(PoolEntry("worse", _s(7), 3.0, 3.0, False, 4))
    assert [e.source for e in pool.entries] == ["step 1", "dp", "worse"]  # OOM ranks by effective time
    assert pool.best.source == "step 1" and pool.best_baseline().source == "dp"
    back = StrategyPool.from_json(json.loads(json.dumps(pool.to_json())))
    assert [e.source for e in back.entries] == [e.source for e in pool.entries]
    assert A.action_key(back.best_with_action().action) == A.action_key(act)


@pytest.mark.parametrize("later_s, becomes_best", [
    (0.055370734497222025, False),   # the same time but for rounding (a resumed run once relabelled it)
    (0.05537073449722206, False),    # equal
    (0.0553707344, True),            # faster by 2e-9 relative: a real gain
    (0.06, False),
])
def test_a_tie_keeps_the_strategy_found_first(later_s, becomes_best):
    pool = StrategyPool(3)
    pool.add(PoolEntry("local search step 98", _s(5), 0.05537073449722206, 0.05537073449722206, False, 98))
    assert pool.add(PoolEntry("local search step 103", _s(6), later_s, later_s, False, 103)) == becomes_best
    assert pool.best.source == ("local search step 103" if becomes_best else "local search step 98")


@pytest.mark.parametrize("over_s, fitting_s, expected", [
    (0.5, [2.0, 3.0], "fits 2.0"),                           # a fast strategy over memory ranks first (x1.01)
    (None, [2.0, 3.0], "fits 2.0"),                          # nothing over memory: the pool's best
    (0.5, [], None),                                         # nothing fits
    (None, [0.05537073449722206, 0.055370734497222025], "fits 0.05537073449722206"),  # a rounding tie:
])                                                           # the pool's best, found first, as the pool ranks
def test_best_fitting_is_the_fastest_entry_that_fits_tied_as_the_pool_ranks(over_s, fitting_s, expected):
    pool = StrategyPool(8)
    if over_s is not None:
        pool.add(PoolEntry("over", _s(1), over_s, over_s * 1.01, True, 1))
    for i, t in enumerate(fitting_s):
        pool.add(PoolEntry(f"fits {t}", _s(2 + i), t, t, False, 2 + i))
    assert (pool.best_fitting and pool.best_fitting.source) == expected
    if expected and over_s is None:
        assert pool.best_fitting is pool.best


_BASE = Strategy(8, 4, None, {"g0": decision({"a": 4, "b": 4}), "g1": decision({"a": [4, 4]}, "ps", "b", 1)},
                 graph="m", bucket_bytes=1 << 20)


@pytest.mark.parametrize("other,same", [
    (dataclasses.replace(_BASE, graph="another name", source="x.json"), True),   # names are not meaning
    (dataclasses.replace(_BASE, groups={"g1": _BASE.groups["g1"], "g0": _BASE.groups["g0"]}), True),  # group order
    (dataclasses.replace(_BASE, groups={**_BASE.groups, "g0": decision({"b": 4, "a": 4})}), True),  # device order
    (dataclasses.replace(_BASE, groups={**_BASE.groups, "g0": decision({"a": 5, "b": 3})}), False),
    (dataclasses.replace(_BASE, groups={**_BASE.groups, "g1": decision({"a": 8}, "ps", "b", 1)}), False),  # micro
    (dataclasses.replace(_BASE, groups={**_BASE.groups, "g1": decision({"a": [4, 4]}, "ps", "a", 1)}), False),
    (dataclasses.replace(_BASE, groups={**_BASE.groups, "g1": decision({"a": [4, 4]}, "ps", "b", 0)}), False),
    (dataclasses.replace(_BASE, groups={**_BASE.groups, "g1": decision({"a": [4, 4]}, "ps", "b")}), False),
    (dataclasses.replace(_BASE, groups={**_BASE.groups, "g1": decision({"a": [4, 4]})}), False),  # all-reduce
    (dataclasses.replace(_BASE, bucket_bytes=None), False),
    (dataclasses.replace(_BASE, min_batch_per_replica=2), False),
    (dataclasses.replace(_BASE, default=decision({"a": 8})), False),
    (dataclasses.replace(_BASE, groups={"g0": _BASE.groups["g0"]}), False),
])
def test_strategy_key_is_equal_exactly_when_the_file_format_says_the_same(other, same):
    # reference: the strategy file's own JSON (graph name aside, devices in any order)
    def as_file(s):
        body = s.to_json()
        body.pop("graph")
        return json.dumps(body, sort_keys=True)
    assert (as_file(other) == as_file(_BASE)) == same
    assert (strategy_key(other) == strategy_key(_BASE)) == same
    assert hash(strategy_key(other)) == hash(strategy_key(other))


@pytest.mark.parametrize("second_s, best", [
    (0.05537073449722206 * (1 - 1e-15), "dp_subset_even"),  # apart only by rounding: the first listed
    (0.05537073449722206 * (1 - 1e-9), "dp_subset_proportional"),  # faster for real
])
def test_the_best_baseline_of_tied_baselines_is_the_first_listed(second_s, best):
    pool = StrategyPool(4)
    pool.add_baseline(PoolEntry("dp_subset_even", _s(1), 0.05537073449722206, 0.05537073449722206, False, 0))
    pool.add_baseline(PoolEntry("dp_subset_proportional", _s(2), second_s, second_s, False, 0))
    assert pool.best_baseline().source == best
