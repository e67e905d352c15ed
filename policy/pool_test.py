import json

from tfplace.policy import actions as A
from tfplace.policy.pool import PoolEntry, StrategyPool
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
