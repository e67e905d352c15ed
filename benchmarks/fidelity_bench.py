"""Simulator fidelity on the local CPU cluster.

    .venv/bin/python benchmarks/fidelity_bench.py [--models tiny_mlp,tiny_cnn,tiny_transformer,resnet50]
        [--strategies 10] [--steps 10] [--warmup 2] [--warmup-s 2] [--rounds 3] [--round-s 0.5] [--hetero]
        [--no-overheads] [--out benchmarks/fidelity_bench.md] [--record run.json]
    .venv/bin/python benchmarks/fidelity_bench.py --replay run1.json run2.json ...

For each model: a CPU profile measured under the workers' thread setting (intra 1, inter 1;
`python -m tfplace.profile --threads 1`, Grappler off like the runtime), with a comm fit
(cluster_comm; --bundled-comm: graph_defs/profiles/local_comm_cpu.json) and runtime overheads,
both measured a pass before each round of timed steps on a scratch cluster with the run's
settings (RoundConditions: the simulator gets their medians); strategies = the registry baselines
(make_problem + registry.generate, as compare uses them) plus random valid strategies up to
--strategies; for each, the real iteration time (StepRunner.run_steps: warm-up, then the median
of timed steps) on a LocalCluster of 3 tasks (clusters/local_cpu.json) and the simulated time of the
same PlacedGraph. Every strategy's session stays open and --rounds round-robin passes time
--steps steps of each (real = the median of all of them), so a slow phase of the machine hits
every strategy alike. Prints per model median / worst |sim - real| / real and Kendall tau, with
real = the median step and with real = the fastest step, and the table, which also has each
task's CPU per timed step (task_cpu_seconds), the shortest step that CPU allows under the tasks'
quotas (cpu_bound_seconds) and the simulator's lane busy time per device; writes it (with the
command) to --out.

Default: homogeneous, every task with 1 intra-op thread, unpinned (3 tasks share 2 cores).
--hetero: the emulated heterogeneous cluster clusters/local_cpu_hetero.json (task 0 alone on
core 0; tasks 1 and 2 on core 1 with a 0.5 CPU quota each, tfplace.emulation.cpu_quota; needs root; the
client, this process, on core 1 too), with one profile kind per speed measured under the same
pinning and quota. Profiles are measured anew, a pass before each round of timed steps like the
comm fit and the overheads (--reuse-profiles keeps those of a former run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# zoo models and the sizes they run at; bundles are exported on first use (graph_defs.export)
MODELS = {"tiny_mlp": {"batch_size": 48}, "tiny_cnn": {"batch_size": 48, "image_size": 16},
          "tiny_transformer": {"batch_size": 16, "seq_len": 8, "num_layers": 2},
          "resnet50": {"batch_size": 8, "image_size": 32}}


def bundle_path(model: str) -> str:
    """The model's bundle (<stem>.json) relative to the repository, exported if missing."""
    from tfplace.graph_defs.export import ensure_bundle
    return os.path.relpath(ensure_bundle(model, **MODELS[model]), ROOT)


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
BASELINES = ("single", "dp_even_allreduce", "dp_even_ps", "dp_proportional_allreduce", "dp_proportional_ps",
             "model_parallel_round_robin", "model_parallel_contiguous", "heft", "pipeline")
MAX_GROUPS = 8
# traced repeats per batch size of each model's profile, round-robin over the sizes, split over the
# profile passes (one before each round, RoundConditions): a slow phase of this machine (seconds)
# then has to cover more than half of them to move a median
PROFILE_REPEATS = 9


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


def cpu_bound_seconds(cpu_s_per_task, fractions=None) -> float:
    """The shortest step the tasks' measured CPU allows: a task that used c seconds of CPU in a
    step under a quota of f CPUs (fractions[i]; None or 1: no quota) needs at least c / f seconds
    of wall time (tfplace.simulator.core.cpu_bound_seconds, the simulator's bound, without its host
    cores: tasks that share a core would bound it further; this bound ignores that)."""
    from tfplace.simulator.core import cpu_bound_seconds as bound
    quotas = fractions if fractions is not None else [None] * len(cpu_s_per_task)
    return bound(np.asarray(cpu_s_per_task, dtype=np.float64),
                 np.array([1.0 if f is None else float(f) for f in quotas]))


def ms_list(seconds) -> str:
    """'1.20/3.40/0.05': seconds as milliseconds joined by '/'."""
    return "/".join(f"{x * 1e3:.2f}" for x in seconds)


# Untimed steps run for at least this long as well as at least the warm-up count: on this
# machine a strategy's first steps after another strategy (or a pause) ran slower for 10-50 steps
# (the tiny MLP's data-parallel all-reduce step 8.2-9.1 ms in its first 10, 6.9-7.0 ms after;
# its single-device step 0.52 ms, then 0.37-0.44), which 2 warm-up steps of a 0.4 ms step miss.
WARMUP_S = 0.1
# A strategy's own warm-up (--warmup-s) is longer: the slow stretch lasts a time, not a step
# count. With ResNet-50's ten strategies open on the heterogeneous cluster, its single-device
# step ran 155-164 ms for about 1.5 s after the random strategy's steps, then 147-151 ms. With
# 0.1 s (one ResNet-50 step) its single-device step came out 0.86-0.92x simulated, run after
# run; with 2 s, 0.92-0.99x in three runs.
STRATEGY_WARMUP_S = 2.0
# Timed steps per strategy and round run for at least this long (timed_round).
ROUND_S = 0.5


def warm_up(call, steps: int, min_s: float = WARMUP_S) -> None:
    """Calls `call` at least `steps` times and until `min_s` seconds have passed."""
    t0 = time.perf_counter()
    done = 0
    while done < steps or time.perf_counter() - t0 < min_s:
        call()
        done += 1


def timed_round(run_steps, steps: int, min_s: float) -> list:
    """Wall seconds of each step of one round: `run_steps(n)` (a list of n step times) is called
    for `steps` steps at a time until at least `min_s` seconds of steps have run. A round of 10
    steps of a tiny model lasted 4-40 ms, and one slow burst of the machine moved its median: the
    tiny transformer's single-device step had round medians 4.30, 3.45 and 3.37 ms in one run,
    its HEFT placement (the same single task) 2.74, 5.10 and 2.46 ms in another."""
    times = []
    while not times or sum(times) < min_s:
        times += run_steps(steps)
    return times


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


