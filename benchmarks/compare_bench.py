"""Horovod data parallelism on this machine: even vs proportional per-rank batches, with
heterogeneity emulated by per-rank thread limits. A benchmark: it reports numbers and never
fails on timing.

    python benchmarks/compare_bench.py --model tiny_cnn --batch-size 48 --threads 2,1 --steps 20

Proportional batches use the intra-op thread counts as the ranks' relative speeds (the same
emulation knob tfplace.runtime.local_cluster uses). Prints mean ± std per step for both baselines and
writes them as JSON with --json.
"""

import argparse
import json
import sys

from tfplace.baselines import registry


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny_cnn", help="zoo model (exported on demand)")
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--threads", default="2,1", help="intra-op threads per rank (inter-op: 1)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    from tfplace.graph_defs.export import ensure_bundle
    bundle = ensure_bundle(args.model, batch_size=args.batch_size)
    threads = [int(x) for x in args.threads.split(",")]
    per_rank = [(t, 1) for t in threads]
    rows = []
    for name in registry.RUNTIME_BASELINES:
        res = registry.run_runtime_baseline(name, bundle, args.batch_size, len(threads), weights=threads,
                                            steps=args.steps, warmup_steps=args.warmup_steps,
                                            threads_per_rank=per_rank)
        rows.append({"baseline": name, "batch_per_rank": list(res.batch_per_rank), "threads": threads,
                     "mean_s": res.mean_s, "std_s": res.std_s, "step_times_s": list(res.step_times_s)})
        print(f"{name:<22} batches {list(res.batch_per_rank)!s:<12} threads {threads}  "
              f"{res.mean_s * 1e3:8.2f} ± {res.std_s * 1e3:6.2f} ms/step", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"model": args.model, "batch_size": args.batch_size, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
