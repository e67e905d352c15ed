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
  bucket    set the gradient bucket size (strategy-wide; BUCKET_CHOICES_BYTES)
Memory moves (chosen most of the time while the base strategy is OOM; they read the base's
per-device peak memory, so the search cuts the worst excess before it looks at time):
  mb_split  double the micro-batches of groups on the most over-full device (activations scale
            with the micro-batch size)
  offload   move the over-full device's samples of a run of its groups (the first or last of
            them: a stage boundary) to the device with the most free memory; for a group held
            only there this moves its weights and optimizer slots (a model-parallel stage)
  ps_free   parameter server on the device with the most free memory for groups on the
            over-full device (their variables and slots leave the workers)
  drop_full remove the over-full device from groups it shares with other devices
`memory_partitions` gives memory-balanced model-parallel seeds (contiguous groups on devices in
proportion to their memory), used when every baseline is OOM.
Each move applies to one of three scopes: every group, a contiguous run of groups, or one group.
Consecutive candidates differ from the base in few groups, so the incremental `Lowerer` re-lowers
little. Accept-if-better (on the effective time, OOM penalty folded in).

Sweep: a systematic pass over single-group changes of the pool's best, in a shuffled order, first
improvement taken: the group's gradient sync (all-reduce, or the parameter server on each device),
its priority, its neighbour's decision, or all its samples on one device. Late in a search most
gains are such single-group changes (a parameter server moved, one group's update taken off its
busiest device), which a random move finds only by chance (one given change among 64 groups and
6 devices is about 1 in 30 000 random moves). Once the random moves stall it gets a share of the
moves as it pays (HillClimber.sweep_share); it closes after a whole pass without a new best and
opens again when the best changes. Guided by the policy, the changes the policy favours come
first (sweep_order).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfplace.formats.strategy import GroupDecision, Strategy
from tfplace.policy.pool import PoolEntry, strategy_key