def local_cluster_setup(hetero: bool, inter_threads: int = 1):
    """(tfplace Cluster, LocalCluster keyword arguments) of the bench's 3-task cluster: 1 intra-op
    and `inter_threads` inter-op threads per task; with `hetero`, HETERO's pinning and quotas, and
    this process (the client) pinned to HETERO["client_cpus"].

    A TF server runs its RPC handlers (RecvTensor included) on its inter-op pool: with one thread,
    a task that runs a long chain of ops serves no tensor to the others until the chain ends (in
    ResNet-50's PS step on the heterogeneous cluster, the workers' batch-norm statistics, ready
    after 31-36 ms, reached the server at 257 ms, and its own forward pass waited for them). The
    overheads record the count (runtime_overheads.inter_op_threads): with one thread the
    simulator charges each message's CPU to the lanes of its two ends, the sending half as a
    handler that runs only when nothing else is ready there; with more it runs it beside them
    (tfplace.lowering.assemble._runtime_overheads)."""
    from tfplace.formats.cluster import load_cluster
    cluster = load_cluster(os.path.join(ROOT, "clusters", HETERO["cluster"] if hetero else "local_cpu.json"))
    kwargs = dict(num_tasks=3, threads_per_task=[1, 1, 1], inter_threads_per_task=[inter_threads] * 3)
    if hetero:
        kwargs.update(cpus_per_task=HETERO["cpus"], cpu_fraction_per_task=HETERO["fractions"])
        pin_this_process(HETERO["client_cpus"])
    return cluster, kwargs


FEED_ROWS, FEED_BIG_ROWS = 48, 4096  # [rows, 16] float32 feeds: 3 KB and 256 KB


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
    ended three bench runs, each in measure_overheads. Other errors, and the last try's,
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


def collective_chain(devs, k: int, group: int, reduce: bool, elements: int = 4, key_base=None):
    """A step builder (step_costs): k all-reduces of a value of 4 * elements bytes across the
    first `group` tasks of `devs`, each task's chained to its previous one by a control edge like
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
            for d in members:
                with tf.device(d), tf.control_dependencies(prev[d]):
                    v = bases[d] + float(i)
                    y = tf.raw_ops.CollectiveReduceV2(
                        input=v, group_size=group, group_key=20 + group,
                        instance_key=base_key + i,
                        ordering_token=[], merge_op="Add", final_op="Id") if reduce else tf.identity(v)
                prev[d] = [y.op]
                outs.append(y)
        return outs
    return build


def measure_overheads(lc, cluster, comm: dict, reps: int = 30, fan: int = 24, cpu_reps: int = 200,
                      raw: bool = True) -> dict:
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
    with those kinds (1-2, then 0-1, 0-2): on the emulated heterogeneous cluster a hop between
    two throttled tasks costs more than one to the unthrottled task;
    transfer_gap_s: wall time per tensor when `fan` independent 16-byte tensors cross from task 1
    to task 2 at once (the gap between the messages of a burst); collective_s: per group size,
    the wall of one 16-byte all-reduce in a chain of `fan` chained by control edges on every
    participant (collective_chain, beyond the same chain of Identity ops; `raw`'s
    `serial_collective_s`), beyond the all-reduce fit's time at 16 bytes for that group
    (`comm`). The fit comes from single traced all-reduces (cluster_comm; 1.02-1.28 ms for 3
    tasks at 16 bytes on the emulated heterogeneous cluster); a chained one took 0.52-0.61 ms,
    and a model's all-reduces added 0.50-0.90 ms each to its untraced step (task_cpu_probe.py,
    the step with and without them). `raw` also has the burst figures
    of independent all-reduces, and what bytes cost: wall and CPU per byte of a 1 MiB message
    between tasks 1 and 2 and of a chained 1 MiB all-reduce across every task, beyond 16 bytes
    (`message_cpu_s_per_byte`: both ends together; `collective_cpu_s_per_byte_per_task`: from
    the `collective_cpu_s` curve's points, which time those all-reduces' CPU already). CPU
    comes from the scheduler's nanosecond counters (task_cpu_seconds) throughout. With `raw`
    (the first pass) two model keys come too, for the step's CPU bound (tfplace.overheads.cpu_demand):
    `message_cpu_s_per_byte` (that per-byte message CPU, at least 0) and `collective_cpu_s`,
    per group size the CPU seconds one participant spends per all-reduce at each of
    COLLECTIVE_CPU_BYTES (a chain of 8 like collective_chain's, beyond the same chain of
    Identity ops, from the scheduler's counters), the participants' mean and per device kind
    (participant_curves); with `raw` False none of these are measured and `raw`
    is left out. `comm`: the comm fit the model uses (a
    profile's "comm" section, see cluster_comm), for the raw all-reduce figures; `cluster`: the
    tfplace Cluster `lc` runs (one device per task, device i on task i)."""
    import tensorflow as tf
    devs = lc.device_names
    kinds = [d.kind for d in cluster.devices]

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
            base = seed_tensor(devs[1])
            for i in range(k):
                with tf.device(devs[1]):
                    v = base + float(i)
                with tf.device(devs[2] if cross else devs[1]):
                    outs.append(v * 2.0)
            return outs
        return build

    def ping_pong(k, cross, a=1, b=2, elements=4):
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
                for d, base in zip(devs, bases):
                    with tf.device(d):
                        v = base + float(i)
                        outs.append(tf.raw_ops.CollectiveReduceV2(
                            input=v, group_size=len(devs), group_key=7, instance_key=1000 + i, ordering_token=[],
                            merge_op="Add", final_op="Id") if reduce else v)
            return outs
        return build

    # wall and each task's CPU of a one-task step, and of a step with a partition on every task
    step, step_cpu = step_costs(lc, one_task, reps, cpu_reps)
    every, every_cpu = step_costs(lc, every_task(devs), reps, cpu_reps)
    further = len(devs) - 1
    # what a step's feed costs: one more fed tensor, and the bytes of a large one (the client
    # sends the feed to task 0 through the master: the tiny CNN's 147 KB feed cost ~70 us more
    # than the 3 KB one above, its 2 tensors ~25 us more than 1)
    feed_input = timed(one_task, inputs=2)[0] - step
    feed_per_byte = max((timed(one_task, rows=FEED_BIG_ROWS)[0] - step) / ((FEED_BIG_ROWS - FEED_ROWS) * 64), 0.0)
    chain = 40 * fan  # ~1 ms of ops: the per-op difference must stand above the steps' jitter
    op = (timed(add_chain(devs, chain))[0] - timed(add_chain(devs, 0))[0]) / chain
    local_op = local_op_seconds(chain, reps)
    worker = (every - step) / further
    cross_wall, cross_cpu = timed(fan_out(fan, True), cpu=True)
    local_wall, local_cpu = timed(fan_out(fan, False), cpu=True)
    # a message costs the CPU of both its ends: one chain per pair of device kinds, between the
    # first pair of tasks with those kinds (tasks 1 and 2 first: task 0 also serves the client)
    by_pair = {}  # kind pair -> (hop wall, hop CPU, the simulator's link seconds, link latency)
    shares = {}  # pair of different kinds -> {kind: the share of the hop's CPU that end paid}
    for a, b in ((1, 2), (0, 1), (0, 2)):
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
           "how": "benchmarks/fidelity_bench.py measure_overheads (wall: median of %d steps; CPU: %d steps; "
                  "bursts and chains of %d)" % (reps, cpu_reps, fan)}
    n = len(devs)

    def fit16(group):
        c = comm["allreduce"][str(group)]
        return c["latency_s"] + 16 / c["bandwidth_bytes_per_s"]

    serial = {}  # group size -> wall per collective of a chained sequence, beyond the plain chain
    for group in range(2, n + 1):
        serial[group] = (timed(collective_chain(devs, fan, group, True))[0]
                         - timed(collective_chain(devs, fan, group, False))[0]) / fan
    # what an all-reduce in a step takes beyond the fit the simulator charges (single traced
    # all-reduces), like transfer_s for a message: negative where a chained one takes less
    out["collective_s"] = {str(g): serial[g] - fit16(g) for g in serial}
    if not raw:
        return out
    coll_wall, coll_cpu = timed(collectives(fan, True), cpu=True)
    plain_wall, plain_cpu = timed(collectives(fan, False), cpu=True)

    # what bytes cost: the same chains with BIG_MESSAGE_BYTES per message / all-reduce, against
    # 16 bytes (both measured the same way, so the difference is the bytes' share)
    big, k = BIG_MESSAGE_BYTES // 4, 6
    hop_big = timed(ping_pong(k, True, 1, 2, big), cpu=True, cpu_steps=40)
    hop_small = timed(ping_pong(k, True, 1, 2), cpu=True, cpu_steps=40)
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
    out["raw"] = {**first["raw"], "passes": [{k: v for k, v in r.items() if k not in ("raw", "how")} for r in runs]}
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


