"""What the bench reports: the error statistics (summary, round spread), the conditions table
and the markdown page a run writes to --out."""

from __future__ import annotations

import statistics

import numpy as np

from tfplace.profiling.overheads_probe import COLLECTIVE_CPU_BYTES, COMM_MAX_BYTES

from .conditions import BUNDLED_COMM, profile_repeats


def ms_list(seconds) -> str:
    """'1.20/3.40/0.05': seconds as milliseconds joined by '/'."""
    return "/".join(f"{x * 1e3:.2f}" for x in seconds)


def summary(rows, column: int = 1):
    """(median, worst |sim - real| / real, Kendall tau) with real = rows[k][column] (1: the
    median step, 3: the fastest)."""
    from scipy.stats import kendalltau
    real = np.array([r[column] for r in rows])
    sim = np.array([r[2] for r in rows])
    err = np.abs(sim - real) / real
    tau = kendalltau(real, sim).statistic if len(rows) > 1 else float("nan")
    return float(np.median(err)), float(np.max(err)), float(tau)


def round_medians(steps_s, round_steps) -> list:
    """The median step of each round-robin round: `steps_s` in the order they ran, `round_steps`
    how many of them each round timed (in order; they add up to len(steps_s))."""
    ends = np.cumsum(round_steps)
    return [statistics.median(steps_s[end - n:end]) for n, end in zip(round_steps, ends)]


def round_spread(rows) -> float:
    """Median over strategies and rounds of |round median - real| / real (rows[k][4]: the round
    medians, rows[k][1]: real). Recorded runs of the heterogeneous cluster: 4-7% (90th percentile
    10-32%), and the same strategy's real step differed by a median 8-16% from one run to the next."""
    return float(np.median([abs(r - row[1]) / row[1] for row in rows for r in row[4]]))


