"""What the TF runtime of a local CPU cluster costs beyond kernels and links, measured by
micro-benchmarks on its server processes: the figures of a RuntimeOverheads file.

    overheads, comm = measure_runtime_overheads(cluster, lc_kwargs, passes=3)

`measure_runtime_overheads` starts a fresh LocalCluster(**lc_kwargs) per pass and measures on it
the comm fit (comm_pass, tfplace.profiling.comm_profiler; unless one is given) and the overheads
(measure_overheads: each figure the difference of two small graphs that differ only in what is
measured, wall from the steps' median, CPU from the scheduler's counters, task_cpu_seconds); the
result is the median over the passes (median_overheads, comm_of_passes). The overheads come back
as a plain JSON-ready dict keyed like the `tfplace.runtime_overheads` file (no format or
version): the command line `python -m tfplace.cli.overheads` validates and writes it.

Layout of the cluster measured: one CPU device per task, device i on task i (`lc.device_names`
in task order), at least two tasks; `cluster` is the tfplace Cluster of those devices, whose
kinds key the per-pair tables ("CPU|CPU_half") and whose links are what the simulator charges.
TensorFlow is imported only inside the functions that build or run graphs.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import statistics
import sys
import time
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from tfplace.ir.node_defs import CPU_ALL_REDUCE, import_all_reduce

BIG_MESSAGE_BYTES = 1 << 20  # the message / all-reduce size of the per-byte figures in `raw`
# all-reduce sizes of the collective CPU curve (runtime_overheads.collective_cpu_s): the tiny
# models' gradients are 0.1-64 KB, ResNet-50's up to 9.4 MB, 100 MB in all. The 16 MiB point
# because bytes cost more beyond the caches: a 3-task all-reduce cost 1.29-1.41 ns per byte per
# participant at 4 MiB and 1.49-1.55 at 16 MiB, a 4-16 MiB slope of 1.56-1.60 (the 1-4 MiB
# slope, 1.1-1.3, which went on beyond 4 MiB before, said less). The 64, 128 and 1024 byte points
# because the CPU steps up between 64 and 128 bytes: chains of 40 steps of 8 3-task all-reduces
# on the emulated heterogeneous cluster cost each participant (task 0 / 1 / 2) 0.18-0.19 /
# 0.26-0.27 / 0.20 ms at 16-64 bytes, 0.25-0.26 / 0.37-0.38 / 0.33-0.34 ms at 128 and 256 bytes and
# 0.35-0.40 / 0.46 / 0.46 ms at 1 KiB. Drawn straight from 16 bytes to 4 KiB, the curve said
# 0.19-0.20 ms for the 128-byte gradients (biases) that are half of the tiny transformer's 88
# all-reduces.
COLLECTIVE_CPU_BYTES = (16, 64, 128, 1024, 4096, 65536, 1 << 20, 4 << 20, 16 << 20)
# the curve's chains: CURVE_CHAIN all-reduces each, instance keys from CURVE_KEY_BASE (a key
# names one shape for the servers' lifetime, so every size needs keys of its own)
CURVE_CHAIN, CURVE_KEY_BASE = 8, 3000
MAX_LATENCY_CUT = 0.9  # transfer_s may take back at most this share of the link latency (a message stays > 0)

# Untimed steps run for at least this long as well as at least the warm-up count: on this
# machine a strategy's first steps after another strategy (or a pause) ran slower for 10-50 steps
# (the tiny MLP's data-parallel all-reduce step 8.2-9.1 ms in its first 10, 6.9-7.0 ms after;
# its single-device step 0.52 ms, then 0.37-0.44), which 2 warm-up steps of a 0.4 ms step miss.
WARMUP_S = 0.1

FEED_ROWS, FEED_BIG_ROWS = 48, 4096  # [rows, 16] float32 feeds: 3 KB and 256 KB
# measure_overheads' sizes: wall = median of REPS steps, CPU over CPU_REPS steps, bursts and chains
# of FAN tensors (the defaults the simulator's fidelity was checked with)
REPS, FAN, CPU_REPS = 30, 24, 200
COMM_MAX_BYTES = 4 << 20  # the tiny models' largest gradient is far smaller; the fit needs the slope too


def task_cpu_seconds(pids) -> np.ndarray:
    """Per process, the CPU seconds its current threads have run so far, from the scheduler's
    nanosecond counters (/proc/PID/task/TID/schedstat; /proc/PID/stat counts 10 ms ticks, too
    coarse for a few dozen millisecond steps). A thread that ends between two readings takes
    its time with it, so a difference may be short by that thread's time."""
    out = []
    for pid in pids:
        total_ns = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total_ns += int(f.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                pass  # the thread ended meanwhile
        out.append(total_ns * 1e-9)
    return np.array(out)


def warm_up(call, steps: int, min_s: float = WARMUP_S) -> None:
    """Calls `call` at least `steps` times and until `min_s` seconds have passed."""
    t0 = time.perf_counter()
    done = 0
    while done < steps or time.perf_counter() - t0 < min_s:
        call()
        done += 1


def median_call_seconds(call, steps: int, warmup: int) -> float:
    """Median wall seconds of `steps` calls of `call` (one step: `lc.run(...)` as StepRunner runs
    it, or a local `sess.run(...)`), after untimed ones (warm_up: `warmup` and WARMUP_S)."""
    warm_up(call, warmup)
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def hop_chain(devs, a: int, b: int, hops: int, cross: bool, elements: int = 4, seed: int = 1):
    """The last tensor of a chain of `hops` dependent multiplies alternating between tasks b and a
    (b first), or all on task a without `cross`, starting from `elements` float32 drawn on task a
    (a stateful random op: TensorFlow's classic optimizer folds constant subgraphs even with
    Grappler off). Each cross hop is one message of 4 * elements bytes."""
    import tensorflow as tf
    with tf.device(devs[a]):
        v = tf.random.uniform([elements], seed=seed)
    for i in range(hops):
        with tf.device(devs[b] if cross and i % 2 == 0 else devs[a]):
            v = v * 1.0001
    return v


def step_costs(lc, build, wall_steps: int = 30, cpu_steps: int = 0, inputs: int = 1, rows: int = FEED_ROWS):
    """What one graph's step costs on `lc`, run the way StepRunner runs it (LocalCluster.run):
    (median wall seconds of `wall_steps` steps after warm-up, or None for 0; CPU seconds per step
    of each task [T] over `cpu_steps` further steps, from the scheduler's counters
    (task_cpu_seconds), or None for 0). `build(x0)` returns the tensors and ops to fetch, x0 being
    the sum of `inputs` fed [rows, 16] float32 placeholders, on task 0."""
    import tensorflow as tf
    from tfplace.runtime.step_runner import step_session_config
    g = tf.Graph()
    with g.as_default():
        xs = [tf.compat.v1.placeholder(tf.float32, [None, 16], name=f"x{i}") for i in range(inputs)]
        with tf.device(lc.device_names[0]):
            x0 = tf.add_n([x * 1.0 for x in xs])
        fetch = tf.group(*build(x0))
    feed = {x: np.zeros((rows, 16), np.float32) for x in xs}
    with lc.session(graph=g, config=step_session_config(None, lc)) as sess:
        def step():
            return run_resent(lambda: lc.run(sess, fetch, feed))
        wall = None
        if wall_steps:
            wall = median_call_seconds(step, wall_steps, 5)
        else:  # CPU only: warm up as the wall timing would have
            warm_up(step, 3)
        used = None
        if cpu_steps:
            c0 = task_cpu_seconds(lc.pids)
            for _ in range(cpu_steps):
                step()
            used = (task_cpu_seconds(lc.pids) - c0) / cpu_steps
    return wall, used


RESENT = "request was received twice"
RESENT_TRIES = 3


def run_resent(call, tries: int = RESENT_TRIES):
    """`call()` (one step of a micro-benchmark: no variables, so running it again changes
    nothing), run again when TensorFlow aborts it with "The same RunGraph (Worker) request was
    received twice": a task keeps the ids of the requests it served and refuses one that comes
    again. Why the request came twice was not found; on the emulated heterogeneous cluster it
    ended three runs, each in measure_overheads. Other errors, and the last try's,
    propagate."""
    import tensorflow as tf
    for attempt in range(tries):
        try:
            return call()
        except tf.errors.AbortedError as err:
            if RESENT not in str(err) or attempt == tries - 1:
                raise
            print(f"  step aborted (a RunGraph request arrived twice); running it again "
                  f"({attempt + 1} of {tries - 1})", file=sys.stderr, flush=True)


def seed_tensor(device: str, i: int = 0, elements: int = 4):
    """`elements` float32 on `device` that TensorFlow cannot fold away (the classic graph
    optimizer folds constant subgraphs even with Grappler off): a stateful random op."""
    import tensorflow as tf
    with tf.device(device):
        return tf.random.uniform([elements], seed=i + 1)


def every_task(devs):
    """A step builder (step_costs): x0 and one tiny op on each further task of `devs`, so that
    every task runs a partition of the step."""
    import tensorflow as tf

    def build(x0):
        out = [x0]
        for d in devs[1:]:
            with tf.device(d):
                out.append(seed_tensor(d) + 1.0)
        return out
    return build


def add_chain(devs, k: int, task: int = 0):
    """A step builder (step_costs): x0 and a chain of k dependent adds of 4 floats on `task`."""
    import tensorflow as tf

    def build(x0):
        v = seed_tensor(devs[task])
        with tf.device(devs[task]):
            for _ in range(k):
                v = v + 1.0
        return [x0, v]
    return build


def collective_chain(devs, k: int, group: int, reduce: bool, elements: int = 4, key_base=None,
                     all_reduce: str = CPU_ALL_REDUCE[0]):
    """A step builder (step_costs): k all-reduces of a value of 4 * elements bytes across the
    first `group` tasks of `devs` (as the rewrite emits them: tfplace.ir.node_defs, `all_reduce`
    the implementation), each task's chained to its previous one by a control edge like
    the rewrite's priority chains (or, without `reduce`, the same chain of Identity ops, which
    pass their input on: the difference is all the all-reduce costs, its output buffer included,
    as the rewrite puts an all-reduce where the original graph has none);
    instance keys from `key_base` (one base per value shape: a key names one shape for the
    servers' lifetime)."""
    import tensorflow as tf
    base_key = 2000 + 100 * (elements > 4) if key_base is None else key_base + 10 * elements.bit_length()

    def build(x0):
        outs = [x0]
        members = devs[:group]
        prev = {d: [] for d in members}
        bases = {d: seed_tensor(d, elements=elements) for d in members}
        for i in range(k):
            values = []
            for d in members:
                with tf.device(d), tf.control_dependencies(prev[d]):
                    values.append(bases[d] + float(i))  # after the previous one: the chain
            if reduce:
                ys = import_all_reduce(values, members, "float32", all_reduce, 20 + group, base_key + i,
                                       f"chain{group}_{elements}_{i}")
            else:
                ys = []
                for d, v in zip(members, values):
                    with tf.device(d):
                        ys.append(tf.identity(v))
            for d, y in zip(members, ys):
                prev[d] = [y.op]
                outs.append(y)
        return outs
    return build


def measure_overheads(lc, cluster, comm: dict, reps: int = REPS, fan: int = FAN, cpu_reps: int = CPU_REPS,
                      raw: bool = True, progress: Optional[Callable[[str], None]] = None) -> dict:
    """Fixed costs of the local TF runtime, from micro-benchmarks independent of the models (each
    the difference of two graphs that differ only in what is measured; wall = median of `reps`
    steps run the way StepRunner runs them, through LocalCluster.run; CPU = the servers' CPU time
    over `cpu_reps` steps, from the scheduler's counters):
    step_s: a one-task step (feed a [48,16] batch, one op, fetch a NoOp) less its feed's bytes
    (feed_s_per_byte: per byte of a [4096,16] feed beyond it; feed_input_s: per fed tensor
    beyond the first, from a step that feeds two [48,16] tensors); op_s: per op executed
    (a chain of 40*fan dependent tiny adds), beyond what the same op costs in the profiler's own
    session (local_op_seconds), whose records already hold the executor's per-op work (their
    tracing cost is removed, tfplace.profiling.profiler rule 7); worker_s: each further task
    that runs a partition (a tiny op on each, every_task); their CPU, each task's from the
    scheduler's counters over `cpu_reps` steps: step_cpu_s (task 0's in the one-task step),
    master_worker_cpu_s (task 0's per further task) and worker_cpu_s (a further task's own,
    the mean over them); transfer_s: per hop of a chain of `fan` dependent tensors going back
    and forth between two tasks (a message inside a step, not the fit's best case), beyond the
    link the simulator charges a 16-byte message between those tasks (Cluster.transfer_seconds
    of `cluster`, not the p2p fit measured in the run, which the simulator does not use for
    messages: they differed by 25 us) and beyond the hop's message_cpu_s: the simulator charges
    that CPU to the lanes (one inter-op thread) or adds it to the transfer (two or more), and
    counting it in the transfer as well would count it twice (the hop's wall holds it; measured
    chains: 126-185 us wall, 100-160 us CPU); message_cpu_s: the
    servers' CPU time per hop of that chain (both ends); message_cpu_share: for a pair of two
    different kinds, the share of that CPU each end's task spent (the scheduler's counters per
    task: on the emulated heterogeneous cluster the unthrottled end paid 43-47%, not half).
    Both per pair of device kinds
    ("CPU|CPU_half"; the kinds of `cluster`'s devices), each between the first pair of tasks
    with those kinds (message_pairs: 1-2, then 0-1, 0-2 of 3 tasks): on the emulated
    heterogeneous cluster a hop between two throttled tasks costs more than one to the
    unthrottled task; transfer_gap_s: wall time per tensor when `fan` independent 16-byte
    tensors cross from the second-last task to the last at once (tasks 1 and 2 of 3: the gap
    between the messages of a burst); collective_s: per group size,
    the wall of one 16-byte all-reduce in a chain of `fan` chained by control edges on every
    participant (collective_chain, beyond the same chain of Identity ops; `raw`'s
    `serial_collective_s`), beyond the all-reduce fit's time at 16 bytes for that group
    (`comm`). The fit comes from single traced all-reduces (comm_pass; 1.02-1.28 ms for 3
    tasks at 16 bytes on the emulated heterogeneous cluster); a chained one took 0.52-0.61 ms,
    and a model's all-reduces added 0.50-0.90 ms each to its untraced step (the step with and
    without them). `raw` also has the burst figures
    of independent all-reduces, and what bytes cost: wall and CPU per byte of a 1 MiB message
    between the last two tasks and of a chained 1 MiB all-reduce across every task, beyond 16 bytes
    (`message_cpu_s_per_byte`: both ends together; `collective_cpu_s_per_byte_per_task`: from
    the `collective_cpu_s` curve's points, which time those all-reduces' CPU already). CPU
    comes from the scheduler's nanosecond counters (task_cpu_seconds) throughout. With `raw`
    (the first pass) two model keys come too, for the step's CPU bound (tfplace.overheads.cpu_demand):
    `message_cpu_s_per_byte` (that per-byte message CPU, at least 0) and `collective_cpu_s`,
    per group size the CPU seconds one participant spends per all-reduce at each of
    COLLECTIVE_CPU_BYTES (a chain of 8 like collective_chain's, beyond the same chain of
    Identity ops, from the scheduler's counters), the participants' mean and per device kind
    (participant_curves); with `raw` False none of these are measured and `raw`
    is left out. `comm`: the comm fit the model uses (a profile's "comm" section: "p2p" and
    "allreduce" per group size up to the tasks), for collective_s and the raw figures; `cluster`:
    the tfplace Cluster `lc` runs (one device per task, device i on task i, at least 2 tasks);
    `progress`: called with a line as each group of micro-benchmarks starts."""
    import tensorflow as tf
    devs = lc.device_names
    kinds = [d.kind for d in cluster.devices]
    say = progress or (lambda message: None)
    burst_a, burst_b = len(devs) - 2, len(devs) - 1  # tasks 1 and 2 of 3: task 0 also serves the client

    def timed(build, cpu=False, cpu_steps=cpu_reps, wall_steps=reps, tasks=None, inputs=1, rows=FEED_ROWS):
        """(median wall seconds of `wall_steps` steps or None for 0, CPU seconds per step of the
        first `tasks` servers (all by default) together, or None without `cpu`): step_costs."""
        wall, used = step_costs(lc, build, wall_steps, cpu_steps if cpu else 0, inputs, rows)
        return wall, None if used is None else float(used[:tasks].sum())

    def one_task(x0):
        return [x0]

    def fan_out(k, cross):
        def build(x0):
            outs = [x0]
            base = seed_tensor(devs[burst_a])
            for i in range(k):
                with tf.device(devs[burst_a]):
                    v = base + float(i)
                with tf.device(devs[burst_b] if cross else devs[burst_a]):
                    outs.append(v * 2.0)
            return outs
        return build

    def ping_pong(k, cross, a, b, elements=4):
        """A chain of k dependent hops between tasks a and b (or, without `cross`, on task a),
        each hop a message of 4 * elements bytes."""
        def build(x0):
            return [x0, hop_chain(devs, a, b, k, cross, elements)]
        return build

    def collectives(k, reduce):
        """k values per task, each all-reduced across the tasks (or, without `reduce`, not)."""
        def build(x0):
            outs = [x0]
            bases = [seed_tensor(d) for d in devs]
            for i in range(k):
                values = []
                for d, base in zip(devs, bases):
                    with tf.device(d):
                        values.append(base + float(i))
                outs.extend(import_all_reduce(values, devs, "float32", CPU_ALL_REDUCE[0], 7, 1000 + i, f"burst_{i}")
                            if reduce else values)
            return outs
        return build

    # wall and each task's CPU of a one-task step, and of a step with a partition on every task
    say("dispatch: a one-task step and a step on every task")
    step, step_cpu = step_costs(lc, one_task, reps, cpu_reps)
    every, every_cpu = step_costs(lc, every_task(devs), reps, cpu_reps)
    further = len(devs) - 1
    # what a step's feed costs: one more fed tensor, and the bytes of a large one (the client
    # sends the feed to task 0 through the master: the tiny CNN's 147 KB feed cost ~70 us more
    # than the 3 KB one above, its 2 tensors ~25 us more than 1)
    say("feed: two inputs and a large one; per-op dispatch")
    feed_input = timed(one_task, inputs=2)[0] - step
    feed_per_byte = max((timed(one_task, rows=FEED_BIG_ROWS)[0] - step) / ((FEED_BIG_ROWS - FEED_ROWS) * 64), 0.0)
    chain = 40 * fan  # ~1 ms of ops: the per-op difference must stand above the steps' jitter
    op = (timed(add_chain(devs, chain))[0] - timed(add_chain(devs, 0))[0]) / chain
    local_op = local_op_seconds(chain, reps)
    worker = (every - step) / further
    say(f"messages: a burst of {fan}, chains of {fan} hops per pair of device kinds")
    cross_wall, cross_cpu = timed(fan_out(fan, True), cpu=True)
    local_wall, local_cpu = timed(fan_out(fan, False), cpu=True)
    # a message costs the CPU of both its ends: one chain per pair of device kinds, between the
    # first pair of tasks with those kinds (tasks 1 and 2 first: task 0 also serves the client)
    by_pair = {}  # kind pair -> (hop wall, hop CPU, the simulator's link seconds, link latency)
    shares = {}  # pair of different kinds -> {kind: the share of the hop's CPU that end paid}
    for a, b in message_pairs(len(devs)):
        pair = "|".join(sorted((kinds[a], kinds[b])))
        if pair not in by_pair:
            chain_wall, chain_used = step_costs(lc, ping_pong(fan, True, a, b), reps, cpu_reps)
            solo_wall, solo_used = step_costs(lc, ping_pong(fan, False, a, b), reps, cpu_reps)
            per_task = np.maximum(chain_used - solo_used, 0.0) / fan
            by_pair[pair] = ((chain_wall - solo_wall) / fan, float((chain_used - solo_used).sum()) / fan,
                             cluster.transfer_seconds(a, b, 16), cluster.path_latency_s(a, b))
            ends = per_task[a] + per_task[b]
            if kinds[a] != kinds[b] and ends > 0:
                shares[pair] = {kinds[a]: float(per_task[a] / ends), kinds[b]: float(per_task[b] / ends)}
    out = {"step_s": max(step - FEED_ROWS * 64 * feed_per_byte, 0.0), "feed_input_s": max(feed_input, 0.0),
           "feed_s_per_byte": feed_per_byte, "op_s": max(op - local_op, 0.0), "worker_s": max(worker, 0.0),
           # the dispatch's CPU (tfplace.overheads.cpu_demand.dispatch_cpu_seconds): the master's for a
           # one-task step and per further task, and each further task's own
           "step_cpu_s": float(step_cpu[0]),
           "master_worker_cpu_s": max(float(every_cpu[0] - step_cpu[0]) / further, 0.0),
           "worker_cpu_s": max(float(np.mean(every_cpu[1:] - step_cpu[1:])), 0.0),
           # the simulator charges each message's CPU (message_cpu_s) to the lanes or to the
           # transfer (runtime_overheads.inter_op_threads) and a chain's hop already holds it: the
           # transfer is what the hop takes beyond both and beyond the link the simulator
           # charges, so a chain costs what it measured (negative where the CPU is more than the
           # wall beyond the link; the link's latency bounds it)
           "transfer_s": {p: transfer_beyond(*v) for p, v in by_pair.items()},
           "transfer_gap_s": max((cross_wall - local_wall) / fan, 0.0),
           "message_cpu_s": {p: max(cpu, 0.0) for p, (_, cpu, _, _) in by_pair.items()},
           "message_cpu_share": shares,
           "how": "tfplace.profiling.overheads_probe (wall: median of %d steps; CPU: %d steps; "
                  "bursts and chains of %d)" % (reps, cpu_reps, fan)}
    n = len(devs)

    def fit16(group):
        c = comm["allreduce"][str(group)]
        return c["latency_s"] + 16 / c["bandwidth_bytes_per_s"]

    say(f"all-reduces: chains of {fan} per group size")
    serial = {}  # group size -> wall per collective of a chained sequence, beyond the plain chain
    for group in range(2, n + 1):
        serial[group] = (timed(collective_chain(devs, fan, group, True))[0]
                         - timed(collective_chain(devs, fan, group, False))[0]) / fan
    # what an all-reduce in a step takes beyond the fit the simulator charges (single traced
    # all-reduces), like transfer_s for a message: negative where a chained one takes less
    out["collective_s"] = {str(g): serial[g] - fit16(g) for g in serial}
    if not raw:
        return out
    say("raw: bursts of all-reduces, 1 MiB messages and all-reduces, the collective CPU curve")
    coll_wall, coll_cpu = timed(collectives(fan, True), cpu=True)
    plain_wall, plain_cpu = timed(collectives(fan, False), cpu=True)

    # what bytes cost: the same chains with BIG_MESSAGE_BYTES per message / all-reduce, against
    # 16 bytes (both measured the same way, so the difference is the bytes' share)
    big, k = BIG_MESSAGE_BYTES // 4, 6
    hop_big = timed(ping_pong(k, True, burst_a, burst_b, big), cpu=True, cpu_steps=40)
    hop_small = timed(ping_pong(k, True, burst_a, burst_b), cpu=True, cpu_steps=40)
    # the all-reduce's wall only: its CPU per byte comes from the collective_cpu_s curve below
    coll_big = timed(collective_chain(devs, k, n, True, big))[0]
    coll_small = timed(collective_chain(devs, k, n, True))[0]
    extra_bytes = 4 * big - 16

    def participant_cpu(group, nbytes, k=CURVE_CHAIN, steps=10):
        """CPU seconds each of the first `group` tasks spends per all-reduce of `nbytes` in a
        chain of k (beyond the same chain of pass-through ops) [group], from the scheduler's
        counters."""
        used = [step_costs(lc, collective_chain(devs, k, group, reduce, nbytes // 4, key_base=CURVE_KEY_BASE),
                           wall_steps=0, cpu_steps=steps)[1][:group]
                for reduce in (True, False)]
        return np.maximum(used[0] - used[1], 0.0) / k

    # the model's collective CPU (tfplace.overheads.cpu_demand): per group size, what one participant's CPU
    # costs per all-reduce at each of COLLECTIVE_CPU_BYTES, chained like the rewrite's chains;
    # the participants' mean, and per device kind the mean of that kind's participants
    out["collective_cpu_s"] = {str(g): participant_curves([participant_cpu(g, b) for b in COLLECTIVE_CPU_BYTES],
                                                          kinds[:g])
                               for g in range(2, n + 1)}
    curve_n = dict(zip(COLLECTIVE_CPU_BYTES, out["collective_cpu_s"][str(n)]["seconds"]))
    message_cpu_per_byte = (hop_big[1] - hop_small[1]) / (k * extra_bytes)
    out["message_cpu_s_per_byte"] = max(message_cpu_per_byte, 0.0)
    out["raw"] = {"chained_message_s": {p: v[0] for p, v in by_pair.items()},
                  "link_s": {p: v[2] for p, v in by_pair.items()},
                  "p2p_fit_s": comm["p2p"]["latency_s"] + 16 / comm["p2p"]["bandwidth_bytes_per_s"],
                  "cluster_op_s": op, "profiler_op_s": local_op,
                  "burst_message_cpu_s": (cross_cpu - local_cpu) / fan,
                  "burst_collective_s": (coll_wall - plain_wall) / fan,
                  "burst_collective_cpu_s": (coll_cpu - plain_cpu) / fan, "collective_messages": n * 2 * (n - 1),
                  "serial_collective_s": {str(g): v for g, v in serial.items()},
                  # per byte beyond a 16-byte message: a hop between tasks 1 and 2 (CPU of both
                  # ends together), and a chained all-reduce across every task (its CPU per
                  # task from the collective_cpu_s curve's points at 16 bytes and 1 MiB)
                  "big_message_bytes": BIG_MESSAGE_BYTES,
                  "message_s_per_byte": (hop_big[0] - hop_small[0]) / (k * extra_bytes),
                  "message_cpu_s_per_byte": message_cpu_per_byte,
                  "collective_s_per_byte": (coll_big - coll_small) / (k * extra_bytes),
                  "collective_cpu_s_per_byte_per_task": (curve_n[BIG_MESSAGE_BYTES] - curve_n[16]) / extra_bytes,
                  "allreduce_fit_16_bytes_s": {g: fit16(g) for g in comm["allreduce"]}}
    return out


def participant_curves(per_task_s, kinds) -> dict:
    """A collective_cpu_s curve (tfplace.overheads.cpu_demand.participant_curve) from per-task CPU seconds
    per all-reduce at each of COLLECTIVE_CPU_BYTES (per_task_s [K][group]; the group's tasks of
    device kinds `kinds`): "seconds", the participants' mean, and "seconds_by_kind", per kind the
    mean of its participants."""
    per = np.asarray(per_task_s, dtype=np.float64)
    of = np.asarray(kinds, dtype=object)
    return {"bytes": list(COLLECTIVE_CPU_BYTES), "seconds": per.mean(axis=1).tolist(),
            "seconds_by_kind": {k: per[:, of == k].mean(axis=1).tolist() for k in sorted(set(kinds))}}


def transfer_beyond(hop_wall_s: float, hop_cpu_s: float, link_s: float, link_latency_s: float) -> float:
    """transfer_s of one kind pair: what a chained hop's wall takes beyond the message CPU (the
    simulator charges it to the lanes or the transfer) and beyond the link the simulator charges;
    at least -MAX_LATENCY_CUT of the link's latency, so a message still takes a tenth of it."""
    return max(hop_wall_s - hop_cpu_s - link_s, -MAX_LATENCY_CUT * link_latency_s)


def median_overheads(runs):
    """Per key (and per device-kind pair), the median over several measure_overheads passes:
    one pass's message costs moved 154 -> 225 us between runs on this machine. `raw` and `how`
    come from the first pass (the only one that measures `raw`), with every pass's values under
    raw["passes"]."""
    first = runs[0]
    out = {}
    for key, value in first.items():
        if key in ("raw", "how"):
            continue
        if len(runs) == 1 or any(key not in r for r in runs):  # one pass, or measured by the first only (`raw`)
            out[key] = value
        elif key == "message_cpu_share":  # per pair, each end's median share, scaled to add up to 1
            out[key] = {}
            for pair, ends in value.items():
                med = {k: float(np.median([r[key][pair][k] for r in runs if pair in r[key]])) for k in ends}
                total = sum(med.values())
                out[key][pair] = {k: v / total for k, v in med.items()}
        elif isinstance(value, dict):
            out[key] = {k: float(np.median([r[key][k] for r in runs])) for k in value}
        else:
            out[key] = float(np.median([r[key] for r in runs]))
    passes = [{k: v for k, v in r.items() if k not in ("raw", "how")} for r in runs]
    out["raw"] = {**first.get("raw", {}), "passes": passes}
    out["how"] = first["how"] + f"; median of {len(runs)} passes"
    return out


def local_op_seconds(k: int, reps: int) -> float:
    """Wall seconds per op of a chain of k dependent tiny adds in a session like the profiler's
    (in this process, 1 intra-op + 1 inter-op thread, graph optimisations off), beyond the same
    step without the chain (median of `reps` steps each)."""
    import tensorflow as tf
    from tfplace.profiling.profiler import ProfileOptions, _session_config
    config = _session_config(tf, ProfileOptions(intra_threads=1, inter_threads=1))

    def wall(n):
        g = tf.Graph()
        with g.as_default(), tf.device("/device:CPU:0"):
            v = tf.random.uniform([4], seed=1)
            for _ in range(n):
                v = v + 1.0
            fetch = tf.group(v)
        with tf.compat.v1.Session(graph=g, config=config) as sess:
            return median_call_seconds(lambda: sess.run(fetch), reps, 5)

    return (wall(k) - wall(0)) / k


def message_pairs(num_tasks: int) -> List[Tuple[int, int]]:
    """The task pairs whose hops measure_overheads times, in order (per pair of device kinds the
    first one counts): pairs without task 0 first, since task 0 also serves the client's steps.
    3 tasks: (1, 2), (0, 1), (0, 2)."""
    return sorted(itertools.combinations(range(num_tasks), 2), key=lambda p: (p[0] == 0, p))


def pin_this_process(cpus) -> None:
    """Pins every thread of this process (and the threads they start later) to `cpus`."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass  # a thread that ended meanwhile (a CPU this machine lacks still raises)


def comm_pass(lc, max_bytes: int = COMM_MAX_BYTES):
    """One pass of tfplace.profiling.comm_profiler on `lc` (a CommMeasurement), every group size up to its tasks."""
    from tfplace.profiling.comm_profiler import measure_comm
    return measure_comm(cluster=lc, max_bytes=max_bytes, group_sizes=range(2, lc.num_tasks + 1))


def comm_of_passes(runs) -> dict:
    """The comm fit of comm_pass results, each latency and bandwidth the median over them, as a
    profile file holds it: {"comm": {"p2p": fit, "allreduce": {"2": fit, ...}}, "conditions":
    {"comm": how it was measured}}, a fit being {"latency_s", "bandwidth_bytes_per_s"}."""
    passes = len(runs)

    def median_fit(fits):
        return {key: statistics.median(dataclasses.asdict(f)[key] for f in fits)
                for key in ("latency_s", "bandwidth_bytes_per_s")}
    comm = {"p2p": median_fit([m.model.p2p for m in runs]),
            "allreduce": {str(g): median_fit([m.model.allreduce[g] for m in runs]) for g in runs[0].model.allreduce}}
    conditions = {**runs[0].conditions, "passes": [m.conditions for m in runs],
                  "statistic_over_passes": f"median of {passes} passes per latency and bandwidth"}
    return {"comm": comm, "conditions": {"comm": conditions}}


def handler_threads(inter_threads_per_task) -> int:
    """The fewest inter-op threads any task has (LocalCluster's inter_threads_per_task; TF's
    default, None or 0, is one per core of the machine): the runtime_overheads.inter_op_threads
    the simulator is given."""
    return min(int(t) if t else (os.cpu_count() or 1) for t in inter_threads_per_task)




def measure_runtime_overheads(cluster, lc_kwargs, passes: int = 1, comm: Optional[dict] = None,
                              reps: int = REPS, fan: int = FAN, cpu_reps: int = CPU_REPS, raw: bool = True,
                              client_cpus: Optional[Sequence[int]] = None,
                              progress: Optional[Callable[[str], None]] = None) -> Tuple[dict, Optional[dict]]:
    """(overheads, comm fit): `passes` passes, each on a fresh LocalCluster(**lc_kwargs) (a server
    process keeps the speed it started with, so the median spans several), each measuring the
    comm fit (comm_pass; unless `comm`, a profile's "comm" section, is given) and then the
    overheads against that pass's fit (measure_overheads; `raw` figures in the first pass only).

    overheads: median_overheads of the passes plus inter_op_threads (handler_threads of
    lc_kwargs), a JSON-ready dict keyed like the tfplace.runtime_overheads file, without format
    and version; raw["comm"] holds the comm fit collective_s is measured against. comm fit: the
    passes' comm_of_passes, or None when `comm` was given. `client_cpus`: this process, the client,
    is pinned to them while it drives each pass's steps (the servers start from its own cores, so
    that a task may be pinned to any core this process may use). `progress` gets a line per step."""
    from tfplace.runtime.local_cluster import LocalCluster
    say = progress or (lambda message: None)
    num_tasks = int(lc_kwargs["num_tasks"])
    comm_runs, runs = [], []
    own_cpus = os.sched_getaffinity(0)
    for p in range(passes):
        started = time.monotonic()
        say(f"pass {p + 1} of {passes}: starting {num_tasks} server tasks")
        pin_this_process(own_cpus)
        with LocalCluster(**lc_kwargs) as lc:
            if client_cpus:
                pin_this_process(set(client_cpus))
            this_comm = comm
            if comm is None:
                say(f"pass {p + 1}: comm fit (point-to-point and all-reduce, up to {COMM_MAX_BYTES >> 20} MiB)")
                comm_runs.append(comm_pass(lc))
                this_comm = comm_of_passes(comm_runs[-1:])["comm"]
            runs.append(measure_overheads(lc, cluster, this_comm, reps, fan, cpu_reps, raw=raw and not runs,
                                          progress=lambda line, p=p: say(f"pass {p + 1}: {line}")))
        say(f"pass {p + 1} done in {time.monotonic() - started:.0f} s")
    if client_cpus:
        pin_this_process(own_cpus)
    out = median_overheads(runs)
    out["inter_op_threads"] = handler_threads(lc_kwargs.get("inter_threads_per_task") or [None] * num_tasks)
    fit = comm_of_passes(comm_runs) if comm is None else None
    out["raw"]["comm"] = fit["comm"] if fit else comm
    return out, fit
