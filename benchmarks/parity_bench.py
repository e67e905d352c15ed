"""Runtime parity: tfplace's rewritten data-parallel step against Horovod on the same local cluster.

    .venv/bin/python benchmarks/parity_bench.py [--models resnet50_s32,tiny_transformer,resnet50_s224]
        [--batch-size 24] [--cluster clusters/local_cpu.json] [--rounds 3] [--steps 8] [--warmup 3]
        [--bucket-bytes 67108864] [--all-reduce exchange,collective] [--ps-bucket-bytes 1,67108864]
        [--json out.json]

Per model and round, on fresh processes each time: tfplace DP-even all-reduce (the rewrite of
`even_strategy`, one run per --bucket-bytes value and --all-reduce implementation; bucket 1 = one
all-reduce per gradient; "exchange" = shards over Send/Recv, "collective" = CollectiveReduceV2), and
tfplace DP-even with the first device as parameter server per --ps-bucket-bytes value (bucket 1 =
one message per gradient and worker), each on a LocalCluster started from the cluster file (its emulation applied), then Horovod DP-even with the
same per-rank batches under the same emulation. Rounds alternate the runs so a slow phase of the
machine hits both alike. Prints each round's medians and, per model, the median over every timed
step and tfplace / Horovod. A benchmark: it reports numbers and never fails on timing. Bad
arguments (an unknown model, a count below its least value, a cluster file that does not load or
whose hosts are not this machine's loopback) are one line `error: ...` naming the argument or the
file's field and the fix, exit status 2, before any export or server (tfplace.cli.common.guarded).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from tfplace.formats.strategy import DEFAULT_BUCKET_BYTES_CPU  # noqa: E402
MODELS = {  # name -> (zoo model, export options)
    "resnet50_s32": ("resnet50", {"image_size": 32}),
    "resnet50_s224": ("resnet50", {"image_size": 224}),
    "tiny_transformer": ("tiny_transformer", {}),
    "tiny_cnn": ("tiny_cnn", {}),
    "tiny_mlp": ("tiny_mlp", {}),
}


def tfplace_steps(bundle: str, cluster, batch: int, bucket_bytes: int, steps: int, warmup: int,
                  all_reduce: str = "exchange", sync: str = "allreduce"):
    """Timed steps (seconds) of the rewritten DP-even step, on fresh servers (`all_reduce`: the
    rewrite's cpu_all_reduce; `sync` "ps": the first device is the parameter server)."""
    from tfplace.formats.strategy import even_strategy
    from tfplace.ir.loader import load_op_graph
    from tfplace.rewrite.graph_rewrite import rewrite_step
    from tfplace.runtime.local_cluster import LocalCluster
    from tfplace.runtime.step_runner import StepRunner, random_feed
    graph = load_op_graph(bundle)
    devices = list(cluster.device_names)
    strategy = dataclasses.replace(even_strategy(devices, batch, 64, sync, devices[0] if sync == "ps" else None),
                                   bucket_bytes=bucket_bytes)
    step = rewrite_step(graph, strategy, cluster, cpu_all_reduce=all_reduce)
    with LocalCluster.for_cluster(cluster) as lc, StepRunner(lc, step, timeout_s=600) as runner:
        runner.initialize()
        times, _ = runner.timed(steps, warmup, random_feed(step.inputs, batch, 0))
    return list(times)


def horovod_steps(bundle: str, cluster, batch: int, steps: int, warmup: int, source: str):
    """Timed steps (seconds) of rank 0 of Horovod DP-even, each rank under its device's emulation."""
    from tfplace.baselines.horovod_runner import even_batches, run_horovod
    emulation = [d.emulation for d in cluster.devices]
    res = run_horovod(bundle, even_batches(batch, cluster.num_devices), steps=steps, warmup_steps=warmup,
                      emulation_per_rank=emulation if any(emulation) else None, source=source)
    return list(res.report.step_times_s)


def _counts(text: str, flag: str):
    """'1,67108864' -> [1, 67108864]; raises InputError naming `flag` for a value that is not an integer >= 1."""
    from tfplace.formats.errors import InputError
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        values = None
    if values is None or any(v < 1 for v in values):
        raise InputError("arguments", flag, f"must be integers >= 1, comma-separated, got {text!r}",
                         "give bucket sizes in bytes, e.g. 1,67108864")
    return values


def check_args(args):
    """The cluster of the parsed `args`, loaded once every argument is checked; raises InputError
    naming the argument (or the cluster file's field) before any export or server starts."""
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.errors import InputError
    from tfplace.ir.node_defs import CPU_ALL_REDUCE  # the rewrite's CPU all-reduce implementations
    from tfplace.runtime.local_cluster import require_loopback
    for name in args.models.split(","):
        if name not in MODELS:
            raise InputError("arguments", "--models", f"{name!r} is not one of {sorted(MODELS)}",
                             "give comma-separated names from that list")
    for flag, least in (("batch_size", 1), ("rounds", 1), ("steps", 1), ("warmup", 0)):
        if getattr(args, flag) < least:
            raise InputError("arguments", "--" + flag.replace("_", "-"), f"must be >= {least}, "
                             f"got {getattr(args, flag)}", f"give an integer >= {least}")
    _counts(args.bucket_bytes, "--bucket-bytes")
    _counts(args.ps_bucket_bytes, "--ps-bucket-bytes")
    for how in args.all_reduce.split(","):
        if how not in CPU_ALL_REDUCE:
            raise InputError("arguments", "--all-reduce", f"{how!r} is not one of {list(CPU_ALL_REDUCE)}",
                             "give comma-separated names from that list")
    cluster = load_cluster(args.cluster)
    require_loopback(cluster, args.cluster)  # its servers start here: never a cluster of other hosts
    return cluster


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet50_s32,tiny_transformer", help=f"comma-separated, of {sorted(MODELS)}")
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--cluster", default=os.path.join(ROOT, "clusters", "local_cpu.json"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--bucket-bytes", default=str(DEFAULT_BUCKET_BYTES_CPU), help="tfplace runs, one per bucket size")
    p.add_argument("--all-reduce", default="exchange,collective", help="tfplace runs, one per CPU all-reduce implementation")
    p.add_argument("--ps-bucket-bytes", default="",
                   help="also tfplace DP-even with the first device as parameter server, one run per bucket size "
                        "(1: one message per gradient)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfplace.cli.common import guarded
    return guarded(lambda _: run(args))([])


def run(args) -> int:
    """The benchmark of the parsed `args` (main's)."""
    from tfplace.graph_defs.export import ensure_bundle
    cluster = check_args(args)
    buckets = _counts(args.bucket_bytes, "--bucket-bytes")
    ps_buckets = _counts(args.ps_bucket_bytes, "--ps-bucket-bytes")
    out = {"cluster": os.path.relpath(args.cluster, ROOT), "batch_size": args.batch_size, "models": {}}
    for name in args.models.split(","):
        model, opts = MODELS[name]
        bundle = ensure_bundle(model, batch_size=args.batch_size, **opts)
        hows = args.all_reduce.split(",")
        runs = {f"tfplace_{how}_bucket_{b}": [] for how in hows for b in buckets}
        runs.update({f"tfplace_ps_bucket_{b}": [] for b in ps_buckets})
        runs["horovod_even"] = []
        t0 = time.time()
        for r in range(args.rounds):
            for how in hows:
                for b in buckets:
                    runs[f"tfplace_{how}_bucket_{b}"] += tfplace_steps(bundle, cluster, args.batch_size, b, args.steps,
                                                                       args.warmup, how)
            for b in ps_buckets:
                runs[f"tfplace_ps_bucket_{b}"] += tfplace_steps(bundle, cluster, args.batch_size, b, args.steps,
                                                                args.warmup, sync="ps")
            runs["horovod_even"] += horovod_steps(bundle, cluster, args.batch_size, args.steps, args.warmup,
                                                  args.cluster)
            print(f"{name} round {r}: " + ", ".join(f"{k} {statistics.median(v[-args.steps:]) * 1e3:.1f} ms"
                                                    for k, v in runs.items()), flush=True)
        med = {k: statistics.median(v) for k, v in runs.items()}
        hv = med["horovod_even"]
        print(f"{name} (batch {args.batch_size}, {len(runs['horovod_even'])} steps each, {time.time() - t0:.0f} s): "
              + "; ".join(f"{k} {v * 1e3:.1f} ms ({v / hv:.2f}x Horovod)" for k, v in med.items()), flush=True)
        out["models"][name] = {"median_s": med, "steps_s": runs}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
