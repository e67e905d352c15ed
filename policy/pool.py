"""Pool of the best strategies found for one (graph, cluster), seeded with every baseline, so the
reported best is never worse than the best baseline.

Entries are kept sorted by effective time (OOM penalty folded in), de-duplicated by strategy
content, at most `size` of them; baselines are always kept (they are the floor and the table).
JSON round-trip (`to_json` / `from_json`) for checkpoints — never pickle.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from tfplace.formats.jsonio import FieldReader
from tfplace.formats.reports import rank_time_s
from tfplace.formats.strategy import GroupDecision, Strategy, strategy_from_reader

from tfplace.policy import actions as A


@dataclasses.dataclass(frozen=True)
class PoolEntry:
    """One strategy with its simulated result. action: the policy's action that decodes to it, or
    None (a baseline or a search result: not every strategy is in the action space; a baseline
    whose nearest action times the same carries that action, StrategyPool.give_action)."""
    source: str
    strategy: Strategy
    time_s: float
    effective_time_s: float
    oom: bool
    step: int
    action: Optional[Dict[str, np.ndarray]] = None

    def to_json(self) -> Dict[str, Any]:
        return {"source": self.source, "strategy": self.strategy.to_json(), "time_s": self.time_s,
                "effective_time_s": self.effective_time_s, "oom": self.oom, "step": self.step,
                "action": A.action_to_json(self.action)}

    @staticmethod
    def from_json(obj: Dict[str, Any]) -> "PoolEntry":
        strategy = strategy_from_reader(FieldReader(obj["strategy"], "checkpoint state", "pool.strategy"))
        return PoolEntry(obj["source"], strategy, float(obj["time_s"]), float(obj["effective_time_s"]),
                         bool(obj["oom"]), int(obj["step"]), A.action_from_json(obj.get("action")))


def _decision_key(d: Optional[GroupDecision]):
    return None if d is None else (tuple(sorted(d.shares)), d.sync, d.ps_device, d.priority)


def strategy_key(s: Strategy) -> tuple:
    """A hashable key, equal for strategies that mean the same: every field of the file format but
    the graph's name (and the source it came from), each group's devices in any order. The pool's
    and the search's sets of strategies already seen hold these; a tuple rather than a JSON dump, as
    the search keys about four strategies per simulation."""
    return (s.global_batch_size, s.max_groups, s.bucket_bytes, s.min_batch_per_replica, _decision_key(s.default),
            tuple(sorted((name, _decision_key(d)) for name, d in s.groups.items())))


def _placement_of(d: GroupDecision) -> tuple:
    """What a decision makes the rewrite do: its micro-batches per device (in any device order),
    the aggregation (none to do on one device without a PS) and the priority (None runs as 0)."""
    shares = tuple(sorted(d.shares))
    if d.sync == "ps":
        sync = ("ps", d.ps_device)
    else:
        sync = ("allreduce",) if len(shares) > 1 else ()
    return shares, sync, 0 if d.priority is None else int(d.priority)


def placement_key(s: Strategy, group_names: Sequence[str]) -> tuple:
    """A hashable key, equal for strategies that place the groups `group_names` (a grouping's
    names, at s.max_groups) the same way, however the file spells it: each group's decision as
    resolved (its own or the default), the bucket size only where gradients are bucketed (a group
    that all-reduces across devices or sends them to a parameter server). A single-device default
    and one decision per group giving that device every sample are one placement (strategy_key
    tells them apart). Raises InputError when a group has no decision."""
    per_group = tuple(_placement_of(s.decision_for(g)) for g in group_names)
    bucketed = any(sync and (sync[0] == "ps" or sync == ("allreduce",)) for _, sync, _ in per_group)
    return s.global_batch_size, (s.bucket_bytes if bucketed else None), per_group


def _rank(entry: PoolEntry) -> float:
    """The pool's order: effective time as rank_time_s has it."""
    return rank_time_s(entry.effective_time_s)


class StrategyPool:
    def __init__(self, size: int):
        self.size = size
        self.baselines: List[PoolEntry] = []
        self.entries: List[PoolEntry] = []
        self._keys: set = set()

    def add_baseline(self, entry: PoolEntry) -> None:
        self.baselines.append(entry)
        self.add(entry)

    def add(self, entry: PoolEntry) -> bool:
        """Inserts `entry` if it is new and among the best `size`; True if it became the best."""
        key = strategy_key(entry.strategy)
        if key in self._keys:
            return False
        was_best = not self.entries or _rank(entry) < _rank(self.entries[0])
        self.entries.append(entry)
        self._keys.add(key)
        self.entries.sort(key=_rank)
        while len(self.entries) > self.size:
            drop = self.entries.pop()
            self._keys.discard(strategy_key(drop.strategy))
        return was_best and self.entries[0] is entry

    def give_action(self, entry: PoolEntry, action: Dict[str, np.ndarray]) -> None:
        """Lets the kept `entry` carry `action` (one that decodes to a strategy of the same time:
        a start for action-level search and an imitation target), in place, keeping its rank."""
        for i, e in enumerate(self.entries):
            if e is entry:
                self.entries[i] = dataclasses.replace(e, action=action)

    @property
    def best(self) -> PoolEntry:
        return self.entries[0]

    @property
    def best_fitting(self) -> Optional[PoolEntry]:
        """The fastest strategy (by simulated time) that fits in device memory, kept entries and
        baselines alike; None when none fits. The best by effective time can run out of memory:
        the penalty makes a fast strategy slightly over memory rank above a slower one that fits.
        Ties as in the pool's order (a fitting strategy's effective time is its time): the pool's
        best when it fits."""
        return min((e for e in self.entries + self.baselines if not e.oom), key=_rank, default=None)

    def best_with_action(self) -> Optional[PoolEntry]:
        return next((e for e in self.entries if e.action is not None), None)

    def best_baseline(self) -> PoolEntry:
        """The fastest baseline by effective time; of baselines tied in the pool's order
        (rank_time_s), the first."""
        return min(self.baselines, key=lambda e: rank_time_s(e.effective_time_s))

    def baseline_times(self) -> Dict[str, Dict[str, Any]]:
        return {e.source: {"time_s": e.time_s, "oom": e.oom} for e in self.baselines}

    def to_json(self) -> Dict[str, Any]:
        return {"size": self.size, "baselines": [e.to_json() for e in self.baselines],
                "entries": [e.to_json() for e in self.entries]}

    @staticmethod
    def from_json(obj: Dict[str, Any]) -> "StrategyPool":
        pool = StrategyPool(int(obj["size"]))
        pool.baselines = [PoolEntry.from_json(e) for e in obj["baselines"]]
        for e in obj["entries"]:
            pool.add(PoolEntry.from_json(e))
        return pool
