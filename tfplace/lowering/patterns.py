"""Edge patterns: how one tensor gets from its producer's instances to its consumers' instances.

A pattern depends only on (tensor class, producer layout, consumer slots), where a consumer slot
is (consumer layout, mode) and mode is 0 (plain), 1 (partial, replica-local), 2 (partial,
aggregated by all-reduce) or 3 (partial, aggregated by a PS). It is a small task graph template:

  template tasks   kind (RESPLIT, SUM, TRANSFER, COLLECTIVE), device (lane or destination),
                   src (TRANSFER), nsamp / full (output bytes = nsamp * bytes_per_sample +
                   full * tensor_bytes), lo / hi (sample range), traffic (memory-traffic
                   multiple of the output bytes for RESPLIT/SUM), coll (collective group id),
                   inputs (refs)
  template buffers (task, device, nsamp, full): one per task, one per participant of a collective
  outputs          per slot, per consumer instance: the ref the instance reads

A ref >= 0 names a template buffer; a ref < 0 names producer instance -(ref+1)'s own output.
Transfers are de-duplicated per (source buffer, destination, slice) inside a pattern, which is
per (tensor, destination device) since every consumer of a tensor is in its one pattern.

Rules:
  * batched: a consumer instance with range [a, b) reads the producer slices overlapping it;
    slices on other devices are transferred (their bytes); unless the consumer reads exactly one
    whole producer output, a RESPLIT task on the consumer's device cuts/concatenates (2x bytes
    of memory traffic). A mirrored producer (range [0, B)) serves each device from its own copy,
    else a copy on the same host, else the first.
  * full: each consumer device reads its own copy or receives one (same host first).
  * small constant (CLS_SMALL_CONST): as full, but where a source instance on a CPU device is
    read on two or more TF tasks, TensorFlow copies it onto each of those tasks
    (ReplicateConstantsPass), so a CPU consumer reads it without a transfer.
  * partial, replica-local: a consumer replica reads the overlapping producer replica on its
    device, else the first overlapping one. Exact only in the producer's layout; readers without
    a batch axis and batch-norm gradients are pinned there (tfplace.lowering.graph_index), the
    rest (a batch statistic read by batched ops of another split) get this per-replica
    approximation.
  * partial, aggregated: micro-batches on one device are summed there first (SUM); all-reduce
    runs one ring COLLECTIVE over the producing devices (update devices outside them receive the
    result from a participant); PS sends every device's partial to the PS, which SUMs them.
    Partials are full-size tensors (never 1/n).
"""

from __future__ import annotations

import bisect
from typing import Dict, List, Sequence, Tuple

import numpy as np

from tfplace.lowering.costs import LinkCosts
from tfplace.lowering.graph_index import CLS_BATCHED, CLS_FULL, CLS_SMALL_CONST
from tfplace.lowering.layouts import GrowArray
from tfplace.lowering.placed_graph import TASK_COLLECTIVE, TASK_RESPLIT, TASK_SUM, TASK_TRANSFER

Entry = Tuple[int, int, int, int]
MODE_PLAIN, MODE_LOCAL, MODE_ALLREDUCE, MODE_PS = 0, 1, 2, 3
_TASK_FIELDS = ("kind", "dev", "src", "nsamp", "full", "lo", "hi", "traffic", "coll")


