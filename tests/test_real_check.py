"""`python -m tfplace.plan --confirm_real K`: the plan, the K next baselines and the fastest device
alone run for real, and the fastest for real is written (tfplace.cli.real_check)."""

import dataclasses
import io
import os
import re
import subprocess
import sys

import pytest

from tfplace.cli import real_check
from tfplace.formats.errors import TfplaceError
from tfplace.formats.strategy import load_strategy
from tfplace.policy.pool import placement_key, strategy_key

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def planned():
    """A search-only plan of the tiny CNN on the four-device fake cluster (no policy, no search
    time: the pool's best of every baseline and the two action starts)."""
    from tfplace.policy import planner
    from tfplace.policy.testing_fixtures import tiny_task
    task = tiny_task("cnn", "four", batch_size=16)
    return task, planner.plan_task(None, task, 0.0, mode="search")


@pytest.mark.parametrize("k", [0, 1, 2, 3, 100])
def test_candidates_are_the_plan_then_the_k_fastest_distinct_baselines_that_fit(planned, k):
    task, result = planned
    names = task.grouping.group_names
    picked = real_check.candidates(result.best, result.baseline_entries, k, names)
    assert picked[0] == (real_check.PLAN_NAME, result.best)
    assert [n for n, _ in picked[1:]] == [e.source for _, e in picked[1:]]
    keys = [placement_key(e.strategy, names) for _, e in picked]
    assert len(set(keys)) == len(keys)  # every candidate places the groups otherwise
    single = next(e for e in result.baseline_entries if e.source == "single")
    distinct = {placement_key(e.strategy, names) for e in result.baseline_entries if not e.oom} - {keys[0]}
    ranked = [e for _, e in picked[1:1 + min(k, len(distinct))]]
    assert all(not e.oom for e in ranked)
    assert [e.effective_time_s for e in ranked] == sorted(e.effective_time_s for e in ranked)
    # no distinct baseline left out was faster than one of the k taken
    left = [e for e in result.baseline_entries if not e.oom and placement_key(e.strategy, names) not in keys]
    if ranked and left:
        assert min(e.effective_time_s for e in left) >= ranked[-1].effective_time_s
    # and the fastest device alone is checked too, whatever its rank, unless it is the plan
    wanted = k > 0 and not single.oom and placement_key(single.strategy, names) != keys[0]
    extra = [e for _, e in picked[1 + len(ranked):]]
    assert extra == ([single] if wanted and single not in ranked else [])
    assert (("single", single) in picked) == wanted


def test_the_fastest_device_alone_is_checked_even_when_the_simulator_ranks_it_last(planned):
    import dataclasses
    task, result = planned
    names = task.grouping.group_names
    ranked_last = [dataclasses.replace(e, effective_time_s=1e9) if e.source == "single" else e
                   for e in result.baseline_entries]
    picked = real_check.candidates(result.best, ranked_last, 1, names)
    assert len(picked) == 3 and picked[-1][0] == "single"
    assert real_check.candidates(result.best, ranked_last, 0, names) == [(real_check.PLAN_NAME, result.best)]


def test_a_plan_that_is_a_baseline_is_not_run_twice(planned):
    task, result = planned
    base = sorted(result.baseline_entries, key=lambda e: e.effective_time_s)[1]
    picked = real_check.candidates(base, result.baseline_entries, 100, task.grouping.group_names)
    assert [strategy_key(e.strategy) for _, e in picked].count(strategy_key(base.strategy)) == 1


def _spelled_per_group(entry, names, source):
    """`entry` with its strategy written as one decision per group (no default), as a planner that
    decides group by group writes the same placement."""
    import dataclasses
    s = entry.strategy
    spelled = dataclasses.replace(s, default=None, groups={g: s.decision_for(g) for g in names})
    return dataclasses.replace(entry, source=source, strategy=spelled)


def test_a_baseline_placing_every_group_as_the_plan_does_is_not_checked(planned):
    """A baseline whose file differs from the plan's (per-group decisions instead of a default) but
    whose rewrite is the same is not run again: timing one rewrite twice and calling the faster a
    gain would be noise. Its place goes to the next baseline that places the groups otherwise."""
    import dataclasses
    task, result = planned
    names = task.grouping.group_names
    plan = next(e for e in result.baseline_entries if e.source == "single")  # one default decision
    assert plan.strategy.default is not None and not plan.strategy.groups
    twin = _spelled_per_group(plan, names, "twin")
    twin = dataclasses.replace(twin, effective_time_s=-1.0)  # ranked first
    assert strategy_key(twin.strategy) != strategy_key(plan.strategy)  # the files differ
    picked = real_check.candidates(plan, [twin] + list(result.baseline_entries), 1, names)
    assert "twin" not in [n for n, _ in picked] and len(picked) == 2
    assert picked[1][1] is real_check.candidates(plan, result.baseline_entries, 1, names)[1][1]


