"""One strategy for a graph and cluster from a trained policy, zero-shot, optionally improved by
search: `python -m tfplace.plan --graph bundle.json|step.pb|--model NAME --batch_size B
--cluster cluster.json [--profile profile.json] [--search_seconds N] --out strategy.json`.
Every flag (numbers, the zoo model name, input files and --out) is checked before anything loads.

The policy: the pre-trained one shipped with tfplace (policy/pretrained/policy.json), unless
--checkpoint RUN_DIR (the output_dir of `python -m tfplace.train`: its config.json gives the
network sizes and max_groups, its state.json the checkpoint) or --policy FILE (a weights file of
`python -m tfplace.pretrain`) names another. The result is the best of: the policy's greedy
strategy, `--samples` policy samples, every baseline, and (with --search_seconds) the
policy-guided search (tfplace.policy.planner.plan_task); it is never worse than the best baseline.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from tfplace.cli import common  # noqa: E402
from tfplace.formats.errors import InputError  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags (called when it runs; see tfplace.cli.common)."""
    flags.DEFINE_string("checkpoint", None, "output_dir of a training run (default: the shipped policy)")
    flags.DEFINE_string("policy", None, "policy weights file of python -m tfplace.pretrain (default: the shipped one)")
    flags.DEFINE_string("graph", None, "graph bundle .json or a training step .pb/.pbtxt/.meta (or use --model)")
    common.define_step_flags()
    flags.DEFINE_string("model", None, "zoo model name (exported on demand)")
    flags.DEFINE_integer("batch_size", None, "global batch size (default: the bundle's)", lower_bound=1)
    flags.DEFINE_string("cluster", None, "cluster .json", required=True)
    flags.DEFINE_string("profile", None, "profile .json (default: derived by the device model)")
    flags.DEFINE_float("search_seconds", 0.0, "seconds of sampling + local search after the zero-shot plan",
                       lower_bound=0.0)
    flags.DEFINE_integer("samples", 8, "policy samples evaluated zero-shot", lower_bound=0)
    flags.DEFINE_integer("seed", 0, "sampling / search seed", lower_bound=0)
    flags.DEFINE_string("out", "strategy.json", "where to write the strategy")
    common.define_overheads_flag()
    flags.mark_flags_as_mutual_exclusive(["graph", "model"], required=True)
    flags.mark_flags_as_mutual_exclusive(["checkpoint", "policy"])
    common.output_file_flag("out")
    common.flag_check("checkpoint", check_run_dir)
    common.graph_flag("graph", zoo=False)
    common.zoo_model_flag("model")
    for name in ("cluster", "profile", "overheads", "policy"):
        common.input_file_flag(name)


def check_run_dir(path: str) -> None:
    """Raises InputError unless `path` is a training run's output_dir: a folder holding the
    regular files config.json and state.json (tfplace.policy.planner.load_policy reads them)."""
    from tfplace.formats.files import input_problem
    fix = "give the output_dir of a training run (python -m tfplace.train)"
    if not os.path.isdir(path):
        raise InputError(path, "", "not found" if not os.path.lexists(path) else "is not a folder", fix)
    for name in ("config.json", "state.json"):
        problem = input_problem(os.path.join(path, name))
        if problem:
            raise InputError(path, name, f"{name} {problem[0]}", fix)


def main(argv) -> int:
    """Plans as the parsed flags say (absl main: argv holds the program name only); bad input
    (InputError) becomes one line and exit status 2 in tfplace.cli.common."""
    del argv
    from tfplace.graph_defs.export import bundle_for_entry
    from tfplace.policy import planner
    graph = FLAGS.graph and common.resolve_graph(FLAGS.graph, "argument --graph", FLAGS.batch_size, bundle=True,
                                                 **common.step_options(common.args()))
    result = planner.plan(FLAGS.checkpoint, graph=graph, model=FLAGS.model, batch_size=FLAGS.batch_size,
                          cluster=FLAGS.cluster, profile=FLAGS.profile, search_seconds=FLAGS.search_seconds,
                          samples=FLAGS.samples, seed=FLAGS.seed, out=FLAGS.out,
                          resolve_bundle=bundle_for_entry, overheads=FLAGS.overheads, weights=FLAGS.policy)
    print(planner.format_result(result))
    return 0


def run() -> None:
    """Entry point for `python -m`: `app.run(main)` under tfplace.cli.common's contract."""
    common.run(main, define_flags, __doc__)


if __name__ == "__main__":
    run()
