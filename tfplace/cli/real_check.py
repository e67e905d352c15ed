"""A plan checked for real before it is written (`python -m tfplace.plan ... --confirm_real K`).

The simulator ranks strategies; what a user keeps is what runs faster on the cluster. With
--confirm_real K, plan runs its best strategy, the K baselines the simulator ranks next (those
that fit in memory, each placing the groups otherwise than the ones before: a baseline that only
spells the plan's placement differently is not timed twice) and the fastest device alone on the
cluster itself: a local cluster of loopback tasks, emulated as its file says, round by round on
fresh servers, exactly as activate runs its entries (tfplace.cli.activate.run_rounds). The
strategy whose median round ran fastest is written. When that is a baseline the plan beat in
simulation, the command says so and by how much: a plan is never recommended over a checked
baseline that runs faster for real. A lead within the rounds' spread is called a tie.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tfplace.formats.errors import TfplaceError

PLAN_NAME = "plan"


@dataclasses.dataclass
class RealCheck:
    """What the check ran and chose: `picked` as candidates() gives it (the plan first), `rows`
    activate's result rows in the same order, `chosen` the index of the one to write."""
    picked: List[Tuple[str, Any]]
    rows: List[Dict[str, Any]]
    chosen: int
    rounds: int
    steps: int
    warmup_steps: int

    @property
    def strategy(self):
        """The Strategy to write: the chosen candidate's."""
        return self.picked[self.chosen][1].strategy


ALWAYS_CHECKED = "single"  # the fastest device alone: what a split must beat, and what a simulator that
# misses runtime overheads ranks too low (a DenseNet-121 plan ran 1.9x slower than it: benchmarks/hetero_bench.md)


def candidates(best, baselines: Sequence, k: int, group_names: Sequence[str]) -> List[Tuple[str, Any]]:
    """(entry name, PoolEntry) to run for real: the plan (`best`) named PLAN_NAME, then the `k`
    baselines with the lowest simulated effective time that fit in memory and place the groups
    `group_names` (the planned grouping's) otherwise than the plan and every baseline already taken
    (tfplace.policy.pool.placement_key: a baseline that writes the plan's placement in other words
    would only time the same rewrite twice), each named by its baseline name; then ALWAYS_CHECKED
    when k > 0 and it fits and is not taken yet."""
    from tfplace.policy.pool import placement_key
    out = [(PLAN_NAME, best)]
    seen = {placement_key(best.strategy, group_names)}

    def take(e) -> None:
        key = placement_key(e.strategy, group_names)
        if not e.oom and key not in seen:
            seen.add(key)
            out.append((e.source, e))
    for e in sorted(baselines, key=lambda e: e.effective_time_s):
        if len(out) > k:
            break
        take(e)
    if k > 0:
        for e in baselines:
            if e.source == ALWAYS_CHECKED:
                take(e)
    return out


def fastest(rows: Sequence[Dict[str, Any]]) -> Optional[int]:
    """Index of the row whose median round ran fastest (its mean_s) among the rows that ran (no
    error); the first of equal ones; None when none ran."""
    from tfplace.cli.activate import ran
    done = [i for i, r in enumerate(rows) if ran(r)]
    return min(done, key=lambda i: rows[i]["mean_s"]) if done else None