@pytest.mark.parametrize("change, same", [
    (lambda d: d, True),
    (lambda d: dataclasses.replace(d, priority=0) if d.priority is None else d, True),  # None runs as 0
    (lambda d: dataclasses.replace(d, priority=(d.priority or 0) + 1), False),
    (lambda d: dataclasses.replace(d, sync="ps", ps_device=d.shares[0][0]), False),
])
def test_placement_key_tells_placements_apart_not_spellings(planned, change, same):
    task, result = planned
    names = task.grouping.group_names
    base = result.best.strategy
    first = names[0]
    other = dataclasses.replace(base, default=None,
                                groups={g: (change(base.decision_for(g)) if g == first else base.decision_for(g))
                                        for g in names})
    assert (placement_key(other, names) == placement_key(base, names)) == same


def test_placement_key_reads_device_order_bucket_size_and_sync_only_where_they_change_the_rewrite():
    from tfplace.formats.strategy import Strategy, decision
    names = ("a", "b")
    alone = Strategy(16, 2, decision({"cpu0": 16}), {})
    spelled = Strategy(16, 2, None, {"a": decision({"cpu0": 16}), "b": decision({"cpu0": [8, 8]})},
                       bucket_bytes=1024)
    assert placement_key(Strategy(16, 2, None, {"a": decision({"cpu0": 16}), "b": decision({"cpu0": 16})},
                                  bucket_bytes=1024), names) == placement_key(alone, names)
    assert placement_key(spelled, names) != placement_key(alone, names)  # two micro-batches are another rewrite
    split = Strategy(16, 2, decision({"cpu0": 8, "cpu1": 8}), {})
    assert placement_key(Strategy(16, 2, decision({"cpu1": 8, "cpu0": 8}), {}), names) == placement_key(split, names)
    assert placement_key(Strategy(16, 2, decision({"cpu0": 10, "cpu1": 6}), {}), names) != placement_key(split, names)
    assert placement_key(dataclasses.replace(split, bucket_bytes=1024), names) != placement_key(split, names)
    served = Strategy(16, 2, decision({"cpu0": 8, "cpu1": 8}, "ps", "cpu2"), {})  # PS gradients are bucketed too
    assert placement_key(dataclasses.replace(served, bucket_bytes=1024), names) != placement_key(served, names)
    assert placement_key(served, names) != placement_key(split, names)
    # one device: all-reduce or nothing to reduce is one placement; a PS on another device is not
    assert placement_key(Strategy(16, 2, decision({"cpu0": 16}, "allreduce"), {}), names) == placement_key(alone, names)
    assert placement_key(Strategy(16, 2, decision({"cpu0": 16}, "ps", "cpu1"), {}), names) != placement_key(alone, names)


def _row(mean_ms=None, error=None, spread_ms=0.0):
    if error is not None:
        return {"name": "x", "error": error, "rounds": []}
    rounds = [mean_ms - spread_ms, mean_ms, mean_ms + spread_ms]
    return {"name": "x", "error": None, "rounds": [{}] * 3, "mean_s": mean_ms / 1e3,
            "round_means_s": [m / 1e3 for m in rounds]}


@pytest.mark.parametrize("real_ms, chosen", [
    ([5.0, 4.0, 6.0], 1),            # a baseline the plan beat in simulation runs faster: it is written
    ([3.0, 4.0, 6.0], 0),            # the plan runs fastest
    ([4.0, 4.0, 6.0], 0),            # a tie keeps the plan
    (["boom", 7.0, 6.0], 2),         # the plan failed for real
    ([5.0, "oom", 4.5], 2),
    (["a", "b", "c"], None),         # nothing ran: an error, nothing written
])
def test_the_fastest_strategy_for_real_is_chosen(planned, monkeypatch, real_ms, chosen):
    """confirm() with the real runs faked (activate.run_rounds): the strategy it returns is the
    one whose median round ran fastest, whatever the simulator said."""
    from tfplace.cli import activate
    from tfplace.runtime import machine_speed
    task, result = planned
    rows = [_row(error=v) if isinstance(v, str) else _row(v) for v in real_ms]
    seen = {}

    def fake_rounds(jobs, cluster, config, overheads, watch, out, after_entry=None):
        seen["jobs"], seen["config"] = jobs, config
        return rows
    monkeypatch.setattr(activate, "run_rounds", fake_rounds)
    monkeypatch.setattr(machine_speed.SpeedWatch, "calibrate", lambda self, probes=3: None)
    args = (task, result, "bundle.json", "c.json", None, 2, 7, 3, 2)
    if chosen is None:
        with pytest.raises(TfplaceError, match="no strategy ran for real"):
            real_check.confirm(*args, out=io.StringIO())
        return
    check = real_check.confirm(*args, out=io.StringIO())
    picked = real_check.candidates(result.best, result.baseline_entries, 2, task.grouping.group_names)
    assert check.chosen == chosen and check.strategy is picked[chosen][1].strategy
    assert [j["name"] for j in seen["jobs"]] == [n for n, _ in picked]
    assert all(j["grouping"] is task.grouping and j["graph"] == "bundle.json" for j in seen["jobs"])
    assert (seen["config"].steps, seen["config"].warmup_steps, seen["config"].rounds) == (7, 3, 2)
    text = real_check.format_check(check)
    assert text.count("<- written") == 1
    if chosen:
        assert f"written instead of the plan: {picked[chosen][0]}" in text
    else:
        assert "the plan ran fastest for real" in text
    # no spread between rounds: rounds overlap only where two medians are equal
    assert ("they tie" in text) == (real_ms[0] == real_ms[1]), text


