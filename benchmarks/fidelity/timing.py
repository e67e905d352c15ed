"""Timing the strategies of one model on the local cluster (bench_model): round-robin rounds
on fresh servers, each strategy warmed up, then timed for at least a time (timed_round), and the
same PlacedGraph simulated with the conditions measured before each round."""

from __future__ import annotations

import json
import os
import statistics

import numpy as np

from tfplace.profiling.overheads_probe import task_cpu_seconds, warm_up

from .cluster_setup import HETERO
from .conditions import RoundConditions
from .models import BASELINES, MAX_GROUPS, ROOT, bundle_path, random_strategy
from .record import simulate_with, typed_overheads
from .report import ms_list, round_medians

# A strategy's own warm-up (--warmup-s) is longer than the micro-benchmarks' (WARMUP_S): the slow
# stretch lasts a time, not a step count. With ResNet-50's ten strategies open on the heterogeneous
# cluster, its single-device step ran 155-164 ms for about 1.5 s after the random strategy's steps,
# then 147-151 ms. With 0.1 s (one ResNet-50 step) its single-device step came out 0.86-0.92x
# simulated, run after run; with 2 s, 0.92-0.99x in three runs.
STRATEGY_WARMUP_S = 2.0
# Timed steps per strategy and round run for at least this long (timed_round).
ROUND_S = 0.5


def timed_round(run_steps, steps: int, min_s: float) -> list:
    """Wall seconds of each step of one round: `run_steps(n)` (a list of n step times) is called
    for `steps` steps at a time until at least `min_s` seconds of steps have run. A round of 10
    steps of a tiny model lasted 4-40 ms, and one slow burst of the machine moved its median: the
    tiny transformer's single-device step had round medians 4.30, 3.45 and 3.37 ms in one run,
    its HEFT placement (the same single task) 2.74, 5.10 and 2.46 ms in another."""
    times = []
    while not times or sum(times) < min_s:
        times += run_steps(steps)
    return times


def cpu_bound_seconds(cpu_s_per_task, fractions=None) -> float:
    """The shortest step the tasks' measured CPU allows: a task that used c seconds of CPU in a
    step under a quota of f CPUs (fractions[i]; None or 1: no quota) needs at least c / f seconds
    of wall time (tfplace.simulator.core.cpu_bound_seconds, the simulator's bound, without its host
    cores: tasks that share a core would bound it further; this bound ignores that)."""
    from tfplace.simulator.core import cpu_bound_seconds as bound
    quotas = fractions if fractions is not None else [None] * len(cpu_s_per_task)
    return bound(np.asarray(cpu_s_per_task, dtype=np.float64),
                 np.array([1.0 if f is None else float(f) for f in quotas]))