def conditions_table(conditions) -> list:
    """Markdown lines: per model, the comm fit and the main overheads it was simulated with (µs)."""
    def us(x):
        return f"{x * 1e6:.0f}"

    def pairs(d):
        return ", ".join(f"{k.replace('|', '-')} {us(v)}" for k, v in sorted(d.items()))  # "|" would split the cell

    def curve(d):  # the largest group's all-reduce CPU per participant at each measured size
        if not d:
            return "-"
        c = d[max(d, key=int)]
        by_kind = c.get("seconds_by_kind") or {}  # older records have the mean only
        return "; ".join(f"{label} " * bool(by_kind) + " / ".join(us(v) for v in values)
                         for label, values in [("mean", c["seconds"]), *sorted(by_kind.items())])

    def feed(o):  # older records have no feed costs
        if "feed_input_s" not in o:
            return "-"
        return f"{us(o['feed_input_s'])} / {o['feed_s_per_byte'] * 1e9:.2f}"
    def shares(d):  # each end's share of a message between two kinds; older records have none
        return "".join(f"; {pair.replace('|', '-')}: " + ", ".join(f"{k} {v:.0%}" for k, v in sorted(ends.items()))
                       for pair, ends in sorted((d or {}).items()))

    def per_group(d):  # older records have no collective_s
        return " / ".join(us(d[g]) for g in sorted(d, key=int)) if d else "-"
    lines = ["| model | p2p fit latency | all-reduce fit latency (x2 / x3) | collective_s (x2 / x3) | step_s | "
             "feed_input_s / feed_s_per_byte (ns) | "
             "worker_s | transfer_s | message_cpu_s (its ends' shares) | "
             "collective_cpu_s per participant of an all-task all-reduce, mean and per kind (" +
             " / ".join(f"{b} B" for b in COLLECTIVE_CPU_BYTES) + ") |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for model, (comm, over) in conditions.items():
        c = comm["comm"]
        ar = " / ".join(us(c["allreduce"][g]["latency_s"]) for g in sorted(c["allreduce"], key=int))
        o = over or {}
        lines.append(f"| {model} | {us(c['p2p']['latency_s'])} | {ar} | {per_group(o.get('collective_s'))} | "
                     f"{us(o['step_s']) if o else '-'} | {feed(o)} | "
                     f"{us(o['worker_s']) if o else '-'} | {pairs(o.get('transfer_s', {}))} | "
                     f"{pairs(o.get('message_cpu_s', {}))}{shares(o.get('message_cpu_share'))} | "
                     f"{curve(o.get('collective_cpu_s'))} |")
    return lines


def markdown(args, argv, results, conditions, elapsed_s: float) -> str:
    """The page a run writes to --out: the command, how it ran (`args`, the parsed flags; `argv`,
    the command line's arguments), the conditions table, the summary per model and every strategy's row.
    results: model -> bench_model's rows; conditions: model -> (comm fit, overheads)."""
    lines = ["# Simulator fidelity on the local CPU cluster", "",
             "Command: `.venv/bin/python benchmarks/fidelity_bench.py " + " ".join(argv) + "`", "",
             (f"3 TF server tasks on 127.0.0.1 (clusters/local_cpu_hetero.json), 1 intra-op + "
              f"{args.inter_threads} inter-op thread(s) each; task 0 alone on core 0 (kind CPU), tasks 1 and 2 on "
              "core 1 with a 0.5 CPU quota each (kind CPU_half); the client on core 1. Profiles: "
              f"`python -m tfplace.profile --threads 1 --inter-threads 1 --repeats {profile_repeats(args.rounds)} "
              "--statistic median` "
              "per kind, pinned like "
              "its tasks, CPU_half with `--cpu-fraction 0.5` (its ops timed unlimited, times the slowdown a "
              "compute loop measures under the quota), a pass before each round, each op's median over the "
              "passes. " if args.hetero else
              f"3 TF server tasks on 127.0.0.1 (clusters/local_cpu.json), 1 intra-op + {args.inter_threads} "
              "inter-op thread(s) each, homogeneous, unpinned. Profile: "
              f"`python -m tfplace.profile --threads 1 --inter-threads 1 --repeats {profile_repeats(args.rounds)}` "
              "per model, a pass before each round, each op's median over the passes. ") +
             ("Comm fit: the bundled " + BUNDLED_COMM + ". " if args.bundled_comm else
              "Comm fit: measured on a scratch cluster with the run's settings, a pass before each round "
              "(tfplace.profiling.comm_profiler, "
              f"up to {COMM_MAX_BYTES >> 20} MiB). ") +
             f"Real = median of {args.rounds} round-robin rounds x {args.steps} timed steps, or more until "
             f"{args.round_s:g} s of steps ran (after at least {args.warmup} warm-up "
             f"steps and {args.warmup_s:g} s each), " +
             ("each round on fresh server processes" if args.servers == "round"
              else "every round on one set of servers") +
             f". ({elapsed_s:.0f} s)", "",
             "Runtime overheads in the model (profile conditions `runtime_overheads`): " +
             ("none (--no-overheads)" if args.no_overheads else "measured by micro-benchmarks right before each "
              "round of timed steps, on that scratch cluster too (median of the --rounds passes; all of them "
              "in the --record file)"), "",
             *conditions_table(conditions), "",
             "Real = the median step (what a user sees); also against the fastest step (the undisturbed "
             "step, the statistic the profiles keep: on this shared 2-core machine identical graphs in "
             "different sessions have shown medians 3.97-5.85 ms and fastest steps 3.07-3.43 ms).", "",
             "Real's own spread = the median over strategies and rounds of |round's median step - real| / "
             "real: how far a perfect simulator would still be from one round (the noise floor of this "
             "machine for the median error).", "",
             "| model | strategies | median err | worst err | Kendall tau | real's own spread | median err "
             "(fastest) | worst err (fastest) | Kendall tau (fastest) |", "|---|---|---|---|---|---|---|---|---|"]
    for model, rows in results.items():
        if rows:
            med, worst, tau = summary(rows)
            fmed, fworst, ftau = summary(rows, 3)
            lines.append(f"| {model} | {len(rows)} | {med:.1%} | {worst:.1%} | {tau:.2f} | {round_spread(rows):.1%} | "
                         f"{fmed:.1%} | {fworst:.1%} | {ftau:.2f} |")
    lines += ["", "Task CPU = each server's CPU time per timed step, tasks 0/1/2 (/proc schedstat); CPU bound = "
              "the shortest step that CPU allows under the tasks' quotas (cpu_bound_seconds); sim lanes = the "
              "simulated busy time of each device's compute lane (SimReport.busy_s).", "",
              "| model | strategy | real ms (median) | real ms (fastest) | sim ms | sim/real | sim/fastest | "
              "task CPU ms | CPU bound ms | sim lanes ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for model, rows in results.items():
        for name, real, sim, fastest, _, cpu, busy, bound in rows:
            lines.append(f"| {model} | {name} | {real * 1e3:.2f} | {fastest * 1e3:.2f} | {sim * 1e3:.2f} | "
                         f"{sim / real:.2f} | {sim / fastest:.2f} | {ms_list(cpu)} | {bound * 1e3:.2f} | "
                         f"{ms_list(busy)} |")
    text = "\n".join(lines) + "\n"
    return text
