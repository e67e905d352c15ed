"""Compares every baseline and planner on one graph and cluster, in the simulator.

    python -m tfplace.compare --graph vgg19 --cluster clusters/heterog_testbed.json --out out/vgg19
    python -m tfplace.compare --graph graph_defs/zoo/resnet50_b64_s224_sgd.json \\
        --cluster clusters/two_kind_4gpu.json --profile resnet50.profile.json --max-groups 64

--graph is a bundle .json, a zoo model name (exported on demand at --batch-size, or at the
model's default batch), or your own training step (.pb/.pbtxt/.meta; train op, loss and inputs
inferred, or named with --train_op, --loss, --loss_reduction, --inputs). Without --profile the device model's default profile is used
(tfplace.profiling.device_model.default_profile: a bundled measured profile scaled to each device kind
when one exists, else the roofline model); `--profile roofline` forces the roofline model.

--strategy-files S.json[,...] adds a row per strategy file (e.g. `python -m tfplace.plan`'s output),
named by the file, simulated on the same problem: its batch size and max_groups must be the
comparison's (give --batch-size and --max-groups to match; a mismatch is an error naming the file).

Prints one table: strategy, simulated step time, the largest per-device peak memory, OOM,
speed-up over DP-EV with all-reduce, fraction of the ideal compute bound (bound / time; 1.0 would
be perfect), and the time the generator took. Writes to --out (default
./compare_<graph>_<cluster>): table.txt, compare.json (rows + bounds), compare.png (bar chart:
step time with the ideal bound, peak memory with the smallest device memory), and
strategies/<name>.json for every strategy (deployable with activate.py).

Output paths are checked before anything is loaded. Exit status 0 (OOM and failed generators are
rows of the table), 2 on a usage error or bad input (tfplace.cli.common).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, Optional, Sequence

from absl import flags

from tfplace.cli import common
from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import atomic_write


def define_flags() -> None:
    """The command's flags (called when it runs; see tfplace.cli.common)."""
    flags.DEFINE_string("graph", None, "bundle .json, zoo model name (e.g. vgg19) or a training step "
                        ".pb/.pbtxt/.meta", required=True)
    flags.DEFINE_string("cluster", None, "cluster.json", required=True)
    flags.DEFINE_string("profile", None,
                        "profile.json, or 'roofline' for the pure roofline model (default: the device "
                        "model's default profile: a bundled measured profile scaled per kind, else roofline)")
    flags.DEFINE_integer("max-groups", 64, "grouping level K", lower_bound=1)
    common.batch_size_flag("batch-size", None, "global batch (default: the graph's)")
    flags.DEFINE_string("strategies", None,
                        "comma-separated baseline names (default: all; see tfplace.baselines.registry)")
    flags.DEFINE_list("strategy-files", [], "strategy files (e.g. plan's output) to simulate beside the baselines, "
                      "a row each named by its file")
    flags.DEFINE_string("out", None, "output folder (default ./compare_<graph>_<cluster>)")
    flags.DEFINE_boolean("no-plot", False, "skip the PNG")
    common.define_overheads_flag()
    common.define_step_flags()
    common.output_dir_flag("out")
    common.graph_flag("graph")
    common.input_file_flag("cluster")
    common.input_file_flag("overheads")
    common.input_file_flag("strategy-files")
    common.flag_check("profile", lambda v: v == "roofline" or common.check_input_file(v))
    common.names_flag("strategies", _baseline_names, "baseline")


def _baseline_names():
    from tfplace.baselines import registry
    return registry.names()


def _load_graph(spec: str, batch_size: Optional[int], values=None):
    return common.load_graph_arg(spec, "argument --graph", values, batch_size)


def _row(name: str, problem, generate) -> Dict[str, Any]:
    t0 = time.perf_counter()
    try:
        strategy = generate(name, problem)
    except (InputError, RuntimeError) as err:
        return {"strategy": name, "error": str(err), "plan_s": time.perf_counter() - t0}
    plan_s = time.perf_counter() - t0
    report = problem.evaluate(strategy)
    return {"strategy": name, "time_s": report.iteration_time_s, "peak_bytes": max(report.peak_memory_bytes),
            "oom": report.oom, "oom_devices": list(report.oom_devices), "plan_s": plan_s,
            "devices_used": len(strategy.all_devices()), "_strategy": strategy}


