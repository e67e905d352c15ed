"""Planner benchmark: tfplace's strategy within a fixed search budget vs every baseline and the
ideal bound, per zoo model and cluster (simulated iteration times).

    python benchmarks/planner_bench.py [--checkpoint RUN_DIR] [--budget_s 60] \
        [--models vgg19,resnet50,...] [--clusters clusters/heterog_testbed.json,clusters/two_kind_4gpu.json] \
        [--max_groups 64] [--out bench.json]

Without --checkpoint the policy is freshly initialised (the search then does the work). The ideal
bound is compute only, split perfectly in proportion to speed: 1 / sum_d(1 / T_kind(d)), with
T_k the whole step's compute on one device of kind k, and no communication. Benchmarks report
numbers; they do not fail on them.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint", None, "training output_dir with the policy (default: untrained policy)")
flags.DEFINE_float("budget_s", 60.0, "search seconds per (model, cluster)")
flags.DEFINE_list("models", ["vgg19", "resnet50", "inception_v3", "mobilenet_v2", "transformer", "bert_base",
                             "bert_large"], "zoo models")
flags.DEFINE_list("clusters", ["clusters/heterog_testbed.json", "clusters/two_kind_4gpu.json"], "cluster files")
flags.DEFINE_integer("max_groups", 64, "groups the policy sees")
flags.DEFINE_string("out", None, "write the rows as JSON here")
flags.DEFINE_list("cases", [], "extra cases model[:b=BATCH][:n=LAYERS][:t=SEQ][:o=OPT] (e.g. feasibility rows), "
                  "planned on every cluster after --models")
flags.DEFINE_integer("seed", 0, "search seed")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ideal_time_s(task) -> float:
    """tfplace.baselines.bounds.ideal_compute_s over the task's graph, grouping and profile."""
    from tfplace.baselines.bounds import ideal_compute_s
    from tfplace.baselines.problem import make_problem
    problem = make_problem(task.graph, task.cluster, task.profile, max_groups=task.max_groups,
                           global_batch_size=task.batch_size, grouping=task.grouping)
    return ideal_compute_s(problem)


def parse_case(spec: str):
    """"model[:b=BATCH][:n=LAYERS][:t=SEQ][:o=OPTIMIZER]" -> GraphEntry."""
    from tfplace.formats.config import GraphEntry
    parts = spec.split(":")
    kw = {"b": None, "n": None, "t": None, "o": None}
    for p in parts[1:]:
        k, v = p.split("=")
        kw[k] = v
    model = parts[0]
    return GraphEntry(batch_size=int(kw["b"]) if kw["b"] else _default_batch(model), model=model,
                      num_layers=int(kw["n"]) if kw["n"] else None, seq_len=int(kw["t"]) if kw["t"] else None,
                      optimizer=kw["o"])


def main(argv):
    del argv
    import dataclasses
    import math

    from tfplace.formats.config import GraphEntry, NetworkConfig, RLConfig, TrainConfig
    from tfplace.graph_defs.export import bundle_for_entry
    from tfplace.policy import actions as A
    from tfplace.policy import planner, train_lib
    from tfplace.policy.agent import ReinforceLearner
    from tfplace.policy.network import PlacementNetwork

    if FLAGS.checkpoint:
        learner, config, ckpt = planner.load_policy(FLAGS.checkpoint)
    else:
        config = TrainConfig(graphs=(GraphEntry(1, model="x"),), clusters=("",), profiles=(None,), output_dir="")
        learner, ckpt = ReinforceLearner(PlacementNetwork(NetworkConfig(), A.ActionLayout()), RLConfig()), None
    config = dataclasses.replace(config, max_groups=FLAGS.max_groups)
    rows = []
    entries = [GraphEntry(batch_size=_default_batch(m), model=m) for m in FLAGS.models] + \
        [parse_case(c) for c in FLAGS.cases]
    for entry in entries:
        bundle = train_lib.graph_bundle(entry, bundle_for_entry)
        for cluster in FLAGS.clusters:
            path = cluster if os.path.isabs(cluster) else os.path.join(REPO, cluster)
            task = train_lib.build_task(entry.label, bundle, entry.batch_size, path, None, config)
            learner.build(task.features.as_observation())
            if ckpt:
                import tensorflow as tf
                tf.train.Checkpoint(network=learner.network).read(ckpt).expect_partial()
            r = planner.plan_task(learner, task, FLAGS.budget_s, seed=FLAGS.seed)
            base = {k: v["time_s"] if not v["oom"] else math.inf for k, v in r.baselines.items()}
            best_s = r.best.time_s if not r.best.oom else math.inf
            feasible_base = {k: v for k, v in base.items() if math.isfinite(v)}
            bb = min(feasible_base, key=feasible_base.get) if feasible_base else None
            dp_all_oom = all(not math.isfinite(v) for k, v in base.items() if k.startswith("dp_"))
            row = {"case": entry.label, "cluster": os.path.splitext(os.path.basename(cluster))[0],
                   "tfplace_s": r.best.time_s, "tfplace_oom": r.best.oom, "tfplace_source": r.best.source,
                   "zero_shot_s": r.zero_shot.time_s, "zero_shot_oom": r.zero_shot.oom,
                   "ideal_s": ideal_time_s(task), "baselines_s": base, "best_baseline": bb,
                   "best_baseline_s": feasible_base.get(bb, math.inf), "dp_all_oom": dp_all_oom,
                   "planning_s": r.planning_s, "evaluations": task.num_simulations,
                   "speedup_vs": {k: (v / best_s if math.isfinite(v) and math.isfinite(best_s) else None)
                                  for k, v in base.items()}}
            rows.append(row)
            print(f"done {row['case']} {row['cluster']}: tfplace {_ms(best_s)} ms ({r.best.source}), best baseline "
                  f"{bb} {_ms(row['best_baseline_s'])} ms, {task.num_simulations} simulations, "
                  f"{r.planning_s:.0f} s", flush=True)
    print_tables(rows)
    if FLAGS.out:
        with open(FLAGS.out, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1, default=lambda x: None)
    return 0


