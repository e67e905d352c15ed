"""Instance layouts: where the instances of an op run, derived from its group's decision.

A layout is a tuple of entries (device, samples, lo, hi):
  * a replica layout (REP) has one entry per micro-batch, in the order of the decision's shares,
    with samples > 0 and consecutive sample ranges [lo, hi) that tile [0, B);
  * a mirror layout (HOLD, UPD, BOTH) has one entry per device with samples = 0 and [0, B).
Layouts are interned: equal tuples get the same id, so everything keyed by layout ids (the edge
patterns) is shared between groups, strategies and evaluations.

Per decision (memoised): ids of its REP, HOLD, UPD and BOTH layouts (indexed by the LK_*
constants of tfplace.lowering.graph_index), its sync code (0 all-reduce, 1 PS) and priority.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from tfplace.formats.cluster import Cluster
from tfplace.formats.errors import InputError
from tfplace.formats.strategy import GroupDecision

Entry = Tuple[int, int, int, int]
SYNC_ALLREDUCE, SYNC_PS = 0, 1


class GrowArray:
    """An int64 array that grows by appending blocks, with capacity doubling (amortised O(1) per
    element, so caches that grow during a search never re-copy everything per evaluation)."""

    def __init__(self, width: int = 1):
        self._data = np.zeros((16, width), dtype=np.int64)
        self.size = 0

    def extend(self, block: np.ndarray) -> None:
        block = np.asarray(block, dtype=np.int64).reshape(-1, self._data.shape[1])
        need = self.size + len(block)
        if need > len(self._data):
            grown = np.zeros((max(need, 2 * len(self._data)), self._data.shape[1]), dtype=np.int64)
            grown[:self.size] = self._data[:self.size]
            self._data = grown
        self._data[self.size:need] = block
        self.size = need

    def column(self, i: int) -> np.ndarray:
        """View of column i of the filled rows."""
        return self._data[:self.size, i]


class LayoutTable:
    """Interned layouts plus flat arrays over all of them (rebuilt lazily when new ones appear).

    Arrays (Y layouts, Z entries): lay_ptr[Y+1], lay_size[Y]; lay_dev[Z], lay_samples[Z],
    lay_lo[Z], lay_hi[Z] (int64).
    """

    def __init__(self, cluster: Cluster, global_batch_size: int):
        self.cluster = cluster
        self.batch = global_batch_size
        self.entries: List[Tuple[Entry, ...]] = []
        self._ids: Dict[Tuple[Entry, ...], int] = {}
        self._decisions: Dict[GroupDecision, Tuple[Tuple[int, int, int, int], int, int]] = {}
        self._device_index = {d.name: i for i, d in enumerate(cluster.devices)}
        self._rows = GrowArray(4)       # entries of all layouts, (dev, samples, lo, hi)
        self._ptr = [0]
        self._flushed = 0               # layouts already in _rows
        self._arrays = None

    def intern(self, entries: Tuple[Entry, ...]) -> int:
        lid = self._ids.get(entries)
        if lid is None:
            lid = self._ids[entries] = len(self.entries)
            self.entries.append(entries)
            self._arrays = None
        return lid

    def for_decision(self, decision: GroupDecision, field: str, source: str) -> Tuple[Tuple[int, int, int, int], int, int]:
        """((rep, hold, upd, both) layout ids, sync code, priority) of one group decision."""
        cached = self._decisions.get(decision)
        if cached is None:
            cached = self._decisions[decision] = self._build(decision, field, source)
        return cached

    def _build(self, decision: GroupDecision, field: str, source: str):
        b = self.batch
        total = decision.total_samples
        if total != b:
            raise InputError(source, f"{field}.shares", f"samples sum to {total}, the global batch is {b}",
                             f"make the shares add up to {b}")
        rep: List[Entry] = []
        hold: List[Entry] = []
        lo = 0
        index = self._device_index
        for name, micro in decision.shares:
            dev = index.get(name)
            if dev is None:
                dev = self.cluster.device_index(name, source, f"{field}.shares.{name}")  # raises
            if not hold or all(e[0] != dev for e in hold):
                hold.append((dev, 0, 0, b))
            for size in micro:
                if size <= 0:
                    raise InputError(source, f"{field}.shares.{name}", f"micro-batch size {size} is not > 0",
                                     "give positive sample counts")
                rep.append((dev, int(size), lo, lo + int(size)))
                lo += int(size)
        if decision.sync == "ps":
            if decision.ps_device is None:
                raise InputError(source, f"{field}.ps_device", 'missing while "sync" is "ps"',
                                 "name the device that aggregates the gradients")
            ps = self.cluster.device_index(decision.ps_device, source, f"{field}.ps_device")
            upd = [(ps, 0, 0, b)]
            both = hold + ([] if any(e[0] == ps for e in hold) else upd)
            sync = SYNC_PS
            ids = (self.intern(tuple(rep)), self.intern(tuple(hold)), self.intern(tuple(upd)), self.intern(tuple(both)))
        elif decision.sync == "allreduce":
            sync = SYNC_ALLREDUCE
            hold_id = self.intern(tuple(hold))
            ids = (self.intern(tuple(rep)), hold_id, hold_id, hold_id)
        else:
            raise InputError(source, f"{field}.sync", f"is {decision.sync!r}", 'use "allreduce" or "ps"')
        prio = 0 if decision.priority is None else int(decision.priority)
        return ids, sync, prio

    def arrays(self):
        """(lay_ptr, lay_size, lay_dev, lay_samples, lay_lo, lay_hi) over all interned layouts."""
        if self._arrays is None:
            new = self.entries[self._flushed:]
            self._rows.extend(np.array([x for e in new for x in e], dtype=np.int64))
            for e in new:
                self._ptr.append(self._ptr[-1] + len(e))
            self._flushed = len(self.entries)
            ptr = np.array(self._ptr, dtype=np.int64)
            r = self._rows
            self._arrays = (ptr, np.diff(ptr), r.column(0), r.column(1), r.column(2), r.column(3))
        return self._arrays