class _Builder:
    def __init__(self, prod: Sequence[Entry], links: LinkCosts, batch: int):
        self.prod, self.links, self.batch = prod, links, batch
        # Flat rows, ready for the store: tasks (9 values each, _TASK_FIELDS), inputs (task,
        # ref) pairs, buffers (task, device, nsamp, full).
        self.tasks: List[int] = []
        self.inputs: List[int] = []
        self.bufs: List[int] = []
        self.num_tasks = 0
        self.buf_dev: List[int] = []
        self.memo: Dict[tuple, object] = {}

    def add(self, kind, dev, src, nsamp, full, lo, hi, traffic, coll, inputs, out_devs) -> List[int]:
        i = self.num_tasks
        self.num_tasks += 1
        self.tasks.extend((kind, dev, src, nsamp, full, lo, hi, traffic, coll))
        for r in inputs:
            self.inputs.extend((i, r))
        refs = []
        for d in out_devs:
            refs.append(len(self.buf_dev))
            self.buf_dev.append(d)
            self.bufs.extend((i, d, nsamp, full))
        return refs

    def dev_of(self, ref: int) -> int:
        return self.prod[-ref - 1][0] if ref < 0 else self.buf_dev[ref]

    def to_device(self, ref: int, dst: int, nsamp: int, full: int, lo: int, hi: int) -> int:
        """`ref` itself if it lives on dst, else the (shared) transfer of it to dst."""
        src = self.dev_of(ref)
        if src == dst:
            return ref
        key = ("x", ref, dst, lo, hi)
        if key not in self.memo:
            self.memo[key] = self.add(TASK_TRANSFER, dst, src, nsamp, full, lo, hi, 0, -1, [ref], [dst])[0]
        return self.memo[key]

    def nearest(self, candidates: Sequence[int], dev_of, dst: int) -> int:
        """The candidate on dst, else the first on dst's host, else the first."""
        host = self.links.host
        for c in candidates:
            if dev_of(c) == dst:
                return c
        for c in candidates:
            if host[dev_of(c)] == host[dst]:
                return c
        return candidates[0]

    # ---- the three tensor classes --------------------------------------------------------------
    def batched(self, entries: Sequence[Entry]) -> List[int]:
        prod = self.prod
        replicated = prod[0][1] > 0
        starts = [p[2] for p in prod]  # replica ranges are consecutive, so starts are sorted
        out = []
        for d, _, lo, hi in entries:
            if replicated:
                pieces = []
                k = bisect.bisect_right(starts, lo) - 1
                while k < len(prod) and prod[k][2] < hi:
                    pieces.append((k, max(lo, prod[k][2]), min(hi, prod[k][3])))
                    k += 1
            else:
                k = -self.nearest([-(k + 1) for k in range(len(prod))], self.dev_of, d) - 1
                pieces = [(k, lo, hi)]
            k0, a0, b0 = pieces[0]
            if len(pieces) == 1 and (a0, b0) == (prod[k0][2], prod[k0][3]):
                out.append(self.to_device(-(k0 + 1), d, b0 - a0, 0, a0, b0))
                continue
            key = ("r", d, lo, hi)
            if key not in self.memo:
                ins = [self.to_device(-(k + 1), d, b - a, 0, a, b) for k, a, b in pieces]
                self.memo[key] = self.add(TASK_RESPLIT, d, -1, hi - lo, 0, lo, hi, 2, -1, ins, [d])[0]
            out.append(self.memo[key])
        return out

    def full(self, entries: Sequence[Entry]) -> List[int]:
        sources = [-(k + 1) for k in range(len(self.prod))]
        return [self.to_device(self.nearest(sources, self.dev_of, d), d, 0, 1, 0, self.batch) for d, *_ in entries]

    def small_const(self, slots: Sequence[Sequence[Entry]]) -> List[List[int]]:
        """`full` for every slot at once: a source instance on a CPU device whose readers are
        on two or more TF tasks reaches its CPU readers without a transfer (the module doc)."""
        links = self.links
        sources = [-(k + 1) for k in range(len(self.prod))]
        picks = [[self.nearest(sources, self.dev_of, d) for d, *_ in entries] for entries in slots]
        tasks_of: Dict[int, set] = {}
        for entries, refs in zip(slots, picks):
            for (d, *_), r in zip(entries, refs):
                tasks_of.setdefault(r, set()).add(links.task[d])
        return [[r if links.is_cpu[d] and links.is_cpu[self.dev_of(r)] and len(tasks_of[r]) > 1
                 else self.to_device(r, d, 0, 1, 0, self.batch) for (d, *_), r in zip(entries, refs)]
                for entries, refs in zip(slots, picks)]

    def local(self, entries: Sequence[Entry]) -> List[int]:
        out = []
        for d, _, lo, hi in entries:
            over = [-(k + 1) for k, p in enumerate(self.prod) if max(lo, p[2]) < min(hi, p[3])]
            on_dev = [r for r in over if self.dev_of(r) == d]
            out.append(self.to_device((on_dev or over)[0], d, 0, 1, 0, self.batch))
        return out

    def local_sums(self) -> List[Tuple[int, int]]:
        """(device, ref) per producing device, micro-batches summed on their device first."""
        if "sums" not in self.memo:
            by_dev: Dict[int, List[int]] = {}
            for k, p in enumerate(self.prod):
                by_dev.setdefault(p[0], []).append(-(k + 1))
            sums = []
            for d, refs in by_dev.items():
                if len(refs) > 1:
                    refs = self.add(TASK_SUM, d, -1, 0, 1, 0, self.batch, len(refs) + 1, -1, refs, [d])
                sums.append((d, refs[0]))
            self.memo["sums"] = sums
        return self.memo["sums"]

    def allreduce(self, entries: Sequence[Entry]) -> List[int]:
        contrib = self.local_sums()
        if len(contrib) == 1:
            d0, ref = contrib[0]
            return [self.to_device(ref, d, 0, 1, 0, self.batch) for d, *_ in entries]
        if "coll" not in self.memo:
            cid = self.links.collective([d for d, _ in contrib])
            parts = self.links.coll_parts[cid]
            refs = self.add(TASK_COLLECTIVE, -1, -1, 0, 1, 0, self.batch, 0, cid, [r for _, r in contrib], parts)
            self.memo["coll"] = dict(zip(parts, refs))
        by_dev = self.memo["coll"]
        sources = list(by_dev.values())
        return [by_dev.get(d) if d in by_dev else self.to_device(self.nearest(sources, self.dev_of, d), d, 0, 1, 0, self.batch)
                for d, *_ in entries]

    def ps(self, entries: Sequence[Entry]) -> List[int]:
        server = entries[0][0]
        key = ("ps", server)
        if key not in self.memo:
            ins = [self.to_device(r, server, 0, 1, 0, self.batch) for _, r in self.local_sums()]
            if len(ins) > 1:
                ins = self.add(TASK_SUM, server, -1, 0, 1, 0, self.batch, len(ins) + 1, -1, ins, [server])
            self.memo[key] = ins[0]
        red = self.memo[key]
        return [self.to_device(red, d, 0, 1, 0, self.batch) for d, *_ in entries]


