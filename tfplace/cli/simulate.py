"""Simulates one training iteration of a strategy and prints the report.

    python -m tfplace.simulate --graph graph_defs/zoo/resnet50_b64_s224_sgd.json \
        --cluster clusters/two_kind_4gpu.json --profile resnet50.profile.json \
        --strategy strategy.json --trace trace.json

Prints the iteration time, per-device peak memory against capacity, OOM and utilisation; with
`--trace PATH` writes the Chrome trace (open in chrome://tracing or https://ui.perfetto.dev).
Without `--profile` the device model supplies one (`tfplace.profiling.device_model.default_profile`: the
graph's bundled measured profile, derived to the cluster's kinds, else the pure roofline model);
if no device model is installed the command stops with a message asking for --profile. The
strategy's `max_groups` picks the grouping its group names refer to. `--json PATH` also writes
the report as JSON.

Exit status: 0 when simulated (an OOM is a result, shown in the report), 2 on bad input with one
message naming the file, the field and the fix.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from typing import Optional, Sequence

from tfplace.formats.errors import InputError, exit_code_of


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tfplace.simulate", description=__doc__.split("\n\n")[0])
    p.add_argument("--graph", required=True, help="bundle metadata .json (or a GraphDef with --sinks)")
    p.add_argument("--cluster", required=True, help="cluster.json")
    p.add_argument("--strategy", required=True, help="strategy.json")
    p.add_argument("--profile", default=None, help="profile.json (default: the roofline device model)")
    p.add_argument("--sinks", nargs="+", default=None, help="train op name(s), for a bare GraphDef")
    p.add_argument("--trace", default=None, metavar="PATH", help="write the Chrome trace here")
    p.add_argument("--json", default=None, metavar="PATH", help="write the report as JSON here")
    p.add_argument("--seed", type=int, default=0, help="straggler noise seed")
    p.add_argument("--engine", choices=("auto", "fast", "reference"), default="auto")
    return p


def _device_model_profile(graph, cluster):
    try:
        model = importlib.import_module("tfplace.profiling.device_model")
    except ModuleNotFoundError:
        model = None
    fn = getattr(model, "default_profile", None) or getattr(model, "roofline_profile", None)
    if fn is None:
        raise InputError("argument --profile", "", "missing, and no device model is available "
                         "(tfplace.device_model)",
                         "pass --profile PROFILE_JSON (measure one with `python -m tfplace.profile`)")
    return fn(graph, cluster.kinds)


def execute(args) -> int:
    from tfplace.formats.cluster import load_cluster
    from tfplace.ir.loader import load_op_graph
    from tfplace.ir.grouping import make_grouping
    from tfplace.lowering.lower import lower
    from tfplace.formats.profile import load_profile
    from tfplace.simulator import SimOptions, simulate, write_trace
    from tfplace.formats.strategy import load_strategy, validate_strategy

    cluster = load_cluster(args.cluster)
    strategy = load_strategy(args.strategy)
    if args.profile is None:
        # Checked before loading the graph, so the message comes without a TensorFlow import.
        if importlib.util.find_spec("tfplace.profiling.device_model") is None:
            _device_model_profile(None, cluster)
    graph = load_op_graph(args.graph, sinks=args.sinks, batch_size=strategy.global_batch_size)
    profile = load_profile(args.profile) if args.profile else _device_model_profile(graph, cluster)
    grouping = make_grouping(graph, strategy.max_groups)
    validate_strategy(strategy, grouping.group_names, cluster.device_names)
    placed = lower(graph, grouping, cluster, strategy, profile)
    report = simulate(placed, cluster, SimOptions(seed=args.seed, trace=bool(args.trace), engine=args.engine))
    origin = args.profile or f"device model ({profile.conditions.get('method', 'tfplace.device_model')})"
    print(f"{graph.meta.get('model', graph.source)} on {cluster.name}, strategy {args.strategy} "
          f"(batch {strategy.global_batch_size}, {grouping.num_groups} groups), profile: {origin}")
    print(report.summary())
    if args.trace:
        write_trace(report.trace, args.trace)
        print(f"trace: {args.trace}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report.to_json(), f, indent=1)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return exit_code_of(execute, _parser().parse_args(argv))


def run() -> None:
    """Entry point for `python -m`."""
    sys.exit(main())


if __name__ == "__main__":
    run()
