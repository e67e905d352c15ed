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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ideal_time_s(task) -> float:
    from tfplace.policy.features import group_seconds
    per_kind = group_seconds(task.graph, task.grouping, task.profile, task.cluster.kinds, task.batch_size).sum(axis=0)
    kinds = task.cluster.kinds
    return 1.0 / sum(1.0 / per_kind[kinds.index(d.kind)] for d in task.cluster.devices)


def main(argv):
    del argv
    import dataclasses
    import math

    from tfplace.config import GraphEntry, NetworkConfig, RLConfig, TrainConfig
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
    for model in FLAGS.models:
        bundle = train_lib.graph_bundle(GraphEntry(batch_size=_default_batch(model), model=model), bundle_for_entry)
        for cluster in FLAGS.clusters:
            path = cluster if os.path.isabs(cluster) else os.path.join(REPO, cluster)
            task = train_lib.build_task(model, bundle, _default_batch(model), path, None, config)
            learner.build(task.features.as_observation())
            if ckpt:
                import tensorflow as tf
                tf.train.Checkpoint(network=learner.network).read(ckpt).expect_partial()
            r = planner.plan_task(learner, task, FLAGS.budget_s)
            base = {k: v["time_s"] if not v["oom"] else math.inf for k, v in r.baselines.items()}
            row = {"model": model, "cluster": os.path.basename(cluster), "tfplace_s": r.best.time_s,
                   "tfplace_oom": r.best.oom, "zero_shot_s": r.zero_shot.time_s, "ideal_s": ideal_time_s(task),
                   "baselines_s": base, "planning_s": r.planning_s,
                   "speedup_vs": {k: (v / r.best.time_s if math.isfinite(v) else None) for k, v in base.items()}}
            rows.append(row)
            print(f"{model:<14}{row['cluster']:<24} tfplace {r.best.time_s * 1e3:9.3f} ms  ideal "
                  f"{row['ideal_s'] * 1e3:9.3f} ms  " + "  ".join(
                      f"{k} {('OOM' if not math.isfinite(v) else f'{v * 1e3:.3f}')}" for k, v in base.items()) +
                  f"  plan {r.planning_s:.1f} s", flush=True)
    for ref in ("dp_even_allreduce", "dp_proportional_allreduce"):
        vals = [r["speedup_vs"].get(ref) for r in rows if r["speedup_vs"].get(ref)]
        if vals:
            print(f"geomean speed-up over {ref}: {math.exp(sum(math.log(v) for v in vals) / len(vals)):.3f}")
    if FLAGS.out:
        with open(FLAGS.out, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1, default=lambda x: None)
    return 0


def _default_batch(model: str) -> int:
    return 16 if model.startswith(("bert", "xlnet", "tiny")) else (32 if model == "transformer" else 64)


if __name__ == "__main__":
    sys.exit(app.run(main))