def build_pattern(cls: int, prod: Sequence[Entry], slots: Sequence[Tuple[Sequence[Entry], int]],
                  links: LinkCosts, batch: int):
    """Builds one pattern (see the module docstring): flat lists (tasks: 9 values per task in
    _TASK_FIELDS order; inputs: (task, ref) pairs; buffers: (task, device, nsamp, full)) and
    the outputs, one list of refs per slot."""
    b = _Builder(prod, links, batch)
    if cls == CLS_SMALL_CONST:
        outs = b.small_const([entries for entries, _ in slots])
        return b.tasks, b.inputs, b.bufs, outs
    outs: List[List[int]] = []
    for entries, mode in slots:
        if cls == CLS_BATCHED:
            outs.append(b.batched(entries))
        elif cls == CLS_FULL or mode == MODE_PLAIN:
            outs.append(b.full(entries))
        elif mode == MODE_LOCAL:
            outs.append(b.local(entries))
        elif mode == MODE_ALLREDUCE:
            outs.append(b.allreduce(entries))
        else:
            outs.append(b.ps(entries))
    return b.tasks, b.inputs, b.bufs, outs


class PatternStore:
    """Interned patterns with their rows concatenated over patterns: pattern p's rows of a field
    group lie in ptr[group][p] .. ptr[group][p+1]. New patterns are kept as Python lists and
    turned into arrays in one go by `arrays()`. `num_rows` lets the owner bound its size."""
    _GROUPS = {"task": _TASK_FIELDS, "in": ("in_task", "in_ref"), "tb": ("tb_task", "tb_dev", "tb_nsamp", "tb_full"),
               "out": ("out_ref",), "slot": ("slot_off",)}

    def __init__(self, links: LinkCosts, batch: int):
        self.links, self.batch = links, batch
        self._ids: Dict[tuple, int] = {}
        self._rows = {g: GrowArray(len(fields)) for g, fields in self._GROUPS.items()}
        self._ptr = {g: GrowArray(1) for g in self._GROUPS}
        for g in self._GROUPS:
            self._ptr[g].extend(np.zeros(1))
        self._new = {g: [] for g in self._GROUPS}       # flat rows of patterns not yet flushed
        self._counts = {g: [] for g in self._GROUPS}    # rows per new pattern
        self._arrays = None
        self.num_rows = 0

    def get(self, key: tuple, layouts) -> int:
        """Pattern id for key = (cls, producer layout id, ((consumer layout id, mode), ...))."""
        pid = self._ids.get(key)
        if pid is not None:
            return pid
        cls, lp, slots = key
        prod = layouts[lp]
        new, counts = self._new, self._counts
        same = True
        for lc, mode in slots:
            if lc != lp or mode > MODE_LOCAL:
                same = False
                break
        if same:
            # Same layout on both ends: instance k reads producer instance k, nothing to add.
            ident = [-(k + 1) for k in range(len(prod))]
            outs, tasks, inputs, bufs = [ident] * len(slots), [], [], []
        else:
            tasks, inputs, bufs, outs = build_pattern(cls, prod, [(layouts[lc], mode) for lc, mode in slots],
                                                      self.links, self.batch)
        new["task"].extend(tasks)
        new["in"].extend(inputs)
        new["tb"].extend(bufs)
        off = 0
        for o in outs:
            new["slot"].append(off)
            new["out"].extend(o)
            off += len(o)
        for g, k in (("task", len(tasks) // 9), ("in", len(inputs) // 2), ("tb", len(bufs) // 4), ("out", off),
                     ("slot", len(outs))):
            counts[g].append(k)
        self.num_rows += len(tasks) // 9 + len(inputs) // 2 + off
        pid = self._ids[key] = len(self._ids)
        self._arrays = None
        return pid

    def arrays(self) -> Tuple[dict, dict]:
        """(field -> concatenated int64 array, group -> ptr array [P+1])."""
        if self._arrays is None:
            for g in self._GROUPS:
                if self._counts[g]:
                    self._rows[g].extend(np.array(self._new[g], dtype=np.int64))
                    ptr = self._ptr[g]
                    last = ptr.column(0)[-1]
                    ptr.extend(last + np.cumsum(np.array(self._counts[g], dtype=np.int64)))
                    self._new[g], self._counts[g] = [], []
            self._arrays = ({f: self._rows[g].column(i) for g, fields in self._GROUPS.items()
                             for i, f in enumerate(fields)},
                            {g: self._ptr[g].column(0) for g in self._GROUPS})
        return self._arrays