def file_rows_for(problem, files: Dict[str, Any]) -> Dict[str, Any]:
    """{row name: Strategy} of strategy files ({path: Strategy}) checked against `problem`: the row
    is named by the file's stem ("file:" before it when a baseline or an earlier file has that
    name, and "#2", "#3", ... after it for a third file of that stem and on). Raises
    InputError naming the file and field when its batch size or max_groups is not the problem's."""
    from tfplace.baselines import registry
    from tfplace.formats.strategy import validate_strategy
    rows: Dict[str, Any] = {}
    for path, strategy in files.items():
        for field, have, want, flag in (("global_batch_size", strategy.global_batch_size, problem.global_batch_size,
                                         "--batch-size"),
                                        ("max_groups", strategy.max_groups, problem.max_groups, "--max-groups")):
            if have != want:
                raise InputError(path, field, f"is {have}, the comparison's is {want}",
                                 f"give {flag} {have} to compare at the strategy's")
        validate_strategy(strategy, problem.grouping.group_names, problem.cluster.device_names)
        stem = os.path.splitext(os.path.basename(path))[0]
        name = f"file:{stem}" if stem in registry.names() or stem in rows else stem
        k = 2
        while name in rows or name in registry.names():  # files of one stem from several folders: a row each
            name, k = f"file:{stem}#{k}", k + 1
        rows[name] = strategy
    return rows