@pytest.mark.parametrize("spread_ms, tie", [(0.2, False), (0.6, True)])
def test_a_baseline_whose_rounds_overlap_the_plans_is_called_a_tie(planned, spread_ms, tie):
    task, result = planned
    picked = real_check.candidates(result.best, result.baseline_entries, 1, task.grouping.group_names)
    rows = [_row(5.0, spread_ms=spread_ms), _row(4.0, spread_ms=spread_ms)]  # plan 5 ms, baseline 4 ms median
    text = real_check.format_check(real_check.RealCheck(picked, rows, real_check.fastest(rows), 3, 20, 20))
    assert f"written instead of the plan: {picked[1][0]}, 1.25x faster" in text
    assert ("they tie" in text) == tie, text


@pytest.mark.parametrize("spread_ms, tie", [(0.2, False), (0.6, True)])
def test_a_plan_whose_lead_is_within_the_rounds_spread_is_called_a_tie(planned, spread_ms, tie):
    """The plan ran fastest by a median 1.25x over the one baseline checked: the line names that
    baseline, and says they tie when a round of the baseline ran as fast as a round of the plan."""
    task, result = planned
    picked = real_check.candidates(result.best, result.baseline_entries, 1, task.grouping.group_names)
    rows = [_row(4.0, spread_ms=spread_ms), _row(5.0, spread_ms=spread_ms)]
    text = real_check.format_check(real_check.RealCheck(picked, rows, real_check.fastest(rows), 3, 20, 20))
    assert f"the plan ran fastest for real, 1.25x faster than the next checked baseline ({picked[1][0]})" in text
    assert ("they tie" in text) == tie, text


@pytest.mark.multiprocess
def test_plan_command_checks_for_real_and_writes_the_fastest(tmp_path):
    """End to end on the local 3-task cluster: the plan, two baselines (and the fastest device
    alone, unless it is one of them) run on real servers, the table marks one row written, it is
    the fastest for real, and the file holds a strategy."""
    out = str(tmp_path / "s.json")
    result = subprocess.run([sys.executable, "-m", "tfplace.plan", "--model", "tiny_mlp", "--batch_size", "12",
                             "--cluster", os.path.join(REPO, "clusters/local_cpu.json"), "--out", out,
                             "--confirm_real", "2", "--confirm_rounds", "1", "--confirm_steps", "3"],
                            capture_output=True, text=True, timeout=600, cwd=str(tmp_path),
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = re.findall(r"^  (\S+)(?: \([^)]*\))? +([\d.]+) +([\d.]+) +[\d.]+(?:  rounds \S+)?(  <- written)?$",
                      result.stdout, re.M)
    checked = int(re.search(r"checking (\d+) strategies for real", result.stdout).group(1))
    assert checked in (3, 4) and len(rows) == checked, result.stdout  # plan, 2 ranked next, maybe `single`
    real_ms = [float(r[2]) for r in rows]
    written = [i for i, r in enumerate(rows) if r[3]]
    assert len(written) == 1 and real_ms[written[0]] == min(real_ms), result.stdout
    assert f"strategy written to {out}" in result.stdout
    s = load_strategy(out)
    assert s.global_batch_size == 12
    if written[0] == 0:
        assert "the plan ran fastest for real" in result.stdout
    else:
        assert f"written instead of the plan: {rows[written[0]][0]}" in result.stdout


def test_plan_command_refuses_a_cluster_it_cannot_run_before_planning(tmp_path):
    out = str(tmp_path / "s.json")
    result = subprocess.run([sys.executable, "-m", "tfplace.plan", "--model", "tiny_mlp", "--batch_size", "12",
                             "--cluster", os.path.join(REPO, "clusters/two_kind_4gpu.json"), "--out", out,
                             "--confirm_real", "1"],
                            capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "two_kind_4gpu.json: hosts[0].address" in last and "loopback" in last and "Fix:" in last
    assert "zero-shot" not in result.stdout and not os.path.exists(out)
