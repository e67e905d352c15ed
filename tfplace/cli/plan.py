"""One strategy for a graph and cluster from a trained policy, zero-shot, optionally improved by
search: `python -m tfplace.plan --graph bundle.json|step.pb|--model NAME --batch_size B
--cluster cluster.json [--profile profile.json] [--search_seconds N] --out strategy.json`.
A zoo model's sizes and optimizer are its defaults unless --image_size (image models), --seq_len
and --num_layers (sequence models) or --optimizer say otherwise, as an export (tfplace.cli.export)
or a config's graph entry does.
Every flag (numbers, the zoo model name and the sizes it takes, input files and --out) is checked
before anything loads.

The policy: the pre-trained one shipped with tfplace (policy/pretrained/policy.json), unless
--checkpoint RUN_DIR (the output_dir of `python -m tfplace.train`: its config.json gives the
network sizes and max_groups, its state.json the checkpoint) or --policy FILE (a weights file of
`python -m tfplace.pretrain`) names another. The result is the best of: the policy's greedy
strategy, `--samples` policy samples, every baseline, and (with --search_seconds) the
policy-guided search (tfplace.policy.planner.plan_task; its progress and best time so far on
stderr unless --noprogress); it is never worse than the best baseline.
An out-of-memory strategy is never written: when the best by penalised time does not fit, the
fastest that fits is planned instead; when none fits, one error line gives each device's need
against its memory, exit status 1, and nothing is written.

--confirm_real K (a cluster of loopback tasks, emulated as its file says; any other is refused
before planning): the result, the K baselines the simulator ranks next and the fastest device
alone run for real, --confirm_rounds rounds on fresh servers of --confirm_steps steps after as
many warm-up steps, and the strategy whose median round ran fastest is written
(tfplace.cli.real_check).

--overheads measure (such a cluster too): its runtime overheads are measured first, as activate's
"overheads": "measure" does (about a minute), written beside --out as <stem>.overheads.json, and
used for planning and the check; a file instead names overheads measured before.
"""

from __future__ import annotations

