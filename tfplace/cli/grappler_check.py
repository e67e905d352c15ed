"""Cross-checks the roofline device model against TensorFlow Grappler's analytical cost model.

    python -m tfplace.cli.grappler_check --graph graph_defs/zoo/resnet50_b64_s224_sgd.json --kind V100
    python -m tfplace.cli.grappler_check --all --kind V100 --kind P100 [--batch-size 32] [--by-type]

Prints one row per graph and kind: Grappler's and our predicted compute time of one step on one
device and their ratios (tfplace.profiling.grappler_check says how they are computed). --graph
and --kind repeat. The tiny test models come out as "n/a" at their own batch (below Grappler's
resolution); give them a large --batch-size (e.g. 4096).
Exit status 2 on a usage error or bad input, with one line naming the file, the field and the fix.
"""

from __future__ import annotations

import glob
import os
from typing import List, Optional, Sequence

from absl import flags

from tfplace.cli import common
from tfplace.formats.errors import InputError


def define_flags() -> None:
    """The command's flags (called when it runs; see tfplace.cli.common)."""
    flags.DEFINE_multi_string("graph", [], "bundle JSON or zoo model name (repeatable)")
    flags.DEFINE_boolean("all", False, "every model of the zoo")
    flags.DEFINE_multi_string("kind", [], "device kind (repeatable; default V100)")
    common.batch_size_flag("batch-size", 0, "per-device batch (0: the bundle's)", minimum=0)
    flags.DEFINE_boolean("by-type", False, "also split the totals by op type")
    flags.register_multi_flags_validator(["graph", "all"], lambda v: bool(v["graph"]) or v["all"],
                                         message="give --graph BUNDLE_JSON (repeatable) or --all")
    common.graph_flag("graph")
    common.device_kinds_flag("kind")


def zoo_graphs() -> List[str]:
    """Every bundle JSON in the model zoo folder (one per model: the first stem found)."""
    from tfplace.graph_defs import export
    paths, seen = [], set()
    for p in sorted(glob.glob(os.path.join(export.ZOO_DIR, "*.json"))):
        model = os.path.basename(p).split("_b")[0]
        if model not in seen:
            seen.add(model)
            paths.append(p)
    return paths


def check_bundle(meta_path: str, kinds: Sequence[str], batch_size: Optional[int] = None):
    """Grappler vs our model for one bundle on each kind (per-device batch: the bundle's unless given)."""
    from tfplace.graph_defs import bundle
    from tfplace.ir.loader import load_op_graph, read_graph_source
    from tfplace.profiling.grappler_check import check_graph

    if not meta_path.endswith(".json"):
        raise InputError(meta_path, "", "is not a bundle's metadata .json",
                         "give a bundle JSON, e.g. graph_defs/zoo/tiny_mlp_b16_sgd.json")
    # the one strict bundle reader: regular files only (a FIFO is never opened), InputErrors
    graph_def, meta, _ = read_graph_source(meta_path, None)
    b = batch_size or meta["global_batch_size"]
    graph = load_op_graph(meta_path, batch_size=b)
    name = os.path.splitext(os.path.basename(meta_path))[0]
    return check_graph(name, graph, bundle.with_batch_size(graph_def, meta["inputs"], b), meta["sink"], kinds, b)


def main(argv) -> int:
    """Prints the comparison for the parsed flags (absl main: argv holds the program name only)."""
    del argv
    from tfplace.profiling.grappler_check import HEADER, format_rows
    args = common.args()
    graphs = [common.resolve_graph(g, "argument --graph") for g in args.graph] + (zoo_graphs() if args.all else [])
    print(HEADER, flush=True)
    for g in graphs:
        rows = check_bundle(g, args.kind or ["V100"], args.batch_size or None)
        print(format_rows(rows, args.by_type, header=False), flush=True)
    return 0


def run() -> None:
    """Entry point for `python -m`: `app.run(main)` under tfplace.cli.common's contract."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # the virtual GPU makes Grappler log CUDA errors
    common.run(main, define_flags, __doc__)


if __name__ == "__main__":
    run()
