"""simulate(placed, cluster, options) -> SimReport: one training iteration of a PlacedGraph.

Discrete events (semantics in simulator.loop_reference): devices run their compute-lane tasks one
at a time by priority; transfers and collectives hold every link they use, FIFO per link
(contention is serialisation, not bandwidth sharing; full duplex because up/down and per-pair
links are separate links); a collective holds the links of its ring's hops (its time already
accounts for hops sharing a link), not a global lock; memory is tracked per device over time.
A link is held for the task's `task_hold_seconds` when the lowering gives them (the bandwidth part
plus the measured per-message gap; the latency part overlaps the next message, LogGP-style), else
for its whole duration.

Host cores: CPU devices run their kernels on their host's cores. A host with `cpu_cores` set in
the cluster file lets at most that many of its CPU devices run a task at once (e.g. three TF tasks
on a 2-core machine); GPUs and hosts without `cpu_cores` have no such limit.

CPU bound: when the PlacedGraph gives each device's CPU demand (PlacedGraph.device_cpu_seconds,
which only the runtime-overhead pass tfplace.overheads.apply fills), the iteration lasts
at least the time that CPU takes under each device's CPU fraction and its host's cores
(`cpu_bound_s` in the report; the makespan of the events when that is longer).

Straggler noise: each device independently runs slow for the whole step with probability
`Device.straggle_probability`, multiplying its compute-lane durations by `Device.straggle_factor`.
`options.stragglers` says how a step is scored:
  "expected"  the expected step over the straggler draws (the default, what planners rank by):
              every combination of slow and normal devices, weighted by its probability, when
              there are at most 2^k <= options.max_straggler_cases of them (k = devices that may
              straggle and have work in this PlacedGraph: a device left idle costs nothing when
              it straggles); else the mean over max_straggler_cases draws of numpy's
              default_rng(seed). Peak memory is the largest over the cases (what must fit).
  "draw"      one step, the draw of default_rng(seed) (a seed fixes the result);
  "off"       no device straggles.

Engines: "fast" (numba, compiled on first use), "reference" (plain Python, slow, the spec the
fast loop is tested against), "auto" (fast if numba imports, else reference).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfplace.formats.cluster import Cluster, is_cpu_kind
from tfplace.formats.errors import InputError
from tfplace.lowering.placed_graph import (DEVICE_KINDS, TASK_COLLECTIVE, TASK_COMPUTE, TASK_TRANSFER, PlacedGraph,
                                  csr_from_pairs)
from tfplace.formats.reports import SimReport

ENGINES = ("auto", "fast", "reference")
STRAGGLER_MODES = ("expected", "draw", "off")


@dataclasses.dataclass(frozen=True)
class SimOptions:
    """seed: straggler noise seed; stragglers: one of STRAGGLER_MODES (module docstring);
    max_straggler_cases: most schedules an expected step runs; trace: build the Chrome trace into
    SimReport.trace (of the straggler case with the fewest slow devices); engine: one of ENGINES."""
    seed: int = 0
    stragglers: str = "expected"
    trace: bool = False
    engine: str = "auto"
    max_straggler_cases: int = 16

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise InputError("SimOptions", "engine", f"is {self.engine!r}", f"use one of {list(ENGINES)}")
        if self.stragglers not in STRAGGLER_MODES:
            raise InputError("SimOptions", "stragglers", f"is {self.stragglers!r}",
                             f"use one of {list(STRAGGLER_MODES)}")
        if self.max_straggler_cases < 1:
            raise InputError("SimOptions", "max_straggler_cases", f"is {self.max_straggler_cases}", "use 1 or more")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Raw result of the event loop: start[M], finish[M] (seconds), peak[D] (bytes), makespan."""
    start: np.ndarray
    finish: np.ndarray
    peak: np.ndarray
    makespan: float


def straggle_factors(cluster: Cluster, seed: int, enabled: bool = True) -> np.ndarray:
    """Per-device duration multiplier for one step (1.0 unless the device straggles)."""
    rng = np.random.default_rng(seed)
    draws = rng.random(cluster.num_devices)
    out = np.ones(cluster.num_devices)
    if enabled:
        for i, d in enumerate(cluster.devices):
            if draws[i] < d.straggle_probability:
                out[i] = d.straggle_factor
    return out