MOVES = ("shift", "shift", "shift", "drop", "sync", "copy", "copy", "micro", "priority", "bucket")
# the gradient bucket sizes the `bucket` move chooses from (1 = one all-reduce per gradient)
BUCKET_CHOICES_BYTES = (1, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
# The sweep waits until SWEEP_AFTER random moves in a row found nothing better: taken early, its
# single-group gains can lock a strategy into a mix of placements that no single-group change
# leaves, where the random moves (whole runs of groups) would still have reached a coherent plan.
# Then its share of the moves follows what it gained lately against the random moves (an
# exponential average of the relative cut of the best per evaluation, GAIN_DECAY per step), within
# [SWEEP_SHARE_MIN, SWEEP_SHARE_MAX]: the random moves keep a quarter, as their gains are rarer
# but larger (a stage boundary, a device dropped).
SWEEP_AFTER = 30
SWEEP_SHARE_MIN, SWEEP_SHARE_MAX = 0.1, 0.75
GAIN_DECAY = 0.02
MEMORY_MOVES = ("mb_split", "mb_split", "offload", "offload", "offload", "ps_free", "drop_full")


def explicit(strategy: Strategy, group_names: Sequence[str]) -> Strategy:
    """The same strategy with every group listed (no default)."""
    return dataclasses.replace(strategy, default=None, groups={g: strategy.decision_for(g) for g in group_names})


def split_samples(samples: int, k: int) -> Tuple[int, ...]:
    """`samples` split into k micro-batches whose sizes differ by at most one, larger first."""
    return tuple(samples // k + (1 if i < samples % k else 0) for i in range(k))


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
        shares.append((dev, split_samples(n, k)))
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
    if move == "bucket":
        size = int(rng.choice([b for b in BUCKET_CHOICES_BYTES if b != strategy.bucket_bytes]))
        return dataclasses.replace(strategy, bucket_bytes=size)
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
    return dataclasses.replace(strategy, default=None, groups=groups)


SweepOption = Tuple[int, str, object]  # (group index, field, value)


def sweep_options(num_groups: int, device_names: Sequence[str]) -> List[SweepOption]:
    """Every single-group change the sweep tries, per group: all-reduce (value None) or the
    parameter server on each device ("sync"), priority 0-2, the previous or next group's decision
    ("copy", -1 / +1), all the group's samples on one device ("alone", as many micro-batches as
    the group had on any device)."""
    out: List[SweepOption] = []
    for i in range(num_groups):
        out.append((i, "sync", None))
        out += [(i, "sync", d) for d in device_names]
        out += [(i, "priority", p) for p in range(3)]
        out += [(i, "copy", k) for k in (-1, 1) if 0 <= i + k < num_groups]
        out += [(i, "alone", d) for d in device_names]
    return out


def option_probabilities(options: Sequence[SweepOption], guide: Dict[str, np.ndarray],
                         device_names: Sequence[str]) -> np.ndarray:
    """The policy's probability of each sweep option among its group's options of the same field,
    from its marginals `guide` (ReinforceLearner.probabilities: sync [G, 2], ps_device [G, D],
    priority [G, 3], shares [G, D, L]): all-reduce P(sync 0), a server on d P(sync 1) P(ps d),
    priority p P(p), alone on d the device's P(used) over the group's sum; copy 1/2."""
    col = {d: j for j, d in enumerate(device_names)}
    use = 1.0 - np.asarray(guide["shares"], dtype=np.float64)[..., 0]
    use = use / np.maximum(use.sum(axis=1, keepdims=True), 1e-12)
    out = np.empty(len(options))
    for k, (i, field, value) in enumerate(options):
        if field == "sync":
            sync = guide["sync"][i]
            out[k] = sync[0] if value is None else sync[1] * guide["ps_device"][i, col[value]]
        elif field == "priority":
            out[k] = guide["priority"][i, value]
        elif field == "alone":
            out[k] = use[i, col[value]]
        else:
            out[k] = 0.5
    return out


def sweep_order(rng: np.random.Generator, options: List[SweepOption], device_names: Sequence[str],
                guide: Optional[Dict[str, np.ndarray]] = None) -> List[SweepOption]:
    """The sweep's order: shuffled; with the policy's marginals `guide`, drawn without replacement
    in proportion to option_probabilities (Gumbel top-k), so the changes the policy favours for
    each group come first."""
    if guide is None:
        order = rng.permutation(len(options))
    else:
        logp = np.log(np.maximum(option_probabilities(options, guide, device_names), 1e-12))
        order = np.argsort(-(logp + rng.gumbel(size=len(options))), kind="stable")
    return [options[int(k)] for k in order]


def apply_option(strategy: Strategy, group_names: Sequence[str], device_names: Sequence[str],
                 option: SweepOption) -> Optional[Strategy]:
    """`strategy` (every group listed) with one sweep option applied; None if it changes nothing."""
    i, field, value = option
    d = strategy.groups[group_names[i]]
    if field == "sync":
        nd = GroupDecision(d.shares, "allreduce", None, d.priority) if value is None \
            else GroupDecision(d.shares, "ps", value, d.priority)
    elif field == "priority":
        nd = GroupDecision(d.shares, d.sync, d.ps_device, value)
    elif field == "copy":
        nd = strategy.groups[group_names[i + value]]
    else:  # alone, with as many micro-batches as the group had on any device
        n, k = sum(_counts(d).values()), max(len(mb) for _, mb in d.shares)
        k = max(1, min(k, n))
        nd = GroupDecision(((value, split_samples(n, k)),), d.sync, d.ps_device, d.priority)
    if nd == d:
        return None
    groups = dict(strategy.groups)
    groups[group_names[i]] = nd
    return dataclasses.replace(strategy, default=None, groups=groups)


def _with_micro(d: GroupDecision, factor: int) -> GroupDecision:
    """`d` with every device's micro-batch count multiplied by `factor` (capped at its samples)."""
    shares = []
    for dev, mb in d.shares:
        n = sum(mb)
        k = max(1, min(n, len(mb) * factor))
        shares.append((dev, split_samples(n, k)))
    return GroupDecision(tuple(shares), d.sync, d.ps_device, d.priority)


def memory_neighbour(rng: np.random.Generator, strategy: Strategy, group_names: Sequence[str],
                     device_names: Sequence[str], fill: Sequence[float]) -> Optional[Strategy]:
    """One move that aims at peak memory. `fill[d]` = peak / capacity of device d under `strategy`.

    The source is the fullest device (or another over-full one), the target the emptiest (or
    another of the emptier half). None if the move changed nothing.
    """
    groups = dict(strategy.groups)
    fill = np.asarray(fill, dtype=np.float64)
    order = np.argsort(-fill)
    over = [int(i) for i in order if fill[i] > 1.0] or [int(order[0])]
    src = device_names[over[0] if rng.random() < 0.7 else over[int(rng.integers(len(over)))]]
    emptiest = [int(i) for i in np.argsort(fill) if device_names[int(i)] != src]
    if not emptiest:
        return None
    half = emptiest[:max(1, len(emptiest) // 2)]
    dst = device_names[half[0] if rng.random() < 0.6 else half[int(rng.integers(len(half)))]]
    on_src = [i for i, gname in enumerate(group_names) if groups[gname].samples_on(src) > 0]
    if not on_src:
        return None
    move = MEMORY_MOVES[int(rng.integers(len(MEMORY_MOVES)))]
    # scope: all of the source's groups, the first or last run of them (a stage boundary), or one
    r = rng.random()
    if r < 0.3:
        scope = on_src
    elif r < 0.85:
        m = int(rng.integers(1, max(2, (len(on_src) + 1) // 2) + 1))
        scope = on_src[:m] if rng.random() < 0.5 else on_src[-m:]
    else:
        scope = [on_src[int(rng.integers(len(on_src)))]]
    changed = False
    for i in scope:
        d = groups[group_names[i]]
        nd = d
        if move == "mb_split":
            nd = _with_micro(d, 2)
        elif move == "offload":
            c = _counts(d)
            have = c.get(src, 0)
            n = have if rng.random() < 0.6 else max(1, int(round(have * float(rng.choice([0.25, 0.5])))))
            c[src] = have - n
            c[dst] = c.get(dst, 0) + n
            k = max([len(mb) for dev, mb in d.shares if dev in (src, dst)] or [1])
            shares = []
            for dev in device_names:
                cnt = c.get(dev, 0)
                if cnt <= 0:
                    continue
                kk = max(1, min(cnt, k if dev in (src, dst) else len(dict(d.shares)[dev])))
                shares.append((dev, split_samples(cnt, kk)))
            ps = d.ps_device
            nd = GroupDecision(tuple(shares), d.sync, ps, d.priority)
        elif move == "ps_free":
            nd = GroupDecision(d.shares, "ps", dst, d.priority)
        else:  # drop_full
            c = _counts(d)
            have = c.pop(src, 0)
            if not c:
                continue
            tot = sum(c.values())
            add = {k: have * v / tot for k, v in c.items()}
            base = {k: int(np.floor(x)) for k, x in add.items()}
            for k in sorted(add, key=lambda k: add[k] - base[k], reverse=True)[:have - sum(base.values())]:
                base[k] += 1
            for k, v in base.items():
                c[k] += v
            nd = _rebuild(d, c, device_names)
        if nd != d:
            groups[group_names[i]] = nd
            changed = True
    if not changed:
        return None
    return dataclasses.replace(strategy, default=None, groups=groups)


def group_memory_bytes(task) -> np.ndarray:
    """Rough per-group memory at the global batch: variables x 4 (weights, gradients, two
    optimizer slots) plus every output tensor (activations kept for the backward pass)."""
    graph, grouping = task.graph, task.grouping
    g = grouping.num_groups
    params = np.zeros(g)
    for v in graph.variables:
        params[grouping.op_group[v.op]] += v.num_bytes
    acts = np.bincount(grouping.op_group[graph.tensor_op], weights=graph.tensor_bytes_at(task.batch_size),
                       minlength=g)[:g]
    return 4.0 * params + acts


def stage_partition(weights: Sequence[float], capacities: Sequence[float]) -> List[int]:
    """Stage index per group: contiguous runs whose weight is proportional to `capacities`."""
    w = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    caps = np.asarray(capacities, dtype=np.float64)
    cum = np.cumsum(w) - w / 2.0  # a group goes to the stage that holds its midpoint
    bounds = np.cumsum(caps) / caps.sum() * max(w.sum(), 1e-30)
    stage = np.searchsorted(bounds, cum, side="right")
    return [int(min(s, len(caps) - 1)) for s in stage]


def memory_partitions(task, micro_batches: Sequence[int] = (1, 4)) -> List[Tuple[str, Strategy]]:
    """Memory-balanced model-parallel strategies: contiguous groups on devices in proportion to
    their memory, over all devices in file order, the devices by memory (largest first), and the
    larger half by memory; each with the given micro-batch counts (every stage takes the batch)."""
    names = list(task.grouping.group_names)
    cluster = task.cluster
    devs = list(cluster.device_names)
    mem = {d.name: float(d.memory_bytes) for d in cluster.devices}
    by_mem = sorted(devs, key=lambda n: -mem[n])
    orders = [("file order", devs), ("by memory", by_mem)]
    if len(devs) > 2:
        orders.append(("larger half", by_mem[:max(2, len(devs) // 2)]))
    w = group_memory_bytes(task)
    b = task.batch_size
    out, keys = [], set()
    for label, order in orders:
        stage = stage_partition(w, [mem[n] for n in order])
        for k in micro_batches:
            k = max(1, min(k, b))
            mb = split_samples(b, k)
            groups = {g: GroupDecision(((order[stage[i]], mb),), "allreduce", None, None) for i, g in enumerate(names)}
            s = Strategy(b, task.max_groups, None, groups, task.graph.name)
            if strategy_key(s) not in keys:  # orders can coincide (e.g. equal memories)
                keys.add(strategy_key(s))
                out.append((f"memory partition ({label}, {k} micro-batches)", s))
    return out


def evaluate_with_fill(task, strategy: Strategy):
    """(Evaluation as `task.evaluate_strategy` computes it, peak / capacity per device)."""
    from tfplace.policy.environment import Evaluation
    r = task.simulate(strategy)
    fill = [p / c for p, c in zip(r.peak_memory_bytes, r.memory_capacity_bytes)]
    excess = max(0.0, max(f - 1.0 for f in fill))
    eff = r.iteration_time_s * (task.oom_penalty * (1.0 + excess) if r.oom else 1.0)
    return Evaluation(r.iteration_time_s, eff, r.oom, excess), fill


class HillClimber:
    """Accept-if-better search over strategies; `step(n)` evaluates up to n new neighbours.

    While the base strategy is OOM, `memory_share` of the moves are memory moves (they need the
    base's per-device peaks: kept for every strategy the climber evaluated, simulated once more
    for a pool entry it did not). `guide`: the policy's marginals, which order the sweep
    (sweep_order); None: a shuffled order."""

    def __init__(self, task, pool, rng: np.random.Generator, source: str = "strategy search",
                 memory_share: float = 0.75, guide: Optional[Dict[str, np.ndarray]] = None):
        self.task, self.pool, self.rng, self.source = task, pool, rng, source
        self.groups = list(task.grouping.group_names)
        self.devices = list(task.cluster.device_names)
        self.memory_share = memory_share
        # what each kind of move gained lately: mean relative cut of the best per evaluation
        self.gain = {"sweep": 1e-3, "random": 1e-3}
        self.seen: set = set()
        self.fill: Dict[tuple, List[float]] = {}
        self.evaluations = 0
        self.sweep = sweep_order(rng, sweep_options(len(self.groups), self.devices), self.devices, guide)
        self._sweep_pos = 0
        self._random_idle = 0  # random moves evaluated since one last found a new best
        self._sweep_idle = 0  # options passed since the pool's best last changed
        self._sweep_best: Optional[float] = None  # that best's effective time

    def _start(self):
        entries = self.pool.entries
        if len(entries) > 1 and self.rng.random() < 0.2:  # sometimes climb from a runner-up
            return entries[int(self.rng.integers(1, min(4, len(entries))))]
        return entries[0]

    def _fill_of(self, strategy: Strategy, key: tuple) -> Optional[List[float]]:
        if key not in self.fill:
            try:
                self.fill[key] = evaluate_with_fill(self.task, strategy)[1]
            except Exception:  # noqa: BLE001
                return None
        return self.fill[key]

    def _add(self, source: str, cand: Strategy, key: Optional[tuple] = None) -> Optional[bool]:
        """Evaluates and offers `cand` to the pool; True if it became the best, None if refused.
        `key`: cand's strategy_key, where the caller legalised cand and keyed it already."""
        if key is None:
            cand = self.task.lowerer.legalize(cand)  # a move may leave batch norm too few samples per replica
            key = strategy_key(cand)
        self.seen.add(key)
        try:
            ev, fill = evaluate_with_fill(self.task, cand)
        except Exception:  # noqa: BLE001 - a move the lowering refuses is just skipped
            return None
        self.evaluations += 1
        self.fill[key] = fill
        return self.pool.add(PoolEntry(source, cand, ev.time_s, ev.effective_time_s, ev.oom, 0, None))

    def seed_memory_partitions(self) -> int:
        """Adds the memory-balanced stage partitions to the pool; returns how many were evaluated."""
        n = 0
        for label, s in memory_partitions(self.task):
            if strategy_key(s) not in self.seen and self._add(label, s) is not None:
                n += 1
        return n

    def sweep_open(self) -> bool:
        """False once a whole pass of the sweep found nothing better than the pool's best."""
        best = self.pool.entries[0].effective_time_s
        if best != self._sweep_best:
            self._sweep_best, self._sweep_idle = best, 0
        return self._sweep_idle < len(self.sweep)

    def _next_sweep(self) -> Tuple[Optional[Strategy], Optional[tuple]]:
        """The next unseen sweep candidate around the pool's best, legalised, and its
        strategy_key; (None, None) when the pass is over."""
        cur = explicit(self.pool.entries[0].strategy, self.groups)
        while self._sweep_idle < len(self.sweep):
            option = self.sweep[self._sweep_pos]
            self._sweep_pos = (self._sweep_pos + 1) % len(self.sweep)
            self._sweep_idle += 1
            cand = apply_option(cur, self.groups, self.devices, option)
            if cand is not None:
                cand = self.task.lowerer.legalize(cand)
                key = strategy_key(cand)
                if key not in self.seen:
                    return cand, key
        return None, None

    def sweep_share(self) -> float:
        """The share of moves given to the sweep: in proportion to what the sweep and the random
        moves gained lately, kept within [SWEEP_SHARE_MIN, SWEEP_SHARE_MAX]; 0 while the random
        moves still find better strategies (fewer than SWEEP_AFTER failures in a row), while the
        sweep is closed, or while the best is OOM (memory moves first)."""
        if self.pool.entries[0].oom or self._random_idle < SWEEP_AFTER or not self.sweep_open():
            return 0.0
        share = self.gain["sweep"] / (self.gain["sweep"] + self.gain["random"])
        return min(max(share, SWEEP_SHARE_MIN), SWEEP_SHARE_MAX)

    def _credit(self, kind: str, before_s: float) -> None:
        cut = max(0.0, 1.0 - self.pool.entries[0].effective_time_s / before_s) if before_s > 0 else 0.0
        self.gain[kind] += GAIN_DECAY * (cut - self.gain[kind])

    def step(self, n: int) -> int:
        improved = 0
        for _ in range(n):
            before_s = self.pool.entries[0].effective_time_s
            if self.rng.random() < self.sweep_share():
                cand, key = self._next_sweep()
                if cand is not None:
                    improved += bool(self._add(self.source, cand, key))
                    self._credit("sweep", before_s)
                continue
            base = self._start()
            cur = explicit(base.strategy, self.groups)
            memory = base.oom and self.rng.random() < self.memory_share
            fill = self._fill_of(cur, strategy_key(cur)) if memory else None
            cand = key = None
            for _ in range(8):
                if fill is not None:
                    cand = memory_neighbour(self.rng, cur, self.groups, self.devices, fill)
                else:
                    cand = neighbour(self.rng, cur, self.groups, self.devices)
                if cand is not None:  # the move as it would run: batch norm keeps its least batch
                    cand = self.task.lowerer.legalize(cand)
                    key = strategy_key(cand)
                    if key not in self.seen:
                        break
                cand = None
            if cand is None:
                continue
            if self._add(self.source, cand, key):
                improved += 1
                self._random_idle = 0
            else:
                self._random_idle += 1
            self._credit("random", before_s)
        return improved