def compare(problem, names: Sequence[str], files: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Rows (one per name, then one per strategy in `files`, {row name: Strategy}) and bounds;
    speed-ups over registry.REFERENCE."""
    from tfplace.baselines import bounds, registry
    files = files or {}
    rows = [_row(n, problem, registry.generate) for n in names]
    rows += [dict(_row(n, problem, lambda name, _: files[name]), file=True) for n in files]
    ideal = bounds.ideal_compute_s(problem)
    ref = next((r for r in rows if r["strategy"] == registry.REFERENCE and "time_s" in r), None)
    if ref is None and registry.REFERENCE not in names:
        ref = _row(registry.REFERENCE, problem, registry.generate)
        ref = ref if "time_s" in ref else None
    for r in rows:
        if "time_s" in r:
            r["speedup_vs_dp_even"] = ref["time_s"] / r["time_s"] if ref else None
            r["fraction_of_ideal"] = ideal / r["time_s"] if r["time_s"] > 0 else None
    return {"rows": rows, "ideal_compute_s": ideal, "reference": registry.REFERENCE}


def format_table(result: Dict[str, Any], title: str) -> str:
    lines = [title, f"ideal compute bound: {result['ideal_compute_s'] * 1e3:.3f} ms",
             f"{'strategy':<28}{'sim ms':>10}{'peak GB':>9}{'OOM':>5}{'vs DP-EV':>10}{'of ideal':>10}{'plan s':>8}"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"{r['strategy']:<28}  not applicable: {r['error'][:90]}")
            continue
        speed = f"{r['speedup_vs_dp_even']:.2f}x" if r.get("speedup_vs_dp_even") else "-"
        frac = f"{r['fraction_of_ideal']:.2f}" if r.get("fraction_of_ideal") is not None else "-"
        lines.append(f"{r['strategy']:<28}{r['time_s'] * 1e3:>10.3f}{r['peak_bytes'] / 1e9:>9.2f}"
                     f"{'yes' if r['oom'] else 'no':>5}{speed:>10}{frac:>10}{r['plan_s']:>8.2f}")
    return "\n".join(lines)


def plot(result: Dict[str, Any], min_capacity_bytes: float, title: str, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in result["rows"] if "time_s" in r]
    names = [r["strategy"] for r in rows]
    colors = ["tab:red" if r["oom"] else "tab:blue" for r in rows]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(13, 0.42 * len(rows) + 1.8), sharey=True)
    y = range(len(rows))
    times_ms = [r["time_s"] * 1e3 for r in rows]
    ax_t.barh(y, times_ms, color=colors)
    ax_t.axvline(result["ideal_compute_s"] * 1e3, color="k", ls="--", lw=1, label="ideal compute bound")
    if times_ms and max(times_ms) > 20 * max(min(times_ms), 1e-12):
        ax_t.set_xscale("log")  # the spread between planners spans orders of magnitude
    for i, t in enumerate(times_ms):
        ax_t.annotate(f"{t:.0f}" if t >= 100 else f"{t:.3g}", (t, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax_t.set_yticks(list(y), names)
    ax_t.invert_yaxis()
    ax_t.set_xlabel("simulated step time (ms); red = OOM")
    ax_t.legend(loc="lower right", fontsize=8)
    ax_m.barh(y, [r["peak_bytes"] / 1e9 for r in rows], color=colors)
    ax_m.axvline(min_capacity_bytes / 1e9, color="k", ls=":", lw=1, label="smallest device memory (capacities differ)")
    ax_m.set_xlabel("largest per-device peak memory (GB); red = OOM")
    ax_m.legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, dpi=110, format="png"), binary=True)
    plt.close(fig)


def _check_outputs(out: Optional[str], no_plot: bool, names: Sequence[str] = (), default: bool = False) -> None:
    """Before any work: the output folder (default: one in the working folder) and, when it
    exists, every file written inside it (table, JSON, bar chart, strategies/<name>.json) can be
    written."""
    source = "argument --out" + (" (default: a folder in the working folder)" if default else "")
    if out is None:
        common.check_output_dir(os.getcwd(), source)
        return
    common.check_outputs_in(out, ["table.txt", "compare.json"] + ([] if no_plot else ["compare.png"]), source)
    if os.path.isdir(out):
        common.check_outputs_in(os.path.join(out, "strategies"), [f"{n}.json" for n in names], source, "strategies")


def execute(args) -> int:
    from tfplace.baselines import registry
    from tfplace.baselines.problem import make_problem
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.profile import load_profile
    from tfplace.formats.strategy import graph_mismatch_note, load_strategy, save_strategy

    names = registry.names() if args.strategies is None else tuple(x.strip() for x in args.strategies.split(",") if x.strip())
    names = tuple(n for n in names if not registry.is_runtime(n))  # Horovod rows equal their DP strategies
    _check_outputs(args.out, args.no_plot, names)
    cluster = load_cluster(args.cluster)
    files = {path: load_strategy(path) for path in args.strategy_files}  # before any work: their errors name them
    graph = _load_graph(args.graph, args.batch_size, args)
    if args.profile == "roofline":
        from tfplace.profiling.device_model import roofline_profile
        profile, profile_label = roofline_profile(graph, cluster.kinds), "roofline device model"
    elif args.profile:
        profile = load_profile(args.profile)
        profile_label = args.profile
        common.print_profile_note(profile, graph.source, args.profile, graph.names)
    else:
        from tfplace.profiling.device_model import cluster_profile, default_profile_label
        profile = cluster_profile(graph, cluster)
        profile_label = default_profile_label(profile, cluster)
    overheads = common.load_overheads_arg(args.overheads, cluster)
    common.print_overheads_notes(cluster, args.cluster, overheads, args.overheads)
    if overheads is not None:
        profile_label += f"; runtime overheads: {args.overheads}"
    problem = make_problem(graph, cluster, profile, max_groups=args.max_groups, global_batch_size=args.batch_size,
                           overheads=overheads)
    model = problem.graph_name
    whole = common.whole_groups_note(problem.lowerer)
    if whole:
        print(whole, file=sys.stderr)
    for strategy in files.values():
        note = graph_mismatch_note(strategy, model)
        if note:
            print(note, file=sys.stderr)
    file_rows = file_rows_for(problem, files)
    title = (f"{model} (batch {problem.global_batch_size}, {problem.num_groups} groups) on {cluster.name} "
             f"({cluster.num_devices} devices); profile: {profile_label}")
    out = args.out or f"compare_{model}_{cluster.name}"
    _check_outputs(out, args.no_plot, names, default=args.out is None)  # the default folder: before the work
    result = compare(problem, names, file_rows)
    table = format_table(result, title)
    print(table)
    os.makedirs(os.path.join(out, "strategies"), exist_ok=True)
    for r in result["rows"]:
        strategy = r.pop("_strategy", None)
        if strategy is not None and not r.get("file"):  # a file's row is that file already
            save_strategy(strategy, os.path.join(out, "strategies", f"{r['strategy']}.json"))
    atomic_write(os.path.join(out, "table.txt"), lambda f: f.write(table + "\n"))
    atomic_write(os.path.join(out, "compare.json"),
                 lambda f: json.dump(dict(result, title=title, graph=args.graph, cluster=args.cluster), f, indent=1))
    if not args.no_plot:
        plot(result, float(cluster.memory_bytes.min()), title, os.path.join(out, "compare.png"))
    print(f"wrote {out}/table.txt, compare.json{'' if args.no_plot else ', compare.png'}, strategies/")
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