def bench_model(model, lc, lc_kwargs, cluster, args, out_rows, record=None):
    """Times and simulates the strategies of one model (its conditions measured on scratch
    clusters started with `lc_kwargs`, RoundConditions): each round on a fresh LocalCluster
    started with `lc_kwargs` (--servers round), or every round on `lc` (--servers run); with
    `record` (a dict), also keeps what a later --replay needs: the profile (with its comm fit),
    the overheads, each strategy and every timed step.

    Why fresh servers each round: a server process keeps the speed it started with. The same
    strategies on two clusters started one after the other took 7.46 and 6.65 ms (the tiny CNN's
    model-parallel round robin), 12.38 and 12.75 ms (its DP all-reduce); the tiny MLP's
    model-parallel contiguous step took 2.45 and 2.91 ms in two bench runs and 2.38 ms on a
    third cluster, with no change to the model or the strategy. One cluster for a whole run puts
    every round on one draw of that spread; the profile already takes the median over fresh
    profiler processes (one per pass), and the real steps now do the same over fresh servers."""
    from tfplace.baselines import registry
    from tfplace.baselines.problem import make_problem
    from tfplace.ir.loader import load_op_graph
    from tfplace.runtime.local_cluster import LocalCluster
    from tfplace.rewrite.graph_rewrite import rewrite_step
    from tfplace.runtime.step_runner import StepRunner, random_feed
    bundle = os.path.join(ROOT, bundle_path(model))
    graph = load_op_graph(bundle)
    batch = int(graph.reference_batch_size)
    conditions = RoundConditions(lc_kwargs, cluster, args, model, bundle, batch)
    conditions.measure()  # the planners see the first pass; the simulator the median of all of them
    _, overheads, profile = conditions.settled()
    problem = make_problem(graph, cluster, profile, max_groups=MAX_GROUPS, global_batch_size=batch,
                           overheads=typed_overheads(overheads))
    plans = []
    for name in BASELINES:
        try:
            plans.append((name, registry.generate(name, problem)))
        except Exception as err:  # a planner that cannot serve this problem is skipped, reported
            print(f"  {model}/{name}: skipped ({type(err).__name__}: {str(err)[:80]})", flush=True)
    rng = np.random.default_rng(0)
    devs = list(cluster.device_names)
    k = 0
    while len(plans) < args.strategies:
        plans.append((f"random_{k}", random_strategy(rng, devs, problem.group_names, batch)))
        k += 1
    failed = set()

    def failed_with(name, err):
        failed.add(name)
        print(f"  {model}/{name}: FAILED {type(err).__name__}: {str(err)[:120]}", flush=True)

    steps = []  # (name, rewritten step): rewritten once, run on every round's servers
    for name, strategy in plans:
        try:
            steps.append((name, rewrite_step(graph, strategy, cluster, profile=profile, grouping=problem.grouping)))
        except Exception as err:
            failed_with(name, err)
    times = {name: [] for name, _ in steps}
    round_sizes = {name: [] for name, _ in steps}  # steps timed in each round
    cpu_s = {name: np.zeros(lc_kwargs["num_tasks"]) for name, _ in steps}  # servers' CPU over the timed steps

    def open_runs(servers, runs):
        """Appends (name, runner, feed) to `runs` for every step not failed, each session open
        on `servers` at once, so that a round interleaves them."""
        for name, step in steps:
            if name in failed:
                continue
            try:
                runner = StepRunner(servers, step, timeout_s=120)
                runs.append((name, runner, random_feed(step.inputs, batch, 0)))
                runner.initialize()
            except Exception as err:
                failed_with(name, err)

    def time_round(servers, runs):
        # round-robin: a slow phase of the (shared, 2-core) machine hits every strategy alike
        for name, runner, feed in runs:
            if name in failed:
                continue
            try:
                warm_up(lambda: runner.run_steps(1, feed), args.warmup, args.warmup_s)
                before = task_cpu_seconds(servers.pids)
                timed = timed_round(lambda n: runner.run_steps(n, feed), args.steps, args.round_s)
                times[name] += timed
                round_sizes[name].append(len(timed))
                cpu_s[name] += task_cpu_seconds(servers.pids) - before
            except Exception as err:
                failed_with(name, err)

    def close(runs):
        for _, runner, _ in runs:
            runner.close()
        runs.clear()

    shared = []  # the sessions on `lc` (--servers run), open for the whole run
    try:
        for r in range(args.rounds):
            if r:
                conditions.measure()
            if args.servers == "run":
                if not shared:
                    open_runs(lc, shared)
                time_round(lc, shared)
                continue
            with LocalCluster(**lc_kwargs) as fresh:
                runs = []
                try:
                    open_runs(fresh, runs)
                    time_round(fresh, runs)
                finally:
                    close(runs)
        comm, overheads, base_profile = conditions.settled()
        print("  comm fit:", json.dumps(comm["comm"]), flush=True)
        print("  runtime overheads:", json.dumps({k: v for k, v in (overheads or {}).items() if k != "raw"}),
              flush=True)
        typed = typed_overheads(overheads)
        rows = []
        strategies = dict(plans)
        if record is not None:
            record[model] = {"bundle": os.path.relpath(bundle, ROOT), "profile": base_profile.to_json(),
                             "overheads": overheads, "rows": []}
        fractions = HETERO["fractions"] if args.hetero else None
        for name, _ in steps:
            if name not in failed:
                real, fastest = statistics.median(times[name]), min(times[name])
                # the same PlacedGraph the rewrite ran, lowered with the conditions of every round
                report = simulate_with(graph, problem.grouping, cluster, strategies[name], base_profile, typed)
                sim = report.iteration_time_s
                cpu, busy = (cpu_s[name] / len(times[name])).tolist(), list(report.busy_s)
                bound = cpu_bound_seconds(cpu, fractions)
                rows.append((name, real, sim, fastest, round_medians(times[name], round_sizes[name]), cpu, busy, bound))
                if record is not None:
                    record[model]["rows"].append({"name": name, "strategy": strategies[name].to_json(),
                                                  "real_s": times[name], "round_steps": round_sizes[name], "sim_s": sim,
                                                  "task_cpu_s_per_step": cpu, "sim_busy_s": busy})
                print(f"  {model}/{name}: real {real * 1e3:.2f} ms (fastest {fastest * 1e3:.2f})  "
                      f"sim {sim * 1e3:.2f} ms; CPU/step per task {ms_list(cpu)} ms (bound "
                      f"{bound * 1e3:.2f}), sim lanes {ms_list(busy)} ms", flush=True)
    finally:
        close(shared)
    out_rows[model] = rows
    return comm, overheads