def confirm(task, result, bundle: str, cluster_path: str, overheads_path: Optional[str], k: int, steps: int,
            warmup_steps: int, rounds: int, out=None) -> RealCheck:
    """Runs candidates(result.best, result.baseline_entries, k, the grouping's names) of the graph
    bundle `bundle` on the cluster of `task` (the PlacementTask planned: its grouping and profile,
    so each rewrite is the strategy the plan simulated) for `rounds` rounds of `warmup_steps` +
    `steps` steps; returns the RealCheck. Raises TfplaceError when no candidate ran."""
    from tfplace.cli import activate
    from tfplace.formats.config import ActivateConfig
    from tfplace.runtime import machine_speed
    picked = candidates(result.best, result.baseline_entries, k, task.grouping.group_names)
    config = ActivateConfig(cluster=cluster_path, strategies=(), baselines=(), graphs=(), output_dir="",
                            steps=steps, warmup_steps=warmup_steps, rounds=rounds, trace=False,
                            overheads=overheads_path)
    jobs = [{"name": name, "kind": "strategy", "strategy": e.strategy, "grouping": task.grouping,
             "graph": bundle, "profile": task.profile, "error": None} for name, e in picked]
    print(f"checking {len(jobs)} strategies for real on {cluster_path}: " + ", ".join(n for n, _ in picked),
          file=out, flush=True)
    watch = machine_speed.SpeedWatch(machine_speed.cores_of(task.cluster))
    watch.calibrate()
    rows = activate.run_rounds(jobs, task.cluster, config, task.overheads, watch, out)
    chosen = fastest(rows)
    if chosen is None:
        raise TfplaceError(f"{cluster_path}: no strategy ran for real: " +
                           "; ".join(f"{r['name']}: {r['error']}" for r in rows))
    return RealCheck(picked, rows, chosen, rounds, steps, warmup_steps)


def format_check(check: RealCheck) -> str:
    """The check as a table (simulated and real ms, their ratio, the rounds' range) and one line
    saying what was written and why."""
    from tfplace.cli.activate import ran, round_means, rounds_tie_note
    lines = [f"for real: median of {check.rounds} round(s) of {check.steps} steps after {check.warmup_steps} warm-up",
             f"  {'entry':<34} {'simulated ms':>12} {'real ms':>10} {'sim/real':>9}"]
    sims_s = [e.time_s for _, e in check.picked]
    for i, ((name, entry), sim_s, row) in enumerate(zip(check.picked, sims_s, check.rows)):
        label = f"{name} ({entry.source})" if name == PLAN_NAME else name
        mark = "  <- written" if i == check.chosen else ""
        if not ran(row):
            lines.append(f"  {label:<34} {sim_s * 1e3:12.3f}  FAILED: {str(row.get('error')).splitlines()[0][:80]}")
            continue
        means = round_means(row)
        spread = f"  rounds {min(means) * 1e3:.3f}-{max(means) * 1e3:.3f}" if len(means) > 1 else ""
        lines.append(f"  {label:<34} {sim_s * 1e3:12.3f} {row['mean_s'] * 1e3:10.3f} "
                     f"{sim_s / row['mean_s']:9.3f}{spread}{mark}")
    plan_row, best = check.rows[0], check.rows[check.chosen]
    if check.chosen == 0:
        others = [i for i, r in enumerate(check.rows) if i and ran(r)]
        if others:
            runner_up = min(others, key=lambda i: check.rows[i]["mean_s"])
            lines.append(f"the plan ran fastest for real, {check.rows[runner_up]['mean_s'] / plan_row['mean_s']:.2f}x "
                         f"faster than the next checked baseline ({check.picked[runner_up][0]})"
                         + rounds_tie_note(plan_row, check.rows[runner_up]))
        else:
            lines.append("the plan ran fastest for real (no checked baseline ran)")
    else:
        sim_gain = sims_s[check.chosen] / sims_s[0]
        real = (f"{plan_row['mean_s'] / best['mean_s']:.2f}x faster than the plan for real"
                if ran(plan_row) else "the plan failed for real")
        overlap = rounds_tie_note(best, plan_row) if ran(plan_row) else ""
        lines.append(f"written instead of the plan: {check.picked[check.chosen][0]}, {real} "
                     f"(the simulator had the plan {sim_gain:.2f}x faster){overlap}")
    return "\n".join(lines)


if __name__ == "__main__":  # plan's --confirm_real, not a command of its own
    from tfplace.cli.common import not_a_command
    not_a_command("tfplace.cli.real_check", "check a plan for real with python -m tfplace.plan ... --confirm_real K")
