"""Simulated vs measured peak memory per device of rewritten steps on the local CPU cluster.

    python benchmarks/memory_bench.py
    python benchmarks/memory_bench.py --models resnet50:b16:s32:momentum --strategies dp_even_ps --steps 5

For each zoo model and each baseline strategy (tfplace.baselines.registry, made as activate makes
them) on the cluster file, the step is rewritten, run on a LocalCluster of the file's tasks and
measured: the median over --steps FULL_TRACE steps of each device's peak live bytes, reconstructed
from the trace's allocation records (tfplace.profiling.live_memory says what it counts and what
it cannot). The same PlacedGraph is simulated (no stragglers). One row per device:

  sim MB     SimReport.peak_memory_bytes (static variables + buffers and scratch)
  real MB    the measured peak live bytes (variables + fed batch + the step's live tensors)
  ratio      sim / real: above 1 the simulator over-counts, below 1 it under-counts

A model is `name[:tag...]` with the zoo's bundle-stem tags: b<batch>, s<image size>, t<sequence
length>, n<layers>, and the optimizer (sgd, momentum, adam); e.g. `resnet50:b16:s32:momentum`.
Bundles are exported into a temporary folder, removed at the end with everything the run wrote.
Progress goes to stderr, the table to stdout. Benchmarks report numbers; they never fail on them.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODELS = ("resnet50:b16:s32:momentum", "tiny_transformer:b16:adam")
DEFAULT_STRATEGIES = ("single", "dp_even_allreduce", "dp_even_ps", "model_parallel_contiguous")
MAX_GROUPS = 64  # the grouping level activate makes its baselines at (cli.activate.BASELINE_MAX_GROUPS)
_TAGS = {"b": "batch_size", "s": "image_size", "t": "seq_len", "n": "num_layers"}
_OPTIMIZERS = ("sgd", "momentum", "adam")


def parse_model(text: str):
    """'resnet50:b16:s32:momentum' -> ('resnet50', {batch_size: 16, image_size: 32, optimizer: 'momentum'})."""
    name, *tags = text.split(":")
    opts = {}
    for tag in tags:
        if tag in _OPTIMIZERS:
            opts["optimizer"] = tag
        elif tag[:1] in _TAGS and tag[1:].isdigit():
            opts[_TAGS[tag[0]]] = int(tag[1:])
        else:
            raise ValueError(f"model {text!r}: unknown tag {tag!r}; use b<batch>, s<image size>, t<sequence length>, "
                             f"n<layers> or an optimizer ({', '.join(_OPTIMIZERS)})")
    return name, opts


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure_case(graph, cluster, profile, name: str, steps: int, lc):
    """(device names, simulated peak bytes, LiveBytesMeasurement) of baseline `name` on `graph`."""
    from tfplace.baselines import registry
    from tfplace.baselines.problem import make_problem
    from tfplace.profiling.live_memory import measure_peak_live_bytes
    from tfplace.rewrite.graph_rewrite import rewrite_step
    from tfplace.runtime.step_runner import StepRunner, random_feed
    from tfplace.simulator import SimOptions, simulate
    problem = make_problem(graph, cluster, profile, max_groups=MAX_GROUPS, global_batch_size=graph.reference_batch_size)
    strategy = registry.generate(name, problem)
    step = rewrite_step(graph, strategy, cluster, profile=profile, grouping=problem.grouping)
    simulated = simulate(step.placed, cluster, SimOptions(stragglers="off")).peak_memory_bytes
    feed = random_feed(step.inputs, strategy.global_batch_size, seed=0)
    with StepRunner(lc, step) as runner:
        runner.initialize()
        measured = measure_peak_live_bytes(runner, step.graph_def, cluster, feed, traced_steps=steps)
    return simulated, measured


def run(models, strategies, cluster_path: str, steps: int):
    from tfplace.formats.cluster import load_cluster
    from tfplace.graph_defs.export import ensure_bundle
    from tfplace.ir.loader import load_op_graph
    from tfplace.profiling.device_model import cluster_profile
    from tfplace.runtime.local_cluster import LocalCluster
    from tfplace.runtime.tmpdir import private_tmpdir
    cluster = load_cluster(cluster_path)
    print(f"{cluster.name}: median peak over {steps} traced steps; MB = 1e6 bytes")
    print(f"{'model':<34} {'strategy':<27} {'device':<7} {'sim MB':>9} {'real MB':>9} {'ratio':>6}")
    with private_tmpdir() as tmp, tempfile.TemporaryDirectory(dir=tmp) as exports:
        out_dir = os.path.join(exports, "bundles")  # removed with the run, whether or not tmp could be made
        with LocalCluster.for_cluster(cluster) as lc:
            for text, (model, opts) in models:
                t0 = time.perf_counter()
                graph = load_op_graph(ensure_bundle(model, out_dir=out_dir, **opts))
                profile = cluster_profile(graph, cluster)
                log(f"{text}: exported and loaded in {time.perf_counter() - t0:.0f} s")
                for name in strategies:
                    t0 = time.perf_counter()
                    simulated, measured = measure_case(graph, cluster, profile, name, steps, lc)
                    log(f"{text} {name}: {time.perf_counter() - t0:.0f} s")
                    for device, sim, real in zip(measured.device_names, simulated, measured.peak_bytes):
                        ratio = f"{sim / real:>6.2f}" if real > 0 else f"{'-':>6}"
                        print(f"{text:<34} {name:<27} {device:<7} {sim / 1e6:>9.2f} {real / 1e6:>9.2f} {ratio}",
                              flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                        help="zoo models as name[:tag...], e.g. resnet50:b16:s32:momentum")
    parser.add_argument("--strategies", nargs="+", default=list(DEFAULT_STRATEGIES),
                        help="baseline names of tfplace.baselines.registry")
    parser.add_argument("--cluster", default=os.path.join(REPO, "clusters", "local_cpu.json"),
                        help="a cluster file whose hosts are all loopback")
    parser.add_argument("--steps", type=int, default=3, help="traced steps per case (the median is shown)")
    args = parser.parse_args(argv)
    from tfplace.baselines import registry
    from tfplace.graph_defs.export import resolve_options
    try:
        models = [(text, parse_model(text)) for text in args.models]
        for _, (model, opts) in models:
            resolve_options(model, **opts)
    except ValueError as err:  # an unknown model, tag or size
        parser.error(str(err))
    unknown = [s for s in args.strategies if s not in registry.GENERATORS]
    if unknown:
        parser.error(f"unknown strategy {unknown[0]!r}; use one of {list(registry.GENERATORS)}")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if not os.path.isfile(args.cluster):
        parser.error(f"--cluster {args.cluster!r} is not a file")
    run(models, args.strategies, args.cluster, args.steps)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