# Emulated heterogeneous cluster (--hetero): task 0 alone on core 0, tasks 1 and 2 on core 1 with
# half of it each; every profile kind is pinned like its tasks, the quota kind scaled by the
# slowdown measured under its quota (profiler_cli --cpu-fraction).
# The client (this process) runs on core 1: unpinned, its threads also ran on core 0 and slowed
# task 0 (the tiny transformer's single-device step took 5.3 ms instead of 2.9 ms), which no
# profile of task 0's kind shows.
HETERO = {"cluster": "local_cpu_hetero.json", "cpus": [[0], [1], [1]], "fractions": [None, 0.5, 0.5],
          "client_cpus": [1], "kinds": {"CPU": ("0", 0.0), "CPU_half": ("1", 0.5)}}


def pin_this_process(cpus) -> None:
    """Pins every thread of this process (and the threads they start later) to `cpus`."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass  # a thread that ended meanwhile (a CPU this machine lacks still raises)


BUNDLED_COMM = os.path.join("graph_defs", "profiles", "local_comm_cpu.json")
COMM_MAX_BYTES = 4 << 20  # the tiny models' largest gradient is far smaller; the fit needs the slope too


def cluster_comm(lc=None, passes: int = 3) -> dict:
    """The comm fit the simulator is given, as a profile file holds it ({"comm": ..., "conditions":
    {"comm": ...}}): measured on `lc` (the cluster the steps run on, right before they are timed,
    tfplace.profiling.comm_profiler, ~5 s a pass; each latency and bandwidth the median over `passes`), or
    with lc None the bundled fit of BUNDLED_COMM (homogeneous 3-task cluster, unpinned). On the
    emulated heterogeneous cluster a 3-task all-reduce measured 1.0-1.4 ms (3-pass medians) where
    the bundled fit says 1.8 ms, a 2-task one 0.3-0.6 ms against 0.9 ms: the fit belongs to the
    cluster it was measured on. One pass alone gave 1.04-1.70 ms for the same 3-task all-reduce
    within an hour."""
    if lc is None:
        with open(os.path.join(ROOT, BUNDLED_COMM)) as f:
            data = json.load(f)
        return {"comm": data["comm"], "conditions": {"comm": data["conditions"]["comm"]}}
    return comm_of_passes([comm_pass(lc) for _ in range(passes)])


def comm_pass(lc):
    """One pass of tfplace.profiling.comm_profiler on `lc` (a CommMeasurement), every group size up to its tasks."""
    from tfplace.profiling.comm_profiler import measure_comm
    return measure_comm(cluster=lc, max_bytes=COMM_MAX_BYTES, group_sizes=range(2, lc.num_tasks + 1))


def comm_of_passes(runs) -> dict:
    """cluster_comm's fit from comm_pass results: each latency and bandwidth the median over them."""
    import dataclasses
    passes = len(runs)

    def median_fit(fits):
        return {key: statistics.median(dataclasses.asdict(f)[key] for f in fits)
                for key in ("latency_s", "bandwidth_bytes_per_s")}
    comm = {"p2p": median_fit([m.model.p2p for m in runs]),
            "allreduce": {str(g): median_fit([m.model.allreduce[g] for m in runs]) for g in runs[0].model.allreduce}}
    conditions = {**runs[0].conditions, "passes": [m.conditions for m in runs],
                  "statistic_over_passes": f"median of {passes} passes per latency and bandwidth"}
    return {"comm": comm, "conditions": {"comm": conditions}}