def straggler_cases(placed: PlacedGraph, cluster: Cluster, options: SimOptions) -> List[Tuple[float, np.ndarray]]:
    """[(probability, per-device duration factors [D])] whose weighted steps make the step that
    `options.stragglers` asks for (module docstring); probabilities sum to 1, no two factor
    vectors are equal, and the first case has the fewest slow devices."""
    d = cluster.num_devices
    if options.stragglers == "off":
        return [(1.0, np.ones(d))]
    if options.stragglers == "draw":
        return [(1.0, straggle_factors(cluster, options.seed))]
    base = np.ones(d)
    working = np.zeros(d, dtype=bool)
    lane = np.isin(placed.task_kind, DEVICE_KINDS)
    working[np.unique(placed.task_device[lane])] = True
    uncertain = []
    for i, dev in enumerate(cluster.devices):
        if dev.straggle_factor == 1.0 or dev.straggle_probability == 0.0 or not working[i]:
            continue
        if dev.straggle_probability >= 1.0:
            base[i] = dev.straggle_factor  # always slow: no uncertainty
        else:
            uncertain.append(i)
    if not uncertain:
        return [(1.0, base)]
    p = np.array([cluster.devices[i].straggle_probability for i in uncertain])
    if 2 ** len(uncertain) <= options.max_straggler_cases:
        # every combination, with its probability (bit j of `mask`: device uncertain[j] is slow)
        masks = [np.array([(mask >> j) & 1 for j in range(len(uncertain))], dtype=bool)
                 for mask in range(2 ** len(uncertain))]
        weights = [float(np.prod(np.where(m, p, 1.0 - p))) for m in masks]
    else:
        rng = np.random.default_rng(options.seed)
        masks = [rng.random(len(uncertain)) < p for _ in range(options.max_straggler_cases)]
        masks.sort(key=lambda m: (int(m.sum()), m.tolist()))  # the calm draw, if drawn, first
        weights = [1.0 / len(masks)] * len(masks)
    cases: Dict[bytes, Tuple[float, np.ndarray]] = {}
    for m, w in zip(masks, weights):
        factor = base.copy()
        factor[np.array(uncertain)[m]] = [cluster.devices[i].straggle_factor for i in np.array(uncertain)[m]]
        key = factor.tobytes()
        cases[key] = (cases[key][0] + w if key in cases else w, factor)
    return list(cases.values())


def _csr_numpy(keys, values, n):
    ptr, grouped = csr_from_pairs(keys, values, n)
    return ptr, grouped.astype(np.int64)


def _loop(engine: str):
    """(event loop, CSR builder) for the engine."""
    if engine in ("auto", "fast"):
        try:
            from tfplace.simulator.loop_fast import csr_by_key, run_fast
            return run_fast, csr_by_key
        except ImportError:
            if engine == "fast":
                raise InputError("SimOptions", "engine", "numba is not installed",
                                 "pip install -r requirements.txt, or use engine='reference'") from None
    from tfplace.simulator.loop_reference import run_reference
    return run_reference, _csr_numpy


def core_slots(cluster: Cluster) -> Tuple[np.ndarray, np.ndarray]:
    """(slot_group[D], group_slots[G]): the host-core group of each device (-1: unlimited) and
    the cores of each group. A group is the CPU devices of one host that gives `cpu_cores`."""
    host_index = {h.name: i for i, h in enumerate(cluster.hosts)}
    group = np.full(cluster.num_devices, -1, dtype=np.int64)
    slots: List[int] = []
    seen: Dict[int, int] = {}
    for i, d in enumerate(cluster.devices):
        h = host_index[d.host]
        cores = cluster.hosts[h].cpu_cores
        if cores is not None and is_cpu_kind(d.kind):
            if h not in seen:
                seen[h] = len(slots)
                slots.append(int(cores))
            group[i] = seen[h]
    return group, np.array(slots, dtype=np.int64)


def schedule(placed: PlacedGraph, factor: np.ndarray, engine: str = "auto",
             slots: Optional[Tuple[np.ndarray, np.ndarray]] = None) -> Schedule:
    """Runs the event loop over `placed` with per-device duration factors; `slots` =
    core_slots(cluster) limits the CPU devices of a host to its cores (None: no limit)."""
    m = placed.num_tasks
    run, csr = _loop(engine)
    dep_src, dep_dst = placed.dep_src.astype(np.int64), placed.dep_dst.astype(np.int64)
    succ_ptr, succ_idx = csr(dep_src, dep_dst, m)
    indegree = np.bincount(dep_dst, minlength=m).astype(np.int64)
    lane_dev = np.where(np.isin(placed.task_kind, DEVICE_KINDS), placed.task_device, -1).astype(np.int64)
    # rank = position in (priority, task id) order, as one int64 key (priorities are small)
    prio = placed.task_priority.astype(np.int64)
    if m and np.abs(prio).max() < (2**62) // m:
        order = np.argsort(prio * m + np.arange(m)).astype(np.int64)
    else:
        order = np.lexsort((np.arange(m), prio)).astype(np.int64)
    rank = np.empty(m, dtype=np.int64)
    rank[order] = np.arange(m)
    # buffers and scratch (memory a task holds that is no buffer: PlacedGraph.memory_buffers)
    out_ptr, buf_device, buf_bytes, in_ptr, in_buf = placed.memory_buffers()
    reads = np.bincount(in_buf, minlength=len(buf_device)).astype(np.int64)
    seconds = placed.task_seconds.astype(np.float64)
    hold = placed.task_hold_seconds.astype(np.float64) if len(placed.task_hold_seconds) else seconds
    if slots is None:
        slots = (np.full(placed.num_devices, -1, dtype=np.int64), np.zeros(0, dtype=np.int64))
    start, finish, peak, done, makespan = run(
        lane_dev, seconds, rank, order, succ_ptr, succ_idx, indegree,
        placed.link_ptr.astype(np.int64),
        placed.link_idx.astype(np.int64), len(placed.link_names), out_ptr.astype(np.int64),
        buf_device.astype(np.int64), buf_bytes.astype(np.float64), reads,
        in_ptr.astype(np.int64), in_buf.astype(np.int64), placed.static_bytes.astype(np.float64),
        np.asarray(factor, dtype=np.float64), hold, slots[0], slots[1].astype(np.int64))
    if done != m:
        raise RuntimeError(f"simulator: {m - done} of {m} tasks never became ready (a dependency cycle in the "
                           "PlacedGraph; this is a lowering bug)")
    return Schedule(np.asarray(start), np.asarray(finish), np.asarray(peak), float(makespan))


