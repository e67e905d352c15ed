"""Simulator fidelity on the local CPU cluster.

    .venv/bin/python benchmarks/fidelity_bench.py [--models tiny_mlp,tiny_cnn,tiny_transformer,resnet50]
        [--strategies 10] [--steps 10] [--warmup 2] [--warmup-s 2] [--rounds 3] [--round-s 0.5] [--hetero]
        [--no-overheads] [--out benchmarks/fidelity_bench.md] [--record run.json]
    .venv/bin/python benchmarks/fidelity_bench.py --replay run1.json run2.json ...

For each model: a CPU profile measured under the workers' thread setting (intra 1, inter 1;
`python -m tfplace.profile --threads 1`, Grappler off like the runtime), with a comm fit
(cluster_comm; --bundled-comm: graph_defs/profiles/local_comm_cpu.json) and runtime overheads,
both measured a pass before each round of timed steps on a scratch cluster with the run's
settings (RoundConditions: the simulator gets their medians); strategies = the registry baselines
(make_problem + registry.generate, as compare uses them) plus random valid strategies up to
--strategies; for each, the real iteration time (StepRunner.run_steps: warm-up, then the median
of timed steps) on a LocalCluster of 3 tasks (clusters/local_cpu.json) and the simulated time of the
same PlacedGraph. Every strategy's session stays open and --rounds round-robin passes time
--steps steps of each (real = the median of all of them), so a slow phase of the machine hits
every strategy alike. Prints per model median / worst |sim - real| / real and Kendall tau, with
real = the median step and with real = the fastest step, and the table, which also has each
task's CPU per timed step (task_cpu_seconds), the shortest step that CPU allows under the tasks'
quotas (cpu_bound_seconds) and the simulator's lane busy time per device; writes it (with the
command) to --out.

Default: homogeneous, every task with 1 intra-op thread, unpinned (3 tasks share 2 cores).
--hetero: the emulated heterogeneous cluster clusters/local_cpu_hetero.json (task 0 alone on
core 0; tasks 1 and 2 on core 1 with a 0.5 CPU quota each, tfplace.emulation.cpu_quota; needs root; the
client, this process, on core 1 too), with one profile kind per speed measured under the same
pinning and quota. Profiles are measured anew, a pass before each round of timed steps like the
comm fit and the overheads (--reuse-profiles keeps those of a former run).

This file is the command line; the bench lives in benchmarks/fidelity/ (one module per role, see
its __init__), and the runtime overheads are measured by the library behind `python -m
tfplace.cli.overheads` (tfplace.profiling.overheads_probe).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

from tfplace.formats.errors import InputError

from fidelity.cluster_setup import HETERO, local_cluster_setup
from fidelity.conditions import (BUNDLED_COMM, PROFILE_REPEATS, RoundConditions, attach_comm, cluster_comm,
                                 median_profile, profile_file, profile_path, profile_repeats)
from fidelity.models import BASELINES, MAX_GROUPS, MODELS, ROOT, bundle_path, random_strategy
from fidelity.record import RECORD_FORMAT, replay, simulate_with, typed_overheads
from fidelity.report import conditions_table, markdown, ms_list, round_medians, round_spread, summary
from fidelity.timing import ROUND_S, STRATEGY_WARMUP_S, bench_model, cpu_bound_seconds, timed_round

# the bench's names, for the probes and tests that import this module as `fidelity_bench`; the
# micro-benchmarks themselves live in tfplace.profiling.overheads_probe
__all__ = ["BASELINES", "BUNDLED_COMM", "HETERO", "MAX_GROUPS", "MODELS", "PROFILE_REPEATS", "RECORD_FORMAT",
           "ROOT", "ROUND_S", "STRATEGY_WARMUP_S", "RoundConditions", "attach_comm", "bench_model", "bundle_path",
           "cluster_comm", "conditions_table", "cpu_bound_seconds", "local_cluster_setup", "main", "markdown",
           "parser",
           "median_profile", "ms_list", "profile_file", "profile_path", "profile_repeats", "random_strategy",
           "replay", "round_medians", "round_spread", "simulate_with", "summary", "timed_round", "typed_overheads"]


def parser() -> argparse.ArgumentParser:
    """The bench's flags (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny_mlp,tiny_cnn,tiny_transformer,resnet50")
    p.add_argument("--strategies", type=int, default=10)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per strategy and round (at least)")
    p.add_argument("--warmup-s", type=float, default=STRATEGY_WARMUP_S,
                   help="untimed steps run at least this long too (seconds)")
    p.add_argument("--rounds", type=int, default=3,
                   help="round-robin passes over the strategies (timed_round each), a pass of the conditions "
                        "before each")
    p.add_argument("--servers", choices=("round", "run"), default="round",
                   help="time each round on fresh server processes (round: the median spans several "
                        "processes' speeds) or every round on one set started for the run (run)")
    p.add_argument("--round-s", type=float, default=ROUND_S,
                   help="each round times --steps steps at a time until at least this many seconds of steps ran")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "tfplace_fidelity"),
                   help="folder of the measured profiles; one run at a time (a second run there stops at once)")
    p.add_argument("--reuse-profiles", action="store_true",
                   help="use the profiles a former run left in --workdir instead of measuring them again "
                        "a pass before each round (quicker; the machine's speed may have drifted since)")
    p.add_argument("--bundled-comm", action="store_true",
                   help=f"give the simulator the bundled comm fit ({BUNDLED_COMM}) instead of one measured "
                        "on the run's cluster a pass before each round")
    p.add_argument("--no-overheads", action="store_true",
                   help="simulate without the measured runtime overheads (the profile alone)")
    p.add_argument("--inter-threads", type=int, default=1,
                   help="inter-op threads per TF server task (default 1; see local_cluster_setup)")
    p.add_argument("--hetero", action="store_true",
                   help="emulated heterogeneous cluster: tasks 1, 2 at half a core each (CPU quota; needs root)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "fidelity_bench.md"))
    p.add_argument("--record", default="", help="also write the run (profiles, strategies, every timed step, "
                   "overheads) to this JSON file, for --replay")
    p.add_argument("--verbose", action="store_true", help="with --replay: each strategy's sim / real too")
    p.add_argument("--replay", nargs="+", default=None, metavar="RECORD",
                   help="re-simulate recorded runs with the current simulator (times nothing)")
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    for name in ("strategies", "steps", "rounds", "inter_threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.round_s < 0:
        p.error(f"--round-s must be >= 0 seconds, got {args.round_s}")
    if args.replay:
        return replay(args.replay, args.verbose)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.makedirs(args.workdir, exist_ok=True)
    from tfplace.cli.common import OutputLock
    with contextlib.ExitStack() as stack:
        # One run per workdir (the default is one folder for every run on the machine): a second run
        # there removed the profiles the first had measured (each pass starts afresh) and wrote its
        # own under the same names, so the first simulated with the other run's profiles.
        try:
            stack.enter_context(OutputLock(args.workdir, "argument --workdir"))
        except InputError as err:
            p.error(str(err))
        return _run(args, argv)


def _run(args, argv) -> int:
    """The bench's timed run (main, with --workdir locked)."""
    from tfplace.runtime.local_cluster import LocalCluster
    cluster, lc_kwargs = local_cluster_setup(args.hetero, args.inter_threads)
    results, record = {}, ({} if args.record else None)
    t0 = time.time()
    conditions = {}  # model -> (comm, overheads)
    with (LocalCluster(**lc_kwargs) if args.servers == "run" else contextlib.nullcontext()) as lc:
        for model in args.models.split(","):
            print(f"{model}:", flush=True)
            conditions[model] = bench_model(model, lc, lc_kwargs, cluster, args, results, record)
    text = markdown(args, argv or sys.argv[1:], results, conditions, time.time() - t0)
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    if record is not None:
        from tfplace.formats.jsonio import write_json
        write_json(args.record, {"format": RECORD_FORMAT, "version": 1, "cluster": HETERO["cluster"] if args.hetero
                                 else "local_cpu.json", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                 "models": record})
        print(f"wrote {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