def profile_path(model: str, bundle: str, batch: int, workdir: str, hetero: bool = False, fresh: bool = True,
                 repeats: int = PROFILE_REPEATS, tag: str = "") -> str:
    """Measures the CPU profile of `bundle` at 1 intra/inter thread into workdir (without a comm
    fit: RoundConditions.settled attaches the run's to the profile the simulator reads); with
    `hetero`, one kind per emulated speed,
    each pinned like its tasks, a quota kind's ops scaled by the slowdown measured under its
    quota (profiler_cli --cpu-fraction). `fresh` measures
    anew even if workdir has it: this machine's speed drifts by phases (the tiny transformer's
    step took 1.85 ms at one hour and 2.7-3.3 ms at the next, same process setup), so a profile
    is only comparable with steps timed right after it (a few seconds per model). `repeats`:
    the profiler's --repeats; `tag` goes into the file's name (one file per pass)."""
    out = profile_file(model, workdir, hetero, tag)
    if fresh and os.path.exists(out):
        os.remove(out)
    if os.path.exists(out):
        with open(out) as f:
            if "untraced_step_wall_s" not in json.load(f).get("conditions", {}):
                os.remove(out)  # measured before the profiler removed its tracing cost: measure again
    if not os.path.exists(out):
        sizes = sorted({b for b in (1, 2, 4, 8, 16, 24, 32, 48) if b <= batch} | {batch})
        base = [sys.executable, "-m", "tfplace.profile", "--graph", bundle, "--device", "CPU",
                "--batch-sizes", ",".join(map(str, sizes)), "--threads", "1", "--inter-threads", "1",
                "--repeats", str(repeats), "--warmup", "2", "--out", out, "--quiet"]
        if not hetero:
            subprocess.run(base, check=True, cwd=ROOT)
        else:
            for i, (kind, (cpus, fraction)) in enumerate(HETERO["kinds"].items()):
                subprocess.run(base + ["--kind", kind, "--cpus", cpus, "--cpu-fraction", str(fraction),
                                       "--statistic", "median"] + (["--merge"] if i else []), check=True, cwd=ROOT)
    return out


def profile_file(model: str, workdir: str, hetero: bool, tag: str = "") -> str:
    """Where profile_path writes `model`'s profile (`tag`: one pass's file; "" the profile the
    simulator reads)."""
    return os.path.join(workdir, f"{model}_t1{'_hetero' if hetero else ''}{tag}.json")


