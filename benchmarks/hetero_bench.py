"""The heterogeneous comparison: a planned strategy against Horovod, for real, on the emulated cluster.

    .venv/bin/python benchmarks/hetero_bench.py [--models tiny_mlp,tiny_transformer,resnet50_s32]
        [--batch-size 24] [--search-seconds 20] [--steps 30] [--warmup 20] [--rounds 1] [--out runs/hetero_bench]
        [--cluster clusters/local_cpu_hetero.json] [--overheads measure|FILE]

On clusters/local_cpu_hetero.json (task 0 alone on core 0; tasks 1 and 2 on core 1 at half a
core each; every TF task and every Horovod rank under that emulation), per model:
  1. profile: the model measured on the cluster's kinds as their devices are emulated
     (tfplace.cli.activate.measure_graph_profile, what activate's "profile": "measure" runs);
  2. plan: the pool of every baseline, then --search-seconds of strategy search, all scored by
     the simulator with that profile and the cluster's runtime overheads (by default measured on
     the cluster first, about a minute, into <out>/overheads.json; --overheads FILE reads a
     measured file instead); the best strategy is written as a file;
  3. run, through activate (fresh servers, the same emulation, its profile measured again): the
     planned strategy, tfplace DP-even and DP-proportional (all-reduce), Horovod even and Horovod
     proportional;
  4. print measured and simulated step times and the plan's speed-up over each Horovod run.
--cluster clusters/local_cpu_hetero_shaped.json runs the same three
tasks as three hosts behind shaped 1 GbE links (tfplace.emulation.links; needs root).
Which component found the plan (a baseline, or the search) is printed with it. A benchmark: it
reports numbers and never fails on timing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "clusters", "local_cpu_hetero.json")
MODELS = {"tiny_mlp": ("tiny_mlp", {}), "tiny_transformer": ("tiny_transformer", {}),
          "tiny_cnn": ("tiny_cnn", {}), "resnet50_s32": ("resnet50", {"image_size": 32})}
RUN_BASELINES = ("dp_even_allreduce", "dp_proportional_allreduce", "horovod_even", "horovod_proportional")


def plan(bundle: str, cluster, overheads, profile, batch: int, search_s: float, seed: int = 0):
    """(best PoolEntry that fits, best baseline PoolEntry): the pool seeded with every baseline, then strategy
    search for `search_s` seconds, scored with the overheads and `profile`."""
    from tfplace.ir.grouping import make_grouping
    from tfplace.ir.loader import load_op_graph
    from tfplace.policy import search
    from tfplace.policy.environment import PlacementTask
    from tfplace.policy.train_lib import seed_pool
    graph = load_op_graph(bundle)
    max_groups = 16
    task = PlacementTask(os.path.basename(bundle), graph, make_grouping(graph, max_groups), cluster,
                         profile, batch, max_groups, overheads=overheads)
    pool = seed_pool(task, 16)
    climber = search.HillClimber(task, pool, np.random.default_rng(seed))
    end = time.monotonic() + search_s
    while time.monotonic() < end:
        climber.step(5)
    return pool.best_fitting or pool.best, pool.best_baseline()  # the fastest that fits, as plan writes it


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny_mlp,tiny_transformer,resnet50_s32", help=f"comma-separated, of {sorted(MODELS)}")
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--search-seconds", type=float, default=20.0)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=1, help="runs of every entry on fresh servers (the median counts)")
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "hetero_bench"))
    p.add_argument("--cluster", default=CLUSTER, help="an emulated cluster file of this machine")
    p.add_argument("--overheads", default="measure", help="its runtime-overheads file (python -m tfplace.cli.overheads), "
                   "or 'measure': measured on the cluster first")
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfplace.cli import activate
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.config import MEASURE
    from tfplace.formats.strategy import save_strategy
    from tfplace.graph_defs.export import ensure_bundle
    from tfplace.overheads.model import load_overheads
    cluster = load_cluster(args.cluster)
    os.makedirs(args.out, exist_ok=True)
    overheads_path = os.path.abspath(args.overheads)
    if args.overheads == MEASURE:
        overheads_path = os.path.join(os.path.abspath(args.out), activate.OVERHEADS_FILE)
        overheads = activate.measure_cluster_overheads(cluster, args.cluster, overheads_path,
                                                       "benchmarks/hetero_bench.py", out=sys.stdout)
    else:
        overheads = load_overheads(args.overheads)
    summary = {}
    for name in args.models.split(","):
        model, opts = MODELS[name]
        bundle = ensure_bundle(model, batch_size=args.batch_size, **opts)
        profile = activate.measure_graph_profile(bundle, args.batch_size, cluster,
                                                 os.path.join(args.out, f"{name}.profile.json"), overheads)
        best, baseline = plan(bundle, cluster, overheads, profile, args.batch_size, args.search_seconds)
        print(f"{name}: plan {best.time_s * 1e3:.2f} ms simulated, found by {best.source}; best baseline "
              f"{baseline.source} {baseline.time_s * 1e3:.2f} ms", flush=True)
        path = os.path.join(args.out, f"{name}_plan.json")
        save_strategy(best.strategy, path)
        config = {"format": "tfplace.activate_config", "version": 1, "cluster": os.path.abspath(args.cluster),
                  "overheads": overheads_path,
                  "profile": "measure",
                  "strategies": [{"name": f"plan_{name}", "strategy": path, "graph": bundle}],
                  "baselines": list(RUN_BASELINES), "steps": args.steps, "warmup_steps": args.warmup, "rounds": args.rounds,
                  "output_dir": os.path.join(args.out, name), "trace": False}
        config_path = os.path.join(args.out, f"{name}_activate.json")
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=1)
        rows = {r["name"].split(".")[0]: r for r in activate.run(config_path)}
        planned = rows[f"plan_{name}"]
        line = {"plan_source": best.source, "plan_ms": planned.get("mean_s", float("nan")) * 1e3,
                "plan_simulated_ms": best.time_s * 1e3, "best_baseline": baseline.source,
                "best_baseline_simulated_ms": baseline.time_s * 1e3}
        for hv in ("horovod_even", "horovod_proportional"):
            if rows.get(hv, {}).get("mean_s") and planned.get("mean_s"):
                line[f"speedup_over_{hv}"] = rows[hv]["mean_s"] / planned["mean_s"]
        summary[name] = {**line, "rows": {k: {"mean_ms": v.get("mean_s", float("nan")) * 1e3,
                                              "simulated_ms": (v.get("simulated_s") or float("nan")) * 1e3}
                                          for k, v in rows.items()}}
        print(f"{name}: plan {line['plan_ms']:.2f} ms real ({best.source}); " + ", ".join(
            f"{k.replace('speedup_over_', '')} x{v:.2f}" for k, v in line.items() if k.startswith("speedup")),
            flush=True)
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
