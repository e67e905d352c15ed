"""Speed of one strategy evaluation (lower + simulate) on the zoo's CNN training graphs.

    python benchmarks/simulator_bench.py                       # VGG-19, ResNet-50, Inception-V3
    python benchmarks/simulator_bench.py --models resnet50 --reps 21

For each model (tf.keras.applications, batch 64, SGD; 224x224, Inception-V3 299x299) and each
cluster (clusters/two_kind_4gpu.json: 4 GPUs, clusters/heterog_testbed.json: 8 GPUs) it times
three strategies: everything on the first device ("single"), even data parallelism with ring
all-reduce ("dp-even"), and random per-group decisions ("random": random device subsets, random
shares, some micro-batches, all-reduce or PS). Columns (medians over --reps runs, milliseconds):

  tasks        tasks in the PlacedGraph
  step         the simulated iteration time of that strategy (the fixed one of the row)
  cold         lower() from nothing (graph analysis + cost tables + lowering) + simulate
  lower        lowering of a new strategy on a Lowerer that keeps only the graph analysis
  sim          simulate() alone (compiled event loop)
  full         lower + sim: one full evaluation as a search performs it
  incr         one group's decision changed, re-lowered incrementally + simulated
  evals/s      1000 / full
`--clock cpu` times this process's CPU time instead of wall time (steadier when the machine is
shared; the code is single-threaded, so the two agree on an idle machine).

The Rust simulator of the original tool needs about 30 ms (VGG-19), 410 ms (ResNet-50) and
610 ms (Inception-V3) to rewrite and simulate one 4-device data-parallel strategy on a 2-core
machine; `x` is that figure divided by our cold time for dp-even on 4 devices.

Costs: `tfplace.profiling.device_model.default_profile` (the model's bundled measured profile derived to
the cluster's GPU kinds, else the roofline device model). The speed of an evaluation barely
depends on the costs; the `step` column is the simulated iteration time, for orientation.
Benchmarks report numbers; they never fail on timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from tfplace.formats.cluster import load_cluster
from tfplace.graph_defs.export import ensure_bundle
from tfplace.ir.loader import load_op_graph
from tfplace.ir.grouping import make_grouping
from tfplace.lowering.lower import Lowerer, lower
from tfplace.profiling.device_model import default_profile
from tfplace.simulator import simulate
from tfplace.formats.strategy import Strategy, decision

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUST_DP4_MS = {"vgg19": 30.0, "resnet50": 410.0, "inception_v3": 610.0}
CLUSTERS = ("two_kind_4gpu", "heterog_testbed")
BATCH = 64


def random_decision(rng, names, batch=BATCH):
    k = int(rng.integers(1, len(names) + 1))
    devs = rng.choice(len(names), size=k, replace=False)
    cuts = np.sort(rng.choice(np.arange(1, batch), size=k - 1, replace=False)) if k > 1 else np.zeros(0, int)
    shares = {}
    for d, s in zip(devs.tolist(), np.diff(np.concatenate([[0], cuts, [batch]])).tolist()):
        shares[names[d]] = [s // 2, s - s // 2] if (s >= 2 and rng.random() < 0.2) else int(s)
    ps = rng.random() < 0.3
    return decision(shares, "ps" if ps else "allreduce", names[int(devs[0])] if ps else None)


def strategies(names, group_names, rng):
    even = {n: BATCH // len(names) + (i < BATCH % len(names)) for i, n in enumerate(names)}
    yield "single", lambda: Strategy(BATCH, len(group_names), decision({names[0]: BATCH}), {})
    yield "dp-even", lambda: Strategy(BATCH, len(group_names), decision(even), {})
    yield "random", lambda: Strategy(BATCH, len(group_names), None,
                                     {g: random_decision(rng, names) for g in group_names})


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = time.perf_counter


def median_ms(fn, reps):
    times = []
    for _ in range(reps):
        t0 = _clock()
        fn()
        times.append(_clock() - t0)
    return 1e3 * statistics.median(times)


def bench_case(graph, grouping, cluster, profile, make_strategy, rng, reps):
    """Medians (ms) of cold, lower, sim, full and incr for one strategy family."""
    lowerer = Lowerer(graph, grouping, cluster, profile)
    fixed = make_strategy()
    placed = lowerer.lower(fixed)
    step = simulate(placed, cluster).iteration_time_s  # also compiles / loads the event loop
    cold = median_ms(lambda: simulate(lower(graph, grouping, cluster, fixed, profile), cluster), max(3, reps // 3))
    fresh = [make_strategy() for _ in range(reps)]
    it = iter(fresh)

    def full_lower():
        lowerer.reset()
        return lowerer.lower(next(it))
    low = median_ms(full_lower, reps)
    sim = median_ms(lambda: simulate(placed, cluster), reps)
    it = iter(fresh)
    full = median_ms(lambda: simulate(full_lower(), cluster), reps)
    lowerer.lower(fixed)
    names = cluster.device_names
    groups = grouping.group_names
    changes = []
    for _ in range(reps):
        g = groups[int(rng.integers(len(groups)))]
        changes.append(Strategy(BATCH, fixed.max_groups, fixed.default, {**fixed.groups, g: random_decision(rng, names)}))
    ch = iter(changes)
    incr = median_ms(lambda: simulate(lowerer.lower(next(ch)), cluster), reps)
    return {"tasks": placed.num_tasks, "step": 1e3 * step, "cold": cold, "lower": low, "sim": sim, "full": full,
            "incr": incr}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["vgg19", "resnet50", "inception_v3"])
    parser.add_argument("--reps", type=int, default=15, help="timed runs per cell (median)")
    parser.add_argument("--max-groups", type=int, default=2000, help="grouping level K (HeteroG used 2000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clock", choices=sorted(CLOCK), default="wall",
                        help="wall time (default) or this process's CPU time (steadier on a shared machine)")
    args = parser.parse_args(argv)
    global _clock
    _clock = CLOCK[args.clock]
    rng = np.random.default_rng(args.seed)
    clusters = [load_cluster(os.path.join(REPO, "clusters", f"{c}.json")) for c in CLUSTERS]
    header = (f"{'model':<13}{'ops':>6}{'groups':>7}{'dev':>4} {'strategy':<9}{'tasks':>7}{'step':>8}{'cold':>8}{'lower':>8}"
              f"{'sim':>8}{'full':>8}{'incr':>8}{'evals/s':>9}{'Rust':>7}{'x':>6}")
    print(f"device-model costs; {args.clock} times in ms, medians of {args.reps} runs; "
          f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(header)
    for model in args.models:
        graph = load_op_graph(ensure_bundle(model, batch_size=BATCH, optimizer="sgd"))
        grouping = make_grouping(graph, args.max_groups)
        for cluster in clusters:
            profile = default_profile(graph, cluster.kinds)
            for label, make in strategies(cluster.device_names, grouping.group_names, rng):
                r = bench_case(graph, grouping, cluster, profile, make, rng, args.reps)
                rust = RUST_DP4_MS.get(model) if (label == "dp-even" and cluster.num_devices == 4) else None
                ref = f"{rust:>7.0f}{rust / r['cold']:>5.1f}x" if rust else ""
                print(f"{model:<13}{graph.num_ops:>6}{grouping.num_groups:>7}{cluster.num_devices:>4} {label:<9}"
                      f"{r['tasks']:>7}{r['step']:>8.1f}{r['cold']:>8.1f}{r['lower']:>8.1f}{r['sim']:>8.1f}{r['full']:>8.1f}"
                      f"{r['incr']:>8.1f}{1e3 / r['full']:>9.0f}{ref}", flush=True)


if __name__ == "__main__":
    main()