def simulate(placed: PlacedGraph, cluster: Cluster, options: SimOptions = SimOptions()) -> SimReport:
    """Simulates one iteration; OOM is reported in the result, never raised."""
    if cluster.device_names != placed.device_names:
        raise InputError("cluster", "devices", "differ from the devices the strategy was lowered for",
                         "simulate with the cluster passed to lower()")
    d = placed.num_devices
    slots = core_slots(cluster)  # the CPU devices of each host that gives cpu_cores
    bound = 0.0
    if len(placed.device_cpu_seconds):
        bound = cpu_bound_seconds(placed.device_cpu_seconds, placed.device_cpu_fraction, slots[0],
                                  slots[1].tolist())
    on_dev = np.isin(placed.task_kind, DEVICE_KINDS)
    dev = np.where(on_dev, placed.task_device, 0)
    comp = placed.task_kind == TASK_COMPUTE
    cases = straggler_cases(placed, cluster, options)
    step = makespan = 0.0
    busy, compute, peak_bytes = np.zeros(d), np.zeros(d), np.zeros(d)
    first = None
    for weight, factor in cases:
        sched = schedule(placed, factor, options.engine, slots)
        if first is None:
            first = sched
        dur = sched.finish - sched.start
        step += weight * max(sched.makespan, bound)
        makespan += weight * sched.makespan
        busy += weight * np.bincount(dev[on_dev], weights=dur[on_dev], minlength=d)
        compute += weight * np.bincount(dev[comp], weights=dur[comp], minlength=d)
        peak_bytes = np.maximum(peak_bytes, sched.peak)
    coll = placed.task_kind == TASK_COLLECTIVE
    n_part = np.diff(placed.part_ptr)[coll]
    comm = float(placed.task_bytes[placed.task_kind == TASK_TRANSFER].sum()
                 + (placed.task_bytes[coll] * 2.0 * (n_part - 1)).sum())
    capacity = cluster.memory_bytes
    peak = np.ceil(peak_bytes - 1e-6).astype(np.int64)
    over = [cluster.devices[i].name for i in range(d) if peak[i] > capacity[i]]
    trace = None
    if options.trace:
        from tfplace.simulator.trace import chrome_trace
        trace = chrome_trace(placed, first.start, first.finish)
    return SimReport(
        iteration_time_s=step, makespan_s=makespan, cpu_bound_s=bound,
        device_names=placed.device_names,
        peak_memory_bytes=tuple(int(x) for x in peak), memory_capacity_bytes=tuple(int(x) for x in capacity),
        oom=bool(over), oom_devices=tuple(over), comm_bytes=comm, busy_s=tuple(float(x) for x in busy),
        compute_s=tuple(float(x) for x in compute), num_tasks=placed.num_tasks, seed=options.seed, trace=trace,
        straggler_cases=len(cases))


def cpu_bound_seconds(demand_s: np.ndarray, fraction: np.ndarray, host_of: Optional[np.ndarray] = None,
                      host_cores: Optional[Sequence[Optional[int]]] = None) -> float:
    """The shortest step the CPU demand [D] allows: each device's demand over its fraction, and
    for every host with a core count, its devices' demand over its cores (host_of [D]: the index
    into host_cores of each device's host, -1 for a device that does not share a host's cores,
    e.g. a GPU, as simulator.core_slots gives them)."""
    if len(demand_s) == 0:
        return 0.0
    bound = float(np.max(demand_s / fraction))
    if host_of is not None and host_cores is not None:
        for h, cores in enumerate(host_cores):
            on = host_of == h
            if cores and on.any():
                bound = max(bound, float(demand_s[on].sum()) / cores)
    return bound
