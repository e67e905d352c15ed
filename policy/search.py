"""Strategy-level local search (hill climbing) around the pool's best strategies.

The policy's action space cannot express every baseline (pipelines, LP-rebalanced shares, list
schedules), so searching only around actions never improves on a baseline that wins. These moves
work on any `Strategy` (every group listed explicitly), so the search starts from whatever is best
in the pool, baseline or not:

  shift     move samples of one device to another (1 sample or a fraction of the source's share)
  drop      remove a device: its samples go to the other holders in proportion to their shares
  sync      switch all-reduce <-> parameter server (PS on a random holder or device)
  copy      give a run of groups the decision of the group before/after it (moves a stage
            boundary, merges stages)
  micro     split every share in two micro-batches, or merge them back
  priority  set the execution priority
Each move applies to one of three scopes: every group, a contiguous run of groups, or one group.
Consecutive candidates differ from the base in few groups, so the incremental `Lowerer` re-lowers
little. Accept-if-better (on the effective time, OOM penalty folded in).
"""

from __future__ import annotations

import json
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfplace.strategy import GroupDecision, Strategy

MOVES = ("shift", "shift", "shift", "drop", "sync", "copy", "copy", "micro", "priority")


def explicit(strategy: Strategy, group_names: Sequence[str]) -> Strategy:
    """The same strategy with every group listed (no default)."""
    return Strategy(strategy.global_batch_size, strategy.max_groups, None,
                    {g: strategy.decision_for(g) for g in group_names}, strategy.graph)


def strategy_key(s: Strategy) -> str:
    body = s.to_json()
    body.pop("graph", None)
    return json.dumps(body, sort_keys=True)


def _counts(d: GroupDecision) -> Dict[str, int]:
    return {dev: sum(mb) for dev, mb in d.shares}


def _rebuild(d: GroupDecision, counts: Dict[str, int], device_order: Sequence[str],
             micro: Optional[bool] = None) -> GroupDecision:
    old_mb = {dev: len(mb) for dev, mb in d.shares}
    shares = []
    for dev in device_order:
        n = counts.get(dev, 0)
        if n <= 0:
            continue
        k = (2 if micro else 1) if micro is not None else old_mb.get(dev, 1)
        k = max(1, min(k, n))
        shares.append((dev, tuple(n // k + (1 if i < n % k else 0) for i in range(k))))
    sync, ps = d.sync, d.ps_device
    return GroupDecision(tuple(shares), sync, ps, d.priority)


def _scope(rng: np.random.Generator, g: int) -> List[int]:
    r = rng.random()
    if r < 0.35:
        return list(range(g))
    if r < 0.75:
        length = int(rng.integers(1, max(2, g // 3) + 1))
        start = int(rng.integers(0, max(1, g - length + 1)))
        return list(range(start, min(g, start + length)))
    return [int(rng.integers(g))]


def neighbour(rng: np.random.Generator, strategy: Strategy, group_names: Sequence[str],
              device_names: Sequence[str]) -> Optional[Strategy]:
    """One random move of `strategy` (every group listed); None if the move changed nothing."""
    groups = dict(strategy.groups)
    g = len(group_names)
    move = MOVES[int(rng.integers(len(MOVES)))]
    scope = _scope(rng, g)
    changed = False
    if move in ("shift", "drop"):
        src = device_names[int(rng.integers(len(device_names)))]
        dst = device_names[int(rng.integers(len(device_names)))]
        frac = float(rng.choice([0.0, 0.1, 0.25, 0.5]))
        for i in scope:
            d = groups[group_names[i]]
            c = _counts(d)
            have = c.get(src, 0)
            if have <= 0:
                continue
            if move == "drop":
                others = {k: v for k, v in c.items() if k != src}
                if not others:
                    continue
                tot = sum(others.values())
                add = {k: have * v / tot for k, v in others.items()}
                base = {k: int(np.floor(x)) for k, x in add.items()}
                rest = have - sum(base.values())
                for k in sorted(add, key=lambda k: add[k] - base[k], reverse=True)[:rest]:
                    base[k] += 1
                c.pop(src)
                for k, v in base.items():
                    c[k] += v
            else:
                if dst == src:
                    continue
                n = max(1, int(round(have * frac)))
                c[src] = have - n
                c[dst] = c.get(dst, 0) + n
            nd = _rebuild(d, c, device_names)
            if d.sync == "ps" and d.ps_device is None:
                continue
            groups[group_names[i]] = nd
            changed = True
    elif move == "sync":
        to_ps = bool(rng.random() < 0.5)
        ps = device_names[int(rng.integers(len(device_names)))]
        for i in scope:
            d = groups[group_names[i]]
            if to_ps:
                if d.sync == "ps" and d.ps_device == ps:
                    continue
                nd = GroupDecision(d.shares, "ps", ps, d.priority)
            else:
                if d.sync == "allreduce":
                    continue
                nd = GroupDecision(d.shares, "allreduce", None, d.priority)
            groups[group_names[i]] = nd
            changed = True
    elif move == "copy":
        lo, hi = scope[0], scope[-1]
        src = lo - 1 if (rng.random() < 0.5 and lo > 0) or hi == g - 1 else hi + 1
        if 0 <= src < g:
            ref = groups[group_names[src]]
            for i in scope:
                if groups[group_names[i]] != ref:
                    groups[group_names[i]] = ref
                    changed = True
    elif move == "micro":
        on = bool(rng.random() < 0.5)
        for i in scope:
            d = groups[group_names[i]]
            nd = _rebuild(d, _counts(d), device_names, micro=on)
            if nd != d:
                groups[group_names[i]] = nd
                changed = True
    else:  # priority
        p = int(rng.integers(0, 3))
        for i in scope:
            d = groups[group_names[i]]
            if d.priority != p:
                groups[group_names[i]] = GroupDecision(d.shares, d.sync, d.ps_device, p)
                changed = True
    if not changed:
        return None
    return Strategy(strategy.global_batch_size, strategy.max_groups, None, groups, strategy.graph)


class HillClimber:
    """Accept-if-better search over strategies; `step(n)` evaluates up to n new neighbours."""

    def __init__(self, task, pool, rng: np.random.Generator, source: str = "strategy search"):
        self.task, self.pool, self.rng, self.source = task, pool, rng, source
        self.groups = list(task.grouping.group_names)
        self.devices = list(task.cluster.device_names)
        self.seen: set = set()
        self.evaluations = 0

    def _start(self):
        entries = self.pool.entries
        if len(entries) > 1 and self.rng.random() < 0.2:  # sometimes climb from a runner-up
            return entries[int(self.rng.integers(1, min(4, len(entries))))]
        return entries[0]

    def step(self, n: int) -> int:
        from tfplace.policy.pool import PoolEntry
        improved = 0
        for _ in range(n):
            base = self._start()
            cur = explicit(base.strategy, self.groups)
            cand = None
            for _ in range(8):
                cand = neighbour(self.rng, cur, self.groups, self.devices)
                if cand is not None and strategy_key(cand) not in self.seen:
                    break
                cand = None
            if cand is None:
                continue
            self.seen.add(strategy_key(cand))
            try:
                ev = self.task.evaluate_strategy(cand)
            except Exception:  # noqa: BLE001 - a move the lowering refuses is just skipped
                continue
            self.evaluations += 1
            entry = PoolEntry(self.source, cand, ev.time_s, ev.effective_time_s, ev.oom, 0, None)
            if self.pool.add(entry):
                improved += 1
        return improved
