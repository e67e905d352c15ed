"""How much the same step's time differs between processes: the floor under one run's fidelity.

    .venv/bin/python benchmarks/process_spread.py [--model resnet50 | --bundle PATH.json]
        [--processes 8] [--steps 20] [--cpu 0] [--allocator steady|default]

--model takes a zoo model at fidelity_bench's sizes (exported on first use); --bundle any bundle.
Each process is fresh: it pins itself to one CPU, imports the bundle's graph into a plain
`tf.compat.v1.Session` (1 intra-op and 1 inter-op thread, Grappler off, as the profiler and the
servers run), warms up as the bench does (tfplace.profiling.overheads_probe.warm_up: 3 steps and
at least WARMUP_S) at the bundle's reference batch and times --steps more. The
processes run one after another, so nothing else of ours shares the CPU. Printed: each process's
median and fastest step, and the spread of the medians (max / min). fidelity_bench's profiles
come from three profiler processes and its real steps from three server processes; a spread of
several percent here is a spread no simulator can follow from one run to the next.

Each process also counts its minor page faults per step (median). `--allocator steady` (the
default) sets malloc as the servers and the profiler do (tfplace.emulation.allocator); `--allocator default`
leaves glibc's moving thresholds, under which some processes fault on every step and run slower
(tfplace.emulation.allocator's docstring gives the counts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from tfplace.profiling.overheads_probe import pin_this_process, warm_up

import fidelity_bench as fb

ROOT = fb.ROOT
WARMUP_STEPS = 3


def time_step(bundle: str, steps: int, seed: int = 0):
    """(per-step wall seconds, per-step minor page faults) of `steps` steps of the bundle's
    training step in this process."""
    import resource

    import numpy as np
    import tensorflow as tf
    from tfplace.ir.loader import load_op_graph
    from tfplace.profiling.profiler import synthetic_feed
    from tfplace.runtime.step_runner import step_session_config
    graph = load_op_graph(bundle)
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.import_graph_def(graph.graph_def, name="")
    config = step_session_config(tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                                          inter_op_parallelism_threads=1))
    feed = synthetic_feed(graph.meta["inputs"], int(graph.reference_batch_size), np.random.default_rng(seed), bundle)
    sink = graph.names[graph.sink]
    times, faults = [], []
    with tf.compat.v1.Session(graph=g, config=config) as sess:
        sess.run(graph.meta.get("init_op") or "init")
        warm_up(lambda: sess.run(sink, feed), WARMUP_STEPS)
        for _ in range(steps):
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            sess.run(sink, feed)
            times.append(time.perf_counter() - t0)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return times, faults


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50", choices=sorted(fb.MODELS), help="zoo model at the bench's sizes")
    p.add_argument("--bundle", help="graph bundle (JSON) to time instead of --model")
    p.add_argument("--processes", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cpu", type=int, default=0, help="CPU every process is pinned to")
    p.add_argument("--allocator", choices=("steady", "default"), default="steady",
                   help="malloc as the servers run it (tfplace.emulation.allocator) or glibc's default")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.processes < 1 or args.steps < 1:
        p.error("--processes and --steps must be >= 1")
    if args.bundle is None:
        bundle = os.path.join(ROOT, fb.bundle_path(args.model))
    else:
        bundle = args.bundle if os.path.isabs(args.bundle) else os.path.join(ROOT, args.bundle)
        if not os.path.exists(bundle):
            p.error(f"--bundle {args.bundle}: no such file")
    if args.child:
        if args.allocator == "steady":
            from tfplace.emulation.allocator import steady_allocator
            steady_allocator()
        pin_this_process({args.cpu})
        times, faults = time_step(bundle, args.steps)
        print(json.dumps({"median_s": statistics.median(times), "min_s": min(times),
                          "faults_per_step": statistics.median(faults)}))
        return 0
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    medians, faults = [], []
    print(f"{os.path.relpath(bundle, ROOT)}: {args.processes} fresh processes on CPU {args.cpu}, "
          f"{args.steps} steps each after >= {WARMUP_STEPS} warm-up, {args.allocator} allocator", flush=True)
    for k in range(args.processes):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--bundle", bundle,
                              "--steps", str(args.steps), "--cpu", str(args.cpu), "--allocator", args.allocator],
                             env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(out.stderr[-2000:], file=sys.stderr)
            raise SystemExit(f"process {k} failed (exit {out.returncode})")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        medians.append(r["median_s"])
        faults.append(r["faults_per_step"])
        print(f"  process {k}: median {r['median_s'] * 1e3:9.3f} ms, fastest {r['min_s'] * 1e3:9.3f} ms, "
              f"{r['faults_per_step']:g} page faults per step", flush=True)
    print(f"medians {min(medians) * 1e3:.2f}-{max(medians) * 1e3:.2f} ms, spread (max / min) "
          f"{max(medians) / min(medians):.3f}; page faults per step {min(faults):g}-{max(faults):g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