def _default_batch(model: str) -> int:
    return 16 if model.startswith(("bert", "xlnet", "tiny")) else (32 if model == "transformer" else 64)


def _ms(t: float) -> str:
    import math
    return "OOM" if t is None or not math.isfinite(t) else f"{t * 1e3:.1f}"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def print_tables(rows) -> None:
    import math
    print("\nTable 1: simulated iteration time (ms), tfplace within the budget vs baselines and the ideal bound")
    hdr = f"{'case':<22}{'cluster':<17}{'tfplace':>9}{'ideal':>9}{'DP-even':>9}{'DP-prop':>9}" \
          f"{'best baseline':>28}{'x even':>8}{'x prop':>8}{'x best':>8}{'plan s':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        best = r["tfplace_s"] if not r["tfplace_oom"] else math.inf
        xb = r["best_baseline_s"] / best if math.isfinite(best) and math.isfinite(r["best_baseline_s"]) else None
        bb = f"{r['best_baseline']} {_ms(r['best_baseline_s'])}" if r["best_baseline"] else "all OOM"
        print(f"{r['case']:<22}{r['cluster']:<17}{_ms(best):>9}{_ms(r['ideal_s']):>9}"
              f"{_ms(r['baselines_s'].get('dp_even_allreduce')):>9}{_ms(r['baselines_s'].get('dp_proportional_allreduce')):>9}"
              f"{bb:>28}{_x(r['speedup_vs'].get('dp_even_allreduce')):>8}"
              f"{_x(r['speedup_vs'].get('dp_proportional_allreduce')):>8}{_x(xb):>8}{r['planning_s']:>8.0f}")
    for ref in ("dp_even_allreduce", "dp_proportional_allreduce"):
        vals = [r["speedup_vs"].get(ref) for r in rows if r["speedup_vs"].get(ref)]
        if vals:
            print(f"geomean speed-up over {ref}: {math.exp(sum(math.log(v) for v in vals) / len(vals)):.3f} "
                  f"over {len(vals)} of {len(rows)} rows (rows where it is OOM are left out)")
    worse = [f"{r['case']}/{r['cluster']}" for r in rows
             if math.isfinite(r["best_baseline_s"]) and r["tfplace_s"] > r["best_baseline_s"] * (1 + 1e-9)]
    print(f"rows worse than the best baseline: {len(worse)} {worse}")
    oom = [r for r in rows if r["dp_all_oom"]]
    if oom:
        print("rows where every data-parallel baseline is OOM: " + ", ".join(
            f"{r['case']}/{r['cluster']} -> tfplace {'feasible' if not r['tfplace_oom'] else 'OOM'}" for r in oom))
    names = sorted({k for r in rows for k in r["baselines_s"]})
    print("\nTable 2: every baseline (ms; OOM = out of memory)")
    print(f"{'case':<22}{'cluster':<17}" + "".join(f"{n[:14]:>15}" for n in names))
    for r in rows:
        print(f"{r['case']:<22}{r['cluster']:<17}" + "".join(f"{_ms(r['baselines_s'].get(n)):>15}" for n in names))


if __name__ == "__main__":
    sys.exit(app.run(main))
