"""Prints (or writes) the op groups a strategy's `max_groups` refers to.

    python -m tfplace.cli.groups --graph graph_defs/zoo/resnet50_b64_s224_sgd.json --max-groups 50
    python -m tfplace.cli.groups --graph step.pb --sinks train_op --batch-size 64 --loss-reduction mean \
        --max-groups 20 --json groups.json

Output: one line per group (index, op count, batch-splittable, anchor name). `--json PATH` writes
{"format": "tfplace.groups", "version": 1, "graph": ..., "max_groups": K, "num_ops": N,
 "groups": [{"name": ..., "num_ops": n, "batch_splittable": bool, "ops": [op names]}]}.
Exit status 2 on bad input, with one message naming the file, the field and the fix.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from tfplace.formats.errors import InputError


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tfplace.cli.groups", description=__doc__.split("\n\n")[0])
    p.add_argument("--graph", required=True, help="bundle metadata .json, or a .pb/.pbtxt GraphDef")
    p.add_argument("--max-groups", required=True, type=_positive_int, help="K: at most this many groups")
    p.add_argument("--sinks", nargs="+", default=None, help="train op name(s) (needed for a bare GraphDef)")
    p.add_argument("--batch-size", type=_positive_int, default=None, help="global batch size")
    p.add_argument("--loss", default=None, help="loss op name")
    p.add_argument("--loss-reduction", choices=("mean", "sum"), default=None)
    p.add_argument("--json", default=None, metavar="PATH", help="also write the groups as JSON here")
    return p


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


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    from tfplace.ir.loader import load_op_graph
    from tfplace.ir.grouping import make_grouping
    from tfplace.formats.jsonio import write_json

    try:
        graph = load_op_graph(args.graph, sinks=args.sinks, batch_size=args.batch_size, loss=args.loss,
                              loss_reduction=args.loss_reduction)
        grouping = make_grouping(graph, args.max_groups)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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
    """Entry point for `python -m`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())


if __name__ == "__main__":
    run()
