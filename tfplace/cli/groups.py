"""Prints (or writes) the op groups a strategy's `max_groups` refers to.

    python -m tfplace.cli.groups --graph graph_defs/zoo/resnet50_b64_s224_sgd.json --max-groups 50
    python -m tfplace.cli.groups --graph step.pb --batch-size 64 --max-groups 20 --json groups.json
    (a bare step's train op, loss and inputs are inferred; --train_op, --loss, --loss_reduction,
    --inputs name them when inference cannot tell)

Output: one line per group (index, op count, batch-splittable, anchor name). `--json PATH` writes
{"format": "tfplace.groups", "version": 1, "graph": ..., "max_groups": K, "num_ops": N,
 "groups": [{"name": ..., "num_ops": n, "batch_splittable": bool, "ops": [op names]}]}.
Exit status 2 on a usage error or bad input, with one message naming the file, the field and the
fix (tfplace.cli.common).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

from absl import flags

from tfplace.cli import common


def define_flags() -> None:
    """The command's flags (called when it runs; see tfplace.cli.common)."""
    flags.DEFINE_string("graph", None, "bundle metadata .json, a zoo model name, or a training step .pb/.pbtxt/.meta",
                        required=True)
    flags.DEFINE_integer("max-groups", None, "K: at most this many groups", lower_bound=1, required=True)
    common.batch_size_flag("batch-size", None, "global batch size")
    common.define_step_flags()
    flags.DEFINE_alias("sinks", "train_op")
    flags.DEFINE_alias("loss-reduction", "loss_reduction")
    flags.DEFINE_string("json", None, "also write the groups as JSON to this file")
    common.output_file_flag("json")
    common.graph_flag("graph")


def groups_json(graph, grouping, max_groups: int) -> Dict[str, Any]:
    """The JSON document `--json` writes (see the module docstring)."""
    groups: List[Dict[str, Any]] = []
    for g in range(grouping.num_groups):
        ops = grouping.group_ops(g)
        groups.append({"name": grouping.group_names[g], "num_ops": int(len(ops)),
                       "batch_splittable": bool(grouping.group_batch_splittable[g]),
                       "ops": [graph.names[i] for i in ops]})
    return {"format": "tfplace.groups", "version": 1, "graph": graph.source, "max_groups": max_groups,
            "num_ops": graph.num_ops, "groups": groups}


def main(argv) -> int:
    """Prints (and writes) the groups of the parsed flags (absl main: argv holds the program name only)."""
    del argv
    args = common.args()
    from tfplace.ir.grouping import make_grouping
    from tfplace.formats.jsonio import write_json

    graph = common.load_graph_arg(args.graph, "argument --graph", args, args.batch_size)
    grouping = make_grouping(graph, args.max_groups)
    width = max(len(str(grouping.num_groups)), 5)
    print(f"{'group':>{width}}  {'ops':>6}  split  name")
    for g in range(grouping.num_groups):
        split = "yes" if grouping.group_batch_splittable[g] else "no"
        print(f"{g:>{width}}  {len(grouping.group_ops(g)):>6}  {split:<5}  {grouping.group_names[g]}")
    print(f"{graph.num_ops} ops in {grouping.num_groups} groups "
          f"({int(grouping.group_batch_splittable.sum())} batch-splittable), max_groups={args.max_groups}")
    if args.json:
        write_json(os.fspath(args.json), groups_json(graph, grouping, args.max_groups))
        print(f"wrote {args.json}")
    return 0


def run() -> None:
    """Entry point for `python -m`: `app.run(main)` under tfplace.cli.common's contract."""
    common.run(main, define_flags, __doc__)


if __name__ == "__main__":
    run()