import dataclasses
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from tfplace.cli import common  # noqa: E402
from tfplace.formats.config import MEASURE  # noqa: E402  (--overheads measure, as an activate config says it)
from tfplace.formats.errors import InputError  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags (called when it runs; see tfplace.cli.common)."""
    flags.DEFINE_string("checkpoint", None, "output_dir of a training run (default: the shipped policy)")
    flags.DEFINE_string("policy", None, "policy weights file of python -m tfplace.pretrain (default: the shipped one)")
    flags.DEFINE_string("graph", None, "graph bundle .json or a training step .pb/.pbtxt/.meta (or use --model)")
    common.define_step_flags()
    flags.DEFINE_string("model", None, "zoo model name (exported on demand)")
    common.batch_size_flag("batch_size", None, "global batch size (default: the bundle's, or the zoo model's)")
    flags.DEFINE_integer("image_size", None, "with --model: image side in pixels (image models; default: the "
                         "model's)", lower_bound=1)
    flags.DEFINE_integer("seq_len", None, "with --model: sequence length in tokens (sequence models; default: the "
                         "model's)", lower_bound=1)
    flags.DEFINE_integer("num_layers", None, "with --model: layers per stack (sequence models; default: the "
                         "model's)", lower_bound=1)
    from tfplace.graph_defs.bundle import OPTIMIZERS  # light: no TensorFlow
    flags.DEFINE_enum("optimizer", None, list(OPTIMIZERS), "with --model: the training step's optimizer (default: "
                      "sgd)")
    flags.DEFINE_string("cluster", None, "cluster .json", required=True)
    flags.DEFINE_string("profile", None, "profile .json (default: derived by the device model)")
    flags.DEFINE_float("search_seconds", 0.0, "seconds of sampling + local search after the zero-shot plan",
                       lower_bound=0.0)
    flags.DEFINE_boolean("progress", True, "with --search_seconds: show the search's progress and the best "
                         "strategy so far on stderr (a line every 5 s, or one updated in place on a terminal)")
    flags.DEFINE_integer("samples", 8, "policy samples evaluated zero-shot", lower_bound=0)
    flags.DEFINE_integer("seed", 0, "sampling / search seed", lower_bound=0)
    flags.DEFINE_string("out", "strategy.json", "where to write the strategy")
    flags.DEFINE_integer("confirm_real", 0, "run the plan, the K next-best baselines and the fastest device alone "
                         "on the cluster for real (loopback tasks, emulated as the cluster file says) and write the "
                         "fastest", lower_bound=0)
    flags.DEFINE_integer("confirm_rounds", 3, "with --confirm_real: rounds on fresh servers; the median counts",
                         lower_bound=1)
    flags.DEFINE_integer("confirm_steps", 20, "with --confirm_real: timed steps per round (after as many "
                         "warm-up steps)", lower_bound=1)
    common.define_overheads_flag(measure=True)
    flags.mark_flags_as_mutual_exclusive(["graph", "model"], required=True)
    flags.mark_flags_as_mutual_exclusive(["checkpoint", "policy"])
    common.output_file_flag("out")
    common.flag_check("checkpoint", check_run_dir)
    common.graph_flag("graph", zoo=False)
    common.zoo_model_flag("model")
    for name in ("cluster", "profile", "policy"):
        common.input_file_flag(name)
    common.flag_check("overheads", check_overheads_arg)


def check_overheads_arg(value: str) -> None:
    """--overheads: "measure", or a file this command can read (InputError naming both fixes)."""
    if value == MEASURE:
        return
    try:
        common.check_input_file(value)
    except InputError as err:
        raise InputError(err.source, err.field, err.problem,
                         f"{err.fix}; or give --overheads {MEASURE} to measure them on the cluster first") from None


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
    check_model_options()
    from tfplace.formats.cluster import load_cluster
    cluster = load_cluster(FLAGS.cluster)
    measure = FLAGS.overheads == MEASURE
    if measure:  # before any work, an export of the graph included
        from tfplace.cli.activate import check_measurable
        check_measurable(cluster, FLAGS.cluster, "argument", "--overheads", f"leave out --overheads {MEASURE}")
        common.check_output_file(measured_overheads_path(), "argument --out")
    if FLAGS.confirm_real or measure:  # a cluster that cannot run here is refused before any planning
        from tfplace.runtime.local_cluster import LocalCluster
        LocalCluster.for_cluster(cluster)
    from tfplace.graph_defs.export import bundle_for_entry
    from tfplace.policy import planner
    graph = FLAGS.graph and common.resolve_graph(FLAGS.graph, "argument --graph", FLAGS.batch_size, bundle=True,
                                                 **common.step_options(common.args()))
    if FLAGS.confirm_real and graph:  # the real runs feed the batch alone: refused before any measuring or search
        from tfplace.profiling.profiler import check_bundle_feedable
        check_bundle_feedable(graph, FLAGS.graph)
    overheads_path = FLAGS.overheads
    if measure:
        from tfplace.cli.activate import measure_cluster_overheads
        overheads_path = measured_overheads_path()
        measure_cluster_overheads(cluster, FLAGS.cluster, overheads_path, "python -m tfplace.plan --overheads measure",
                                  out=sys.stderr)
    else:
        common.print_overheads_notes(cluster, FLAGS.cluster, common.load_overheads_arg(FLAGS.overheads, cluster),
                                     FLAGS.overheads, fix=f"give --overheads {MEASURE} to measure them first",
                                     machine_fix=f"give --overheads {MEASURE} to measure them on this machine")
    from tfplace.graph_defs.user_step import is_step_file
    if FLAGS.confirm_real and graph and FLAGS.batch_size and not is_step_file(FLAGS.graph):
        from tfplace.cli.activate import check_bundle_batch
        check_bundle_batch(graph, FLAGS.batch_size, "arguments", "--batch_size")  # a real step runs at the bundle's
    try:
        result = planner.plan(FLAGS.checkpoint, graph=graph, model=FLAGS.model, batch_size=FLAGS.batch_size,
                              image_size=FLAGS.image_size, seq_len=FLAGS.seq_len, num_layers=FLAGS.num_layers,
                              optimizer=FLAGS.optimizer, cluster=FLAGS.cluster, profile=FLAGS.profile,
                              search_seconds=FLAGS.search_seconds,
                              samples=FLAGS.samples, seed=FLAGS.seed, out=None, resolve_bundle=bundle_for_entry,
                              overheads=overheads_path, weights=FLAGS.policy, label=_step_label(FLAGS.graph),
                              progress=search_progress(FLAGS.search_seconds)
                              if FLAGS.progress and FLAGS.search_seconds else None)
    except InputError as err:  # the zoo export's error about --model's options: the flags gave them
        from tfplace.formats.config import GraphEntry
        entry = GraphEntry(FLAGS.batch_size, model=FLAGS.model, **_model_options())
        if not FLAGS.model or err.source != entry.error_source:
            raise
        raise InputError("arguments", _MODEL_OPTION_FLAGS.get(err.field, "--model"), err.problem, err.fix) from None
    if FLAGS.profile:
        common.print_profile_note(result.task.profile, result.bundle, FLAGS.profile)
    whole = result.task and common.whole_groups_note(result.task.lowerer)  # task None: not made by planner.plan
    if whole:
        print(whole, file=sys.stderr)
    from tfplace.formats.strategy import save_strategy
    fits = result.best_fitting if result.best.oom else result.best
    if fits is not None and not FLAGS.confirm_real:  # written first: a closed pipe on stdout must not lose it
        save_strategy(fits.strategy, FLAGS.out)
    print(planner.format_result(result), flush=True)
    if fits is None:  # nothing written: a strategy that does not fit is no plan
        print(f"error: {out_of_memory_problem(result)}; {FLAGS.out} was not written. Fix: use a cluster with more "
              f"device memory or a smaller batch size", file=sys.stderr)
        return common.FAILED_EXIT
    if fits is not result.best:
        print(f"the best by penalised time ({result.best.source}, {result.best.time_s * 1e3:.3f} ms) runs out of "
              f"memory: the fastest strategy that fits is planned instead, {fits.source} ({fits.time_s * 1e3:.3f} ms)",
              flush=True)
        result = dataclasses.replace(result, best=fits)
    near = result.task and result.task.simulate(fits.strategy).near_memory_note()
    if near:
        print(near, file=sys.stderr)
    if FLAGS.confirm_real:
        from tfplace.cli import real_check
        check = real_check.confirm(result.task, result, result.bundle, FLAGS.cluster, overheads_path,
                                   FLAGS.confirm_real, FLAGS.confirm_steps, FLAGS.confirm_steps, FLAGS.confirm_rounds)
        print(real_check.format_check(check))
        save_strategy(check.strategy, FLAGS.out)
    print(f"strategy written to {FLAGS.out}")
    return 0


# resolve_options' option names -> this command's flags (tfplace.cli.export spells them with "-"; either reaches them)
_MODEL_OPTION_FLAGS = {"batch_size": "--batch_size", "image_size": "--image_size", "seq_len": "--seq_len",
                       "num_layers": "--num_layers", "optimizer": "--optimizer"}


def _model_options() -> dict:
    """The zoo model's options the flags give (resolve_options' keywords), None where not given."""
    return {k: getattr(FLAGS, k) for k in ("image_size", "seq_len", "num_layers", "optimizer")}


def check_model_options() -> None:
    """Raises InputError naming the flag unless --model takes --batch_size, --image_size, --seq_len,
    --num_layers and --optimizer as given (tfplace.graph_defs.export.resolve_options, as the export
    checks them); these without --model are refused: a bundle or step has them built in."""
    options = _model_options()
    if not FLAGS.model:
        given = [_MODEL_OPTION_FLAGS[k] for k, v in options.items() if v is not None]
        if given:
            raise InputError(f"argument {given[0]}", "", "sets a zoo model's option, but --graph was given "
                             "(its sizes and optimizer are built into the graph)",
                             f"drop {given[0]}, or give --model NAME")
        return
    common.check_zoo_options(FLAGS.model, _MODEL_OPTION_FLAGS, FLAGS.batch_size,
                             **{k: v for k, v in options.items() if v is not None})


def search_progress(search_seconds: float, stream=None):
    """A planner.Progress that shows a search of `search_seconds` on a progress bar
    (tfplace.profiling.profiler.ProgressBar, on stderr: redrawn in place on a terminal, a line every
    5 s otherwise) with the best time so far and where it came from."""
    from tfplace.profiling.profiler import ProgressBar
    bars = []

    def show(elapsed_s: float, best) -> None:
        if not bars:  # made when the search reports first
            bars.append(ProgressBar(search_seconds, "search", stream=stream))
        bars[0].update_to(elapsed_s, f"best {best.time_s * 1e3:.3f} ms ({best.source}{', OOM' if best.oom else ''})",
                          elapsed_s=elapsed_s)  # the search's clock, not the bar's
    return show


def out_of_memory_problem(result) -> str:
    """What runs out of memory in `result` (a PlanResult none of whose strategies fits): its best
    by penalised time, and the strategy that comes closest to fitting (the least peak over
    memory on its fullest device, among the baselines and what the policy and search found),
    each device's peak against its memory."""
    entries = {id(e): e for e in [result.best, *result.baseline_entries, result.zero_shot, result.best_action]
               if e is not None}
    reports = {key: result.task.simulate(e.strategy) for key, e in entries.items()}
    report = reports[id(result.best)]
    text = (f"{FLAGS.cluster}: no strategy found fits in device memory: the best ({result.best.source}) "
            f"runs out of memory ({report.over_memory_text(report.over_memory)})")

    def fullest(r) -> float:
        return max(p / c for p, c in zip(r.peak_memory_bytes, r.memory_capacity_bytes))
    closest = min(((entries[key], r) for key, r in reports.items()), key=lambda er: fullest(er[1]))
    if fullest(closest[1]) < fullest(report):
        entry, r = closest
        text += (f"; the closest to fitting ({entry.source}) needs {fullest(r):.2f}x the memory of its fullest "
                 f"device ({r.over_memory_text(r.over_memory)})")
    return text


def measured_overheads_path() -> str:
    """Where --overheads measure writes: beside --out, <stem>.overheads.json."""
    return os.path.splitext(FLAGS.out)[0] + ".overheads.json"


def starts_servers() -> bool:
    """Whether the parsed flags ask for real runs or measurements (--confirm_real K > 0,
    --overheads measure), which start local servers."""
    return bool(FLAGS.confirm_real) or FLAGS.overheads == MEASURE


def _step_label(graph):
    """A bare step's name, as its strategy's "graph" field has it (the bundle imported from it is
    cached under that name plus a hash); None for anything else."""
    from tfplace.graph_defs.user_step import is_step_file, step_name
    return step_name(graph) if graph is not None and is_step_file(graph) else None


def run() -> None:
    """Entry point for `python -m`: `app.run(main)` under tfplace.cli.common's contract; with
    --confirm_real or --overheads measure the command starts servers, so it runs in a private
    network (common.run decides once the flags are parsed); TensorFlow's temporary files go to a
    folder of this process (tfplace.runtime.tmpdir)."""
    common.run(main, define_flags, __doc__, servers=starts_servers, private_tmp=True)


if __name__ == "__main__":
    run()