def profile_repeats(passes: int) -> int:
    """The profiler's --repeats in each of `passes` profile passes: PROFILE_REPEATS over them all."""
    return max(1, -(-PROFILE_REPEATS // passes))


def median_profile(paths, out: str) -> str:
    """Writes to `out` the profile whose every op time (per op, kind and batch size) is the median
    over the profile files `paths` (passes of profile_path on the same graph, kinds and batch
    sizes); the rest is the first pass's, its conditions with `profile_passes` (how many) and
    `statistic_over_passes`. Returns out."""
    passes = []
    for path in paths:
        with open(path) as f:
            passes.append(json.load(f))
    first = passes[0]
    ops = {}
    for op, by_kind in first["ops"].items():
        ops[op] = {kind: {b: float(np.median([p["ops"][op][kind][b] for p in passes])) for b in by_batch}
                   for kind, by_batch in by_kind.items()}
    conditions = {**first.get("conditions", {}), "profile_passes": len(passes),
                  "statistic_over_passes": f"median of {len(passes)} passes per op, kind and batch size"}
    with open(out, "w") as f:
        json.dump({**first, "ops": ops, "conditions": conditions}, f)
    return out


def attach_comm(path: str, comm: dict) -> str:
    """Writes `comm` (cluster_comm's form) into the profile file `path` as its comm fit; returns path."""
    with open(path) as f:
        prof = json.load(f)
    prof["comm"] = comm["comm"]
    prof.setdefault("conditions", {})["comm"] = comm["conditions"]["comm"]
    with open(path, "w") as f:
        json.dump(prof, f)
    return path


def typed_overheads(overheads, source: str = "measured runtime overheads"):
    """The RuntimeOverheads of a measured or recorded overheads object (None: none)."""
    from tfplace.overheads.model import overheads_from_json
    return None if overheads is None else overheads_from_json(overheads, source)


def simulate_with(graph, grouping, cluster, strategy, profile, overheads, sim_options=None):
    """The SimReport of `strategy`: lowered, through the runtime-overhead pass, simulated."""
    from tfplace.baselines.problem import with_overheads
    from tfplace.lowering.lower import lower
    from tfplace.simulator import SimOptions, simulate
    placed = with_overheads(lower(graph, grouping, cluster, strategy, profile), cluster, overheads)
    return simulate(placed, cluster, sim_options or SimOptions())


def random_strategy(rng, devices, group_names, batch):
    """Random uneven shares over random device subsets, 30% PS; no micro-batches or priorities."""
    from tfplace.testing import random_strategy as shared_random_strategy
    return shared_random_strategy(rng, group_names, devices, batch, micro_batch_probability=0.0,
                                  ps_probability=0.3, priority_probability=0.0)


def handler_threads(inter_threads_per_task) -> int:
    """The fewest inter-op threads any task has (LocalCluster's inter_threads_per_task; TF's
    default, None or 0, is one per core of the machine): the runtime_overheads.inter_op_threads
    the simulator is given."""
    return min(int(t) if t else (os.cpu_count() or 1) for t in inter_threads_per_task)


class RoundConditions:
    """The op profile, the comm fit and the runtime overheads of one model, measured one pass at
    a time right before each round of timed steps (profile_path with PROFILE_REPEATS spread over
    the passes, comm_pass, measure_overheads), and given to the simulator as the
    medians over the passes (median_profile, comm_of_passes, median_overheads). The machine's
    speed moves by phases of seconds to minutes, and figures measured all at once before the
    steps can come from another phase than most of them: one run measured step_s at 0.41 ms
    before the tiny MLP (0.25-0.31 ms in the four runs before), its steps then ran at the usual
    speed and were simulated at up to 1.5x. With --reuse-profiles the profile is a former run's
    (measured once if missing); with --bundled-comm the comm fit is the bundled one; with
    --no-overheads there are no overheads (None).

    The comm fit and the overheads are measured on a scratch cluster started for the pass with
    the timed cluster's settings (`lc_kwargs`: the same pinning, quotas and threads), never on
    the cluster that times the strategies, whose servers then run only the strategies, as a
    user's run only their model. In two runs with the micro-benchmarks on the timed servers the
    tiny CNN's DP all-reduce step took 13.1-13.5 ms and each task 12-14% more CPU than in a run
    without them (11.6 ms; the random strategy 16.1-17.0 against 14.5 ms). It is not the only
    cause of such a spread: with the scratch cluster, one run still timed that step at 13.0 ms,
    another at 11.5 ms (benchmarks/fidelity_bench_hetero.md).

    model, bundle, batch: the graph profiled (profile_path); lc_kwargs: the timed servers'
    LocalCluster settings (their inter-op threads go into the overheads)."""

    def __init__(self, lc_kwargs, cluster, args, model: str, bundle: str, batch: int):
        self.lc_kwargs, self.cluster, self.args = lc_kwargs, cluster, args
        self.model, self.bundle, self.batch = model, bundle, batch
        self.comm_runs, self.overhead_runs, self.profile_runs = [], [], []

    def measure(self) -> None:
        """One more pass of each (the first also measures the overheads' `raw` figures)."""
        args = self.args
        if not (args.reuse_profiles and self.profile_runs):
            tag = "" if args.reuse_profiles else f"_pass{len(self.profile_runs)}"
            self.profile_runs.append(profile_path(self.model, self.bundle, self.batch, args.workdir, args.hetero,
                                                  fresh=not args.reuse_profiles, repeats=profile_repeats(args.rounds),
                                                  tag=tag))
        if args.bundled_comm and args.no_overheads:
            return
        from tfplace.runtime.local_cluster import LocalCluster
        with LocalCluster(**self.lc_kwargs) as scratch:
            this_comm = None
            if not args.bundled_comm:
                self.comm_runs.append(comm_pass(scratch))
                this_comm = comm_of_passes(self.comm_runs[-1:])
            if not args.no_overheads:
                self.overhead_runs.append(measure_overheads(scratch, self.cluster, (this_comm or self.comm())["comm"],
                                                            raw=not self.overhead_runs))

    def comm(self) -> dict:
        return cluster_comm() if self.args.bundled_comm else comm_of_passes(self.comm_runs)

    def overheads(self):
        if self.args.no_overheads:
            return None
        out = median_overheads(self.overhead_runs)
        out["inter_op_threads"] = handler_threads(self.lc_kwargs["inter_threads_per_task"])
        return out

    def settled(self):
        """(comm fit, overheads, the base Profile the simulator reads) over the passes so far:
        the profile file is the passes' medians (median_profile) with that comm fit attached."""
        from tfplace.formats.profile import load_profile
        comm = self.comm()
        out = profile_file(self.model, self.args.workdir, self.args.hetero)
        if self.profile_runs != [out]:
            median_profile(self.profile_runs, out)
        return comm, self.overheads(), load_profile(attach_comm(out, comm))


def bench_model(model, lc, lc_kwargs, cluster, args, out_rows, record=None):
    """Times and simulates the strategies of one model (its conditions measured on scratch
    clusters started with `lc_kwargs`, RoundConditions): each round on a fresh LocalCluster
    started with `lc_kwargs` (--servers round), or every round on `lc` (--servers run); with
    `record` (a dict), also keeps what a later --replay needs: the profile (with its comm fit),
    the overheads, each strategy and every timed step.

    Why fresh servers each round: a server process keeps the speed it started with. The same
    strategies on two clusters started one after the other took 7.46 and 6.65 ms (the tiny CNN's
    model-parallel round robin), 12.38 and 12.75 ms (its DP all-reduce); the tiny MLP's
    model-parallel contiguous step took 2.45 and 2.91 ms in two bench runs and 2.38 ms on a
    third cluster, with no change to the model or the strategy. One cluster for a whole run puts
    every round on one draw of that spread; the profile already takes the median over fresh
    profiler processes (one per pass), and the real steps now do the same over fresh servers."""
    from tfplace.baselines import registry
    from tfplace.baselines.problem import make_problem
    from tfplace.ir.loader import load_op_graph
    from tfplace.runtime.local_cluster import LocalCluster
    from tfplace.rewrite.graph_rewrite import rewrite_step
    from tfplace.runtime.step_runner import StepRunner, random_feed
    bundle = os.path.join(ROOT, bundle_path(model))
    graph = load_op_graph(bundle)
    batch = int(graph.reference_batch_size)
    conditions = RoundConditions(lc_kwargs, cluster, args, model, bundle, batch)
    conditions.measure()  # the planners see the first pass; the simulator the median of all of them
    _, overheads, profile = conditions.settled()
    problem = make_problem(graph, cluster, profile, max_groups=MAX_GROUPS, global_batch_size=batch,
                           overheads=typed_overheads(overheads))
    plans = []
    for name in BASELINES:
        try:
            plans.append((name, registry.generate(name, problem)))
        except Exception as err:  # a planner that cannot serve this problem is skipped, reported
            print(f"  {model}/{name}: skipped ({type(err).__name__}: {str(err)[:80]})", flush=True)
    rng = np.random.default_rng(0)
    devs = list(cluster.device_names)
    k = 0
    while len(plans) < args.strategies:
        plans.append((f"random_{k}", random_strategy(rng, devs, problem.group_names, batch)))
        k += 1
    failed = set()

    def failed_with(name, err):
        failed.add(name)
        print(f"  {model}/{name}: FAILED {type(err).__name__}: {str(err)[:120]}", flush=True)

    steps = []  # (name, rewritten step): rewritten once, run on every round's servers
    for name, strategy in plans:
        try:
            steps.append((name, rewrite_step(graph, strategy, cluster, profile=profile, grouping=problem.grouping)))
        except Exception as err:
            failed_with(name, err)
    times = {name: [] for name, _ in steps}
    round_sizes = {name: [] for name, _ in steps}  # steps timed in each round
    cpu_s = {name: np.zeros(lc_kwargs["num_tasks"]) for name, _ in steps}  # servers' CPU over the timed steps

    def open_runs(servers, runs):
        """Appends (name, runner, feed) to `runs` for every step not failed, each session open
        on `servers` at once, so that a round interleaves them."""
        for name, step in steps:
            if name in failed:
                continue
            try:
                runner = StepRunner(servers, step, timeout_s=120)
                runs.append((name, runner, random_feed(step.inputs, batch, 0)))
                runner.initialize()
            except Exception as err:
                failed_with(name, err)

    def time_round(servers, runs):
        # round-robin: a slow phase of the (shared, 2-core) machine hits every strategy alike
        for name, runner, feed in runs:
            if name in failed:
                continue
            try:
                warm_up(lambda: runner.run_steps(1, feed), args.warmup, args.warmup_s)
                before = task_cpu_seconds(servers.pids)
                timed = timed_round(lambda n: runner.run_steps(n, feed), args.steps, args.round_s)
                times[name] += timed
                round_sizes[name].append(len(timed))
                cpu_s[name] += task_cpu_seconds(servers.pids) - before
            except Exception as err:
                failed_with(name, err)

    def close(runs):
        for _, runner, _ in runs:
            runner.close()
        runs.clear()

    shared = []  # the sessions on `lc` (--servers run), open for the whole run
    try:
        for r in range(args.rounds):
            if r:
                conditions.measure()
            if args.servers == "run":
                if not shared:
                    open_runs(lc, shared)
                time_round(lc, shared)
                continue
            with LocalCluster(**lc_kwargs) as fresh:
                runs = []
                try:
                    open_runs(fresh, runs)
                    time_round(fresh, runs)
                finally:
                    close(runs)
        comm, overheads, base_profile = conditions.settled()
        print("  comm fit:", json.dumps(comm["comm"]), flush=True)
        print("  runtime overheads:", json.dumps({k: v for k, v in (overheads or {}).items() if k != "raw"}),
              flush=True)
        typed = typed_overheads(overheads)
        rows = []
        strategies = dict(plans)
        if record is not None:
            record[model] = {"bundle": os.path.relpath(bundle, ROOT), "profile": base_profile.to_json(),
                             "overheads": overheads, "rows": []}
        fractions = HETERO["fractions"] if args.hetero else None
        for name, _ in steps:
            if name not in failed:
                real, fastest = statistics.median(times[name]), min(times[name])
                # the same PlacedGraph the rewrite ran, lowered with the conditions of every round
                report = simulate_with(graph, problem.grouping, cluster, strategies[name], base_profile, typed)
                sim = report.iteration_time_s
                cpu, busy = (cpu_s[name] / len(times[name])).tolist(), list(report.busy_s)
                bound = cpu_bound_seconds(cpu, fractions)
                rows.append((name, real, sim, fastest, round_medians(times[name], round_sizes[name]), cpu, busy, bound))
                if record is not None:
                    record[model]["rows"].append({"name": name, "strategy": strategies[name].to_json(),
                                                  "real_s": times[name], "round_steps": round_sizes[name], "sim_s": sim,
                                                  "task_cpu_s_per_step": cpu, "sim_busy_s": busy})
                print(f"  {model}/{name}: real {real * 1e3:.2f} ms (fastest {fastest * 1e3:.2f})  "
                      f"sim {sim * 1e3:.2f} ms; CPU/step per task {ms_list(cpu)} ms (bound "
                      f"{bound * 1e3:.2f}), sim lanes {ms_list(busy)} ms", flush=True)
    finally:
        close(shared)
    out_rows[model] = rows
    return comm, overheads


RECORD_FORMAT = "tfplace.fidelity_record"


def replay(paths, verbose: bool = False) -> int:
    """Re-simulates recorded runs (--record) with the current simulator and compares with their
    recorded real steps: model changes can be judged on several runs of this noisy machine
    without timing anything again. Same strategies, profiles and runtime overheads as recorded
    (per model; records before the overheads were measured per model have one set for all);
    `verbose` (--verbose) also prints each strategy's sim / real, recorded and now."""
    from tfplace.baselines.problem import make_problem
    from tfplace.formats.cluster import load_cluster
    from tfplace.ir.loader import load_op_graph
    from tfplace.formats.jsonio import FieldReader
    from tfplace.formats.profile import profile_from_reader
    from tfplace.formats.strategy import strategy_from_reader
    for path in paths:
        rec = FieldReader.from_file(path, expected_format=RECORD_FORMAT).data
        cluster = load_cluster(os.path.join(ROOT, "clusters", rec["cluster"]))
        print(f"{path}: {rec['cluster']}, recorded {rec['date']}")
        for model, m in rec["models"].items():
            if not os.path.exists(os.path.join(ROOT, m["bundle"])) and model in MODELS:
                bundle_path(model)  # a zoo bundle this checkout has not exported yet
            graph = load_op_graph(os.path.join(ROOT, m["bundle"]))
            batch = int(graph.reference_batch_size)
            profile = profile_from_reader(FieldReader(m["profile"], f"{path}: models.{model}.profile"))
            overheads = typed_overheads(m.get("overheads", rec.get("overheads")), f"{path}: models.{model}.overheads")
            grouping = make_problem(graph, cluster, profile, max_groups=MAX_GROUPS, global_batch_size=batch).grouping
            rows = []
            for r in m["rows"]:
                strategy = strategy_from_reader(FieldReader(r["strategy"], f"{path}: {model}/{r['name']}"))
                sim = simulate_with(graph, grouping, cluster, strategy, profile, overheads).iteration_time_s
                rows.append((r["name"], statistics.median(r["real_s"]), sim, min(r["real_s"])))
                if verbose:
                    real = rows[-1][1]
                    print(f"    {model}/{r['name']}: real {real * 1e3:.2f} ms, sim/real {sim / real:.2f} "
                          f"(recorded {r['sim_s'] / real:.2f})")
            med, worst, tau = summary(rows)
            then, _, _ = summary([(r["name"], statistics.median(r["real_s"]), r["sim_s"], 0) for r in m["rows"]])
            print(f"  {model}: median {med:.1%} (recorded {then:.1%}), worst {worst:.1%}, tau {tau:.2f}")
    return 0


def conditions_table(conditions) -> list:
    """Markdown lines: per model, the comm fit and the main overheads it was simulated with (µs)."""
    def us(x):
        return f"{x * 1e6:.0f}"

    def pairs(d):
        return ", ".join(f"{k.replace('|', '-')} {us(v)}" for k, v in sorted(d.items()))  # "|" would split the cell

    def curve(d):  # the largest group's all-reduce CPU per participant at each measured size
        if not d:
            return "-"
        c = d[max(d, key=int)]
        by_kind = c.get("seconds_by_kind") or {}  # older records have the mean only
        return "; ".join(f"{label} " * bool(by_kind) + " / ".join(us(v) for v in values)
                         for label, values in [("mean", c["seconds"]), *sorted(by_kind.items())])

    def feed(o):  # older records have no feed costs
        if "feed_input_s" not in o:
            return "-"
        return f"{us(o['feed_input_s'])} / {o['feed_s_per_byte'] * 1e9:.2f}"
    def shares(d):  # each end's share of a message between two kinds; older records have none
        return "".join(f"; {pair.replace('|', '-')}: " + ", ".join(f"{k} {v:.0%}" for k, v in sorted(ends.items()))
                       for pair, ends in sorted((d or {}).items()))

    def per_group(d):  # older records have no collective_s
        return " / ".join(us(d[g]) for g in sorted(d, key=int)) if d else "-"
    lines = ["| model | p2p fit latency | all-reduce fit latency (x2 / x3) | collective_s (x2 / x3) | step_s | "
             "feed_input_s / feed_s_per_byte (ns) | "
             "worker_s | transfer_s | message_cpu_s (its ends' shares) | "
             "collective_cpu_s per participant of an all-task all-reduce, mean and per kind (" +
             " / ".join(f"{b} B" for b in COLLECTIVE_CPU_BYTES) + ") |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for model, (comm, over) in conditions.items():
        c = comm["comm"]
        ar = " / ".join(us(c["allreduce"][g]["latency_s"]) for g in sorted(c["allreduce"], key=int))
        o = over or {}
        lines.append(f"| {model} | {us(c['p2p']['latency_s'])} | {ar} | {per_group(o.get('collective_s'))} | "
                     f"{us(o['step_s']) if o else '-'} | {feed(o)} | "
                     f"{us(o['worker_s']) if o else '-'} | {pairs(o.get('transfer_s', {}))} | "
                     f"{pairs(o.get('message_cpu_s', {}))}{shares(o.get('message_cpu_share'))} | "
                     f"{curve(o.get('collective_cpu_s'))} |")
    return lines


def round_medians(steps_s, round_steps) -> list:
    """The median step of each round-robin round: `steps_s` in the order they ran, `round_steps`
    how many of them each round timed (in order; they add up to len(steps_s))."""
    ends = np.cumsum(round_steps)
    return [statistics.median(steps_s[end - n:end]) for n, end in zip(round_steps, ends)]


def round_spread(rows) -> float:
    """Median over strategies and rounds of |round median - real| / real (rows[k][4]: the round
    medians, rows[k][1]: real). Recorded runs of the heterogeneous cluster: 4-7% (90th percentile
    10-32%), and the same strategy's real step differed by a median 8-16% from one run to the next."""
    return float(np.median([abs(r - row[1]) / row[1] for row in rows for r in row[4]]))


def summary(rows, column: int = 1):
    """(median, worst |sim - real| / real, Kendall tau) with real = rows[k][column] (1: the
    median step, 3: the fastest)."""
    from scipy.stats import kendalltau
    real = np.array([r[column] for r in rows])
    sim = np.array([r[2] for r in rows])
    err = np.abs(sim - real) / real
    tau = kendalltau(real, sim).statistic if len(rows) > 1 else float("nan")
    return float(np.median(err)), float(np.max(err)), float(tau)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny_mlp,tiny_cnn,tiny_transformer,resnet50")
    p.add_argument("--strategies", type=int, default=10)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per strategy and round (at least)")
    p.add_argument("--warmup-s", type=float, default=STRATEGY_WARMUP_S,
                   help="untimed steps run at least this long too (seconds)")
    p.add_argument("--rounds", type=int, default=3,
                   help="round-robin passes over the strategies (timed_round each), a pass of the conditions before each")
    p.add_argument("--servers", choices=("round", "run"), default="round",
                   help="time each round on fresh server processes (round: the median spans several "
                        "processes' speeds) or every round on one set started for the run (run)")
    p.add_argument("--round-s", type=float, default=ROUND_S,
                   help="each round times --steps steps at a time until at least this many seconds of steps ran")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "tfplace_fidelity"))
    p.add_argument("--reuse-profiles", action="store_true",
                   help="use the profiles a former run left in --workdir instead of measuring them again "
                        "a pass before each round (quicker; the machine's speed may have drifted since)")
    p.add_argument("--bundled-comm", action="store_true",
                   help=f"give the simulator the bundled comm fit ({BUNDLED_COMM}) instead of one measured "
                        "on the run's cluster a pass before each round")
    p.add_argument("--no-overheads", action="store_true",
                   help="simulate without the measured runtime overheads (the profile alone)")
    p.add_argument("--inter-threads", type=int, default=1,
                   help="inter-op threads per TF server task (default 1; see local_cluster_setup)")
    p.add_argument("--hetero", action="store_true",
                   help="emulated heterogeneous cluster: tasks 1, 2 at half a core each (CPU quota; needs root)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "fidelity_bench.md"))
    p.add_argument("--record", default="", help="also write the run (profiles, strategies, every timed step, "
                   "overheads) to this JSON file, for --replay")
    p.add_argument("--verbose", action="store_true", help="with --replay: each strategy's sim / real too")
    p.add_argument("--replay", nargs="+", default=None, metavar="RECORD",
                   help="re-simulate recorded runs with the current simulator (times nothing)")
    args = p.parse_args(argv)
    for name in ("strategies", "steps", "rounds", "inter_threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.round_s < 0:
        p.error(f"--round-s must be >= 0 seconds, got {args.round_s}")
    if args.replay:
        return replay(args.replay, args.verbose)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.makedirs(args.workdir, exist_ok=True)
    from tfplace.runtime.local_cluster import LocalCluster
    cluster, lc_kwargs = local_cluster_setup(args.hetero, args.inter_threads)
    results, record = {}, ({} if args.record else None)
    t0 = time.time()
    conditions = {}  # model -> (comm, overheads)
    with (LocalCluster(**lc_kwargs) if args.servers == "run" else contextlib.nullcontext()) as lc:
        for model in args.models.split(","):
            print(f"{model}:", flush=True)
            conditions[model] = bench_model(model, lc, lc_kwargs, cluster, args, results, record)
    lines = ["# Simulator fidelity on the local CPU cluster", "",
             "Command: `.venv/bin/python benchmarks/fidelity_bench.py " + " ".join(argv or sys.argv[1:]) + "`", "",
             (f"3 TF server tasks on 127.0.0.1 (clusters/local_cpu_hetero.json), 1 intra-op + "
              f"{args.inter_threads} inter-op thread(s) each; task 0 alone on core 0 (kind CPU), tasks 1 and 2 on "
              "core 1 with a 0.5 CPU quota each (kind CPU_half); the client on core 1. Profiles: "
              f"`python -m tfplace.profile --threads 1 --inter-threads 1 --repeats {profile_repeats(args.rounds)} --statistic median` "
              "per kind, pinned like "
              "its tasks, CPU_half with `--cpu-fraction 0.5` (its ops timed unlimited, times the slowdown a "
              "compute loop measures under the quota), a pass before each round, each op's median over the "
              "passes. " if args.hetero else
              f"3 TF server tasks on 127.0.0.1 (clusters/local_cpu.json), 1 intra-op + {args.inter_threads} "
              "inter-op thread(s) each, homogeneous, unpinned. Profile: "
              f"`python -m tfplace.profile --threads 1 --inter-threads 1 --repeats {profile_repeats(args.rounds)}` "
              "per model, a pass before each round, each op's median over the passes. ") +
             ("Comm fit: the bundled " + BUNDLED_COMM + ". " if args.bundled_comm else
              "Comm fit: measured on a scratch cluster with the run's settings, a pass before each round "
              "(tfplace.profiling.comm_profiler, "
              f"up to {COMM_MAX_BYTES >> 20} MiB). ") +
             f"Real = median of {args.rounds} round-robin rounds x {args.steps} timed steps, or more until {args.round_s:g} s of "
             f"steps ran (after at least {args.warmup} warm-up "
             f"steps and {args.warmup_s:g} s each), " +
             ("each round on fresh server processes" if args.servers == "round"
              else "every round on one set of servers") +
             f". ({time.time() - t0:.0f} s)", "",
             "Runtime overheads in the model (profile conditions `runtime_overheads`): " +
             ("none (--no-overheads)" if args.no_overheads else "measured by micro-benchmarks right before each "
              "round of timed steps, on that scratch cluster too (median of the --rounds passes; all of them "
              "in the --record file)"), "",
             *conditions_table(conditions), "",
             "Real = the median step (what a user sees); also against the fastest step (the undisturbed "
             "step, the statistic the profiles keep: on this shared 2-core machine identical graphs in "
             "different sessions have shown medians 3.97-5.85 ms and fastest steps 3.07-3.43 ms).", "",
             "Real's own spread = the median over strategies and rounds of |round's median step - real| / "
             "real: how far a perfect simulator would still be from one round (the noise floor of this "
             "machine for the median error).", "",
             "| model | strategies | median err | worst err | Kendall tau | real's own spread | median err "
             "(fastest) | worst err (fastest) | Kendall tau (fastest) |", "|---|---|---|---|---|---|---|---|---|"]
    for model, rows in results.items():
        if rows:
            med, worst, tau = summary(rows)
            fmed, fworst, ftau = summary(rows, 3)
            lines.append(f"| {model} | {len(rows)} | {med:.1%} | {worst:.1%} | {tau:.2f} | {round_spread(rows):.1%} | "
                         f"{fmed:.1%} | {fworst:.1%} | {ftau:.2f} |")
    lines += ["", "Task CPU = each server's CPU time per timed step, tasks 0/1/2 (/proc schedstat); CPU bound = "
              "the shortest step that CPU allows under the tasks' quotas (cpu_bound_seconds); sim lanes = the "
              "simulated busy time of each device's compute lane (SimReport.busy_s).", "",
              "| model | strategy | real ms (median) | real ms (fastest) | sim ms | sim/real | sim/fastest | "
              "task CPU ms | CPU bound ms | sim lanes ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for model, rows in results.items():
        for name, real, sim, fastest, _, cpu, busy, bound in rows:
            lines.append(f"| {model} | {name} | {real * 1e3:.2f} | {fastest * 1e3:.2f} | {sim * 1e3:.2f} | "
                         f"{sim / real:.2f} | {sim / fastest:.2f} | {ms_list(cpu)} | {bound * 1e3:.2f} | "
                         f"{ms_list(busy)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    if record is not None:
        from tfplace.formats.jsonio import write_json
        write_json(args.record, {"format": RECORD_FORMAT, "version": 1, "cluster": HETERO["cluster"] if args.hetero
                                 else "local_cpu.json", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                 "models": record})
        print(f"wrote {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
