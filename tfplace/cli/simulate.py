"""Simulates one training iteration of a strategy and prints the report.

    python -m tfplace.simulate --graph graph_defs/zoo/resnet50_b64_s224_sgd.json \\
        --cluster clusters/two_kind_4gpu.json --profile resnet50.profile.json \\
        --strategy strategy.json --trace trace.json

--graph may be your own training step (.pb/.pbtxt GraphDef, .meta MetaGraphDef): its train op, loss,
loss reduction and inputs are inferred; `--train_op`, `--loss`, `--loss_reduction`, `--inputs` name
them when the error says inference cannot tell. Prints the iteration time, per-device peak memory against capacity, OOM and utilisation; with
`--trace PATH` writes the Chrome trace (open in chrome://tracing or https://ui.perfetto.dev).
Without `--profile` the device model supplies one (`tfplace.profiling.device_model.cluster_profile`: the
graph's bundled measured profile, derived to the cluster's kinds, else the pure roofline model; a CPU
kind under a declared CPU quota is the CPU over its quota; another unknown kind asks for --profile). The
strategy's `max_groups` picks the grouping its group names refer to. `--overheads FILE` adds the
runtime overheads measured on a CPU-emulated cluster (`python -m tfplace.cli.overheads`). `--json PATH` also writes
the report as JSON. Output paths, numbers, the zoo model name and input files (regular files
only: a folder, FIFO or device is refused) are checked before anything is loaded.

Exit status: 0 when simulated (an OOM is a result, shown in the report), 2 on a usage error or
bad input with one message naming the file, the field and the fix (tfplace.cli.common).
"""

from __future__ import annotations

import json
import sys

from absl import flags

from tfplace.cli import common
from tfplace.formats.jsonio import atomic_write


def define_flags() -> None:
    """The command's flags (called when it runs; see tfplace.cli.common)."""
    flags.DEFINE_string("graph", None, "bundle metadata .json, a zoo model name (exported at the strategy's "
                        "batch), or a training step .pb/.pbtxt/.meta (roles inferred)", required=True)
    flags.DEFINE_string("cluster", None, "cluster.json", required=True)
    flags.DEFINE_string("strategy", None, "strategy.json", required=True)
    flags.DEFINE_string("profile", None, "profile.json (default: the device model's: the graph's bundled measured "
                        "profile derived to the cluster's kinds, else the roofline model)")
    common.define_step_flags()
    flags.DEFINE_alias("sinks", "train_op")
    flags.DEFINE_string("trace", None, "write the Chrome trace to this file")
    flags.DEFINE_string("json", None, "write the report as JSON to this file")
    from tfplace.simulator.core import STRAGGLER_MODES, SimOptions
    flags.DEFINE_enum("stragglers", SimOptions().stragglers, list(STRAGGLER_MODES), "devices that may straggle "
                      "(cluster file): the expected step over their draws (what plan, compare and train rank by), one "
                      "draw (--seed), or none")
    flags.DEFINE_integer("seed", 0, "straggler noise seed (--stragglers draw; expected: of the sampled draws when "
                         "there are too many combinations to run them all)", lower_bound=0)
    flags.DEFINE_enum("engine", "auto", ["auto", "fast", "reference"], "simulator event loop: fast (numba, compiled on "
                      "first use), reference (plain Python, the spec fast is tested against), auto (fast if numba "
                      "imports, else reference)")
    common.define_overheads_flag()
    common.output_file_flag("trace")
    common.output_file_flag("json")
    common.graph_flag("graph")
    for name in ("cluster", "strategy", "profile", "overheads"):
        common.input_file_flag(name)


def execute(args) -> int:
    from tfplace.baselines.problem import with_overheads
    from tfplace.formats.cluster import load_cluster
    from tfplace.ir.grouping import make_grouping
    from tfplace.lowering.lower import lower
    from tfplace.formats.profile import load_profile
    from tfplace.profiling.device_model import cluster_profile, default_profile_label
    from tfplace.simulator import SimOptions, simulate, write_trace
    from tfplace.formats.strategy import graph_mismatch_note, load_strategy, validate_strategy

    cluster = load_cluster(args.cluster)
    strategy = load_strategy(args.strategy)
    overheads = common.load_overheads_arg(args.overheads, cluster)
    common.print_overheads_notes(cluster, args.cluster, overheads, args.overheads)
    graph = common.load_graph_arg(args.graph, "argument --graph", args, strategy.global_batch_size)
    mismatch = graph_mismatch_note(strategy, graph.name)
    if mismatch:
        print(mismatch, file=sys.stderr)
    profile = load_profile(args.profile) if args.profile else cluster_profile(graph, cluster)
    common.print_profile_note(profile, graph.source, args.profile, graph.names)
    grouping = make_grouping(graph, strategy.max_groups)
    validate_strategy(strategy, grouping.group_names, cluster.device_names)
    placed = with_overheads(lower(graph, grouping, cluster, strategy, profile), cluster, overheads)
    report = simulate(placed, cluster, SimOptions(seed=args.seed, stragglers=args.stragglers, trace=bool(args.trace),
                                                 engine=args.engine))
    origin = args.profile or default_profile_label(profile, cluster)
    print(f"{graph.name} on {cluster.name}, strategy {args.strategy} "
          f"(batch {strategy.global_batch_size}, {grouping.num_groups} groups), profile: {origin}")
    print(report.summary())
    near = report.near_memory_note()
    if near:
        print(near, file=sys.stderr)
    if args.trace:
        write_trace(report.trace, args.trace)
        print(f"trace: {args.trace}")
    if args.json:
        atomic_write(args.json, lambda f: json.dump(report.to_json(), f, indent=1))
    return 0


def main(argv) -> int:
    """Runs the command on the parsed flags (absl main: argv holds the program name only)."""
    del argv
    return execute(common.args())


def run() -> None:
    """Entry point for `python -m`: `app.run(main)` under tfplace.cli.common's contract."""
    common.run(main, define_flags, __doc__)


if __name__ == "__main__":
    run()
