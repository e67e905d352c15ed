"""What the simulator is given for one model, measured a pass at a time before each round of
timed steps (RoundConditions): the op profile (profile_path, median_profile), the comm fit and the
runtime overheads (tfplace.profiling.overheads_probe), each the median over the passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from tfplace.formats.jsonio import atomic_write
from tfplace.profiling.overheads_probe import (comm_of_passes, comm_pass, handler_threads, measure_overheads,
                                               median_overheads)

from .cluster_setup import HETERO
from .models import ROOT

# traced repeats per batch size of each model's profile, round-robin over the sizes, split over the
# profile passes (one before each round, RoundConditions): a slow phase of this machine (seconds)
# then has to cover more than half of them to move a median
PROFILE_REPEATS = 9
BUNDLED_COMM = os.path.join("graph_defs", "profiles", "local_comm_cpu.json")


def cluster_comm(lc=None, passes: int = 3) -> dict:
    """The comm fit the simulator is given, as a profile file holds it ({"comm": ..., "conditions":
    {"comm": ...}}): measured on `lc` (the cluster the steps run on, right before they are timed,
    tfplace.profiling.comm_profiler, ~5 s a pass; each latency and bandwidth the median over `passes`), or
    with lc None the bundled fit of BUNDLED_COMM (homogeneous 3-task cluster, unpinned). On the
    emulated heterogeneous cluster a 3-task all-reduce measured 1.0-1.4 ms (3-pass medians) where
    the bundled fit says 1.8 ms, a 2-task one 0.3-0.6 ms against 0.9 ms: the fit belongs to the
    cluster it was measured on. One pass alone gave 1.04-1.70 ms for the same 3-task all-reduce
    within an hour."""
    if lc is None:
        with open(os.path.join(ROOT, BUNDLED_COMM)) as f:
            data = json.load(f)
        return {"comm": data["comm"], "conditions": {"comm": data["conditions"]["comm"]}}
    return comm_of_passes([comm_pass(lc) for _ in range(passes)])


def profile_path(model: str, bundle: str, batch: int, workdir: str, hetero: bool = False, fresh: bool = True,
                 repeats: int = PROFILE_REPEATS, tag: str = "") -> str:
    """Measures the CPU profile of `bundle` at 1 intra/inter thread into workdir (without a comm
    fit: RoundConditions.settled attaches the run's to the profile the simulator reads); with
    `hetero`, one kind per emulated speed,
    each pinned like its tasks, a quota kind's ops scaled by the slowdown measured under its
    quota (profiler_cli --cpu-fraction). `fresh` measures
    anew even if workdir has it: this machine's speed drifts by phases (the tiny transformer's
    step took 1.85 ms at one hour and 2.7-3.3 ms at the next, same process setup), so a profile
    is only comparable with steps timed right after it (a few seconds per model). `repeats`:
    the profiler's --repeats; `tag` goes into the file's name (one file per pass)."""
    out = profile_file(model, workdir, hetero, tag)
    if fresh and os.path.exists(out):
        os.remove(out)
    if os.path.exists(out):
        with open(out) as f:
            if "untraced_step_wall_s" not in json.load(f).get("conditions", {}):
                os.remove(out)  # measured before the profiler removed its tracing cost: measure again
    if not os.path.exists(out):
        sizes = sorted({b for b in (1, 2, 4, 8, 16, 24, 32, 48) if b <= batch} | {batch})
        base = [sys.executable, "-m", "tfplace.profile", "--graph", bundle, "--device", "CPU",
                "--batch-sizes", ",".join(map(str, sizes)), "--threads", "1", "--inter-threads", "1",
                "--repeats", str(repeats), "--warmup", "2", "--out", out, "--quiet"]
        if not hetero:
            subprocess.run(base, check=True, cwd=ROOT)
        else:
            for i, (kind, (cpus, fraction)) in enumerate(HETERO["kinds"].items()):
                subprocess.run(base + ["--kind", kind, "--cpus", cpus, "--cpu-fraction", str(fraction),
                                       "--statistic", "median"] + (["--merge"] if i else []), check=True, cwd=ROOT)
    return out


def profile_file(model: str, workdir: str, hetero: bool, tag: str = "") -> str:
    """Where profile_path writes `model`'s profile (`tag`: one pass's file; "" the profile the
    simulator reads)."""
    return os.path.join(workdir, f"{model}_t1{'_hetero' if hetero else ''}{tag}.json")


def profile_repeats(passes: int) -> int:
    """The profiler's --repeats in each of `passes` profile passes: PROFILE_REPEATS over them all."""
    return max(1, -(-PROFILE_REPEATS // passes))


def median_profile(paths, out: str) -> str:
    """Writes to `out` the profile whose every op time (per op, kind and batch size) is the median
    over the profile files `paths` (passes of profile_path on the same graph, kinds and batch
    sizes); the rest is the first pass's, its conditions with `profile_passes` (how many) and
    `statistic_over_passes`. Returns out."""
    passes = []
    for path in paths:
        with open(path) as f:
            passes.append(json.load(f))
    first = passes[0]
    ops = {}
    for op, by_kind in first["ops"].items():
        ops[op] = {kind: {b: float(np.median([p["ops"][op][kind][b] for p in passes])) for b in by_batch}
                   for kind, by_batch in by_kind.items()}
    conditions = {**first.get("conditions", {}), "profile_passes": len(passes),
                  "statistic_over_passes": f"median of {len(passes)} passes per op, kind and batch size"}
    atomic_write(out, lambda f: json.dump({**first, "ops": ops, "conditions": conditions}, f))
    return out


def attach_comm(path: str, comm: dict) -> str:
    """Writes `comm` (cluster_comm's form) into the profile file `path` as its comm fit; returns path.
    Written atomically, as median_profile's file: a run stopped mid-write leaves the file whole, and
    a later --reuse-profiles run reads it."""
    with open(path) as f:
        prof = json.load(f)
    prof["comm"] = comm["comm"]
    prof.setdefault("conditions", {})["comm"] = comm["conditions"]["comm"]
    atomic_write(path, lambda f: json.dump(prof, f))
    return path


class RoundConditions:
    """The op profile, the comm fit and the runtime overheads of one model, measured one pass at
    a time right before each round of timed steps (profile_path with PROFILE_REPEATS spread over
    the passes, comm_pass, measure_overheads), and given to the simulator as the
    medians over the passes (median_profile, comm_of_passes, median_overheads). The machine's
    speed moves by phases of seconds to minutes, and figures measured all at once before the
    steps can come from another phase than most of them: one run measured step_s at 0.41 ms
    before the tiny MLP (0.25-0.31 ms in the four runs before), its steps then ran at the usual
    speed and were simulated at up to 1.5x. With --reuse-profiles the profile is a former run's
    (measured once if missing); with --bundled-comm the comm fit is the bundled one; with
    --no-overheads there are no overheads (None).

    The comm fit and the overheads are measured on a scratch cluster started for the pass with
    the timed cluster's settings (`lc_kwargs`: the same pinning, quotas and threads), never on
    the cluster that times the strategies, whose servers then run only the strategies, as a
    user's run only their model. In two runs with the micro-benchmarks on the timed servers the
    tiny CNN's DP all-reduce step took 13.1-13.5 ms and each task 12-14% more CPU than in a run
    without them (11.6 ms; the random strategy 16.1-17.0 against 14.5 ms). It is not the only
    cause of such a spread: with the scratch cluster, one run still timed that step at 13.0 ms,
    another at 11.5 ms (benchmarks/fidelity_bench_hetero.md).

    model, bundle, batch: the graph profiled (profile_path); lc_kwargs: the timed servers'
    LocalCluster settings (their inter-op threads go into the overheads)."""

    def __init__(self, lc_kwargs, cluster, args, model: str, bundle: str, batch: int):
        self.lc_kwargs, self.cluster, self.args = lc_kwargs, cluster, args
        self.model, self.bundle, self.batch = model, bundle, batch
        self.comm_runs, self.overhead_runs, self.profile_runs = [], [], []

    def measure(self) -> None:
        """One more pass of each (the first also measures the overheads' `raw` figures)."""
        args = self.args
        if not (args.reuse_profiles and self.profile_runs):
            tag = "" if args.reuse_profiles else f"_pass{len(self.profile_runs)}"
            self.profile_runs.append(profile_path(self.model, self.bundle, self.batch, args.workdir, args.hetero,
                                                  fresh=not args.reuse_profiles, repeats=profile_repeats(args.rounds),
                                                  tag=tag))
        if args.bundled_comm and args.no_overheads:
            return
        from tfplace.runtime.local_cluster import LocalCluster
        with LocalCluster(**self.lc_kwargs) as scratch:
            this_comm = None
            if not args.bundled_comm:
                self.comm_runs.append(comm_pass(scratch))
                this_comm = comm_of_passes(self.comm_runs[-1:])
            if not args.no_overheads:
                self.overhead_runs.append(measure_overheads(scratch, self.cluster, (this_comm or self.comm())["comm"],
                                                            raw=not self.overhead_runs))

    def comm(self) -> dict:
        return cluster_comm() if self.args.bundled_comm else comm_of_passes(self.comm_runs)

    def overheads(self):
        if self.args.no_overheads:
            return None
        out = median_overheads(self.overhead_runs)
        out["inter_op_threads"] = handler_threads(self.lc_kwargs["inter_threads_per_task"])
        return out

    def settled(self):
        """(comm fit, overheads, the base Profile the simulator reads) over the passes so far:
        the profile file is the passes' medians (median_profile) with that comm fit attached."""
        from tfplace.formats.profile import load_profile
        comm = self.comm()
        out = profile_file(self.model, self.args.workdir, self.args.hetero)
        if self.profile_runs != [out]:
            median_profile(self.profile_runs, out)
        return comm, self.overheads(), load_profile(attach_comm(out, comm))
