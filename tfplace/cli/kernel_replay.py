"""Per-op GPU kernel times by replaying a step's ops with PyTorch kernels (tfplace.profiling.kernel_replay).

    python -m tfplace.cli.kernel_replay export --graph graph_defs/zoo/resnet50_b64_s224_sgd.json --out ops.json
    python -m tfplace.cli.kernel_replay replay --ops ops.json --batch-sizes 8,16,32 --out replay.json
    python -m tfplace.cli.kernel_replay to-profile --replay replay.json --kind H100 --out profile.json

The positional argument is the step: `export` writes the op table of a graph (TensorFlow side),
`replay` times it on cuda:0 (needs PyTorch, not TensorFlow), `to-profile` turns a replay result
into a profile keyed by --kind. --out is checked before any work.
Exit status 2 on a usage error or bad input, with one line naming the file, the field and the fix.
"""

from __future__ import annotations

import json
import sys

from absl import flags

from tfplace.cli import common
from tfplace.formats.config import SIZE_LIMIT
from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import atomic_write

POSITIONAL = ("STEP",)  # export | replay | to-profile
STEPS = {"export": ("graph",), "replay": ("ops", "batch-sizes"), "to-profile": ("replay", "kind")}


def define_flags() -> None:
    """The command's flags (called when it runs; see tfplace.cli.common)."""
    flags.DEFINE_string("graph", None, "export: bundle JSON of the graph, or a zoo model name")
    flags.DEFINE_string("ops", None, "replay: op table JSON written by export")
    flags.DEFINE_list("batch-sizes", None, "replay: per-device batch sizes, comma-separated")
    flags.DEFINE_integer("reps", 7, "replay: timed launches per op (the median is kept)", lower_bound=1)
    flags.DEFINE_string("replay", None, "to-profile: replay result JSON")
    flags.DEFINE_string("kind", None, "to-profile: device kind that keys the profile (e.g. H100)")
    flags.DEFINE_string("out", None, "the file this step writes", required=True)
    common.output_file_flag("out")
    common.int_list_flag("batch-sizes", minimum=1, below=SIZE_LIMIT)
    common.graph_flag("graph")
    common.input_file_flag("ops")
    common.input_file_flag("replay")
    common.flag_check("kind", _check_kind)
    common.flag_check("batch-sizes", lambda v: v or _fail("--batch-sizes", "names no batch size", "write e.g. 8,16,32"))


def _fail(flag: str, problem: str, fix: str) -> None:
    raise InputError(f"argument {flag}", "", problem, fix)


def _check_kind(kind: str) -> None:
    if not kind.strip():  # it keys the profile's times
        _fail("--kind", f"{kind!r} is not a device kind name", "give the GPU model, e.g. H100")


def main(argv) -> int:
    """Runs the step argv[1] with the parsed flags (absl main)."""
    from tfplace.profiling import kernel_replay
    step, args = argv[1], common.args()
    if step not in STEPS:
        raise InputError("argument STEP", "", f"is {step!r}", f"give one of {', '.join(STEPS)}")
    for name in STEPS[step]:
        if getattr(args, name.replace("-", "_")) is None:
            raise InputError(f"argument --{name}", "", f"is required by {step}", f"give --{name}")
    if step == "export":
        from tfplace.ir.loader import load_op_graph
        table = kernel_replay.export_op_table(load_op_graph(common.resolve_graph(args.graph, "argument --graph")))
        atomic_write(args.out, lambda f: json.dump(table, f))
        print(f"{len(table['ops'])} ops -> {args.out}")
    elif step == "replay":
        table = kernel_replay.read_op_table(args.ops)
        result = kernel_replay.replay(table, [int(b) for b in args.batch_sizes], reps=args.reps,
                                      progress=lambda m: print(m, file=sys.stderr, flush=True))
        atomic_write(args.out, lambda f: json.dump(result, f))
        print(f"{len(result['seconds'])} ops timed, {len(result['skipped'])} skipped on {result['device']}")
    else:
        from tfplace.formats.profile import save_profile
        result = kernel_replay.read_replay_result(args.replay)
        save_profile(kernel_replay.replay_to_profile(result, args.kind), args.out)
        print(f"wrote {args.out}")
    return 0


def run() -> None:
    """Entry point for `python -m`: `app.run(main)` under tfplace.cli.common's contract."""
    common.run(main, define_flags, __doc__, positional=POSITIONAL)


if __name__ == "__main__":
    run()
