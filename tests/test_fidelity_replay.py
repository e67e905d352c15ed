"""benchmarks/fidelity_bench.py --replay: recorded runs re-simulated with the current simulator
(no cluster, no TensorFlow session): the same strategies, profile and overheads give the same
simulated times, and the error is taken against the recorded real steps. Also the bench's own
helpers (benchmarks/fidelity/): rounds, reports, conditions; the micro-benchmarks behind the
runtime overheads are tested in tests/test_overheads_probe.py."""

import json
import os

import pytest

from tfplace.formats.cluster import load_cluster
from tfplace.ir.loader import load_op_graph
from tfplace.formats.jsonio import write_json
from tfplace.formats.strategy import even_strategy
from tfplace.testing import uniform_profile

import fidelity_bench as fb
from fidelity import cluster_setup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("ratio, expected, overheads_in", [
    (1.0, 0.0, "model"), (1.25, 0.2, "model"), (0.8, 0.25, "model"),
    (1.25, 0.2, "run"),  # records from before the overheads were measured per model
])
def test_replay_compares_recorded_real_steps_with_the_simulator(tmp_path, capsys, ratio, expected, overheads_in):
    # real = sim * ratio for every strategy: |sim - real| / real = |1 - ratio| / ratio; the
    # simulated times only match if the replay finds the overheads where the record keeps them
    from tfplace.baselines.problem import make_problem
    bundle = "graph_defs/zoo/tiny_mlp_b16_sgd.json"  # committed
    graph = load_op_graph(os.path.join(ROOT, bundle))
    batch = int(graph.reference_batch_size)
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    profile = uniform_profile(graph, ["CPU"], 1e-5)
    overheads = {"step_s": 5e-4, "message_cpu_s": {"CPU|CPU": 1e-4}, "transfer_gap_s": 5e-5}
    typed = fb.typed_overheads(overheads)
    grouping = make_problem(graph, cluster, profile, max_groups=fb.MAX_GROUPS, global_batch_size=batch).grouping
    devs = list(cluster.device_names)
    rows = []
    for name, st in (("even", even_strategy(devs, batch, fb.MAX_GROUPS)),
                     ("even_ps", even_strategy(devs, batch, fb.MAX_GROUPS, "ps", devs[1])),
                     ("single", even_strategy(devs[:1], batch, fb.MAX_GROUPS))):
        sim = fb.simulate_with(graph, grouping, cluster, st, profile, typed).iteration_time_s
        rows.append({"name": name, "strategy": st.to_json(), "real_s": [sim * ratio] * 3, "sim_s": sim})
    path = tmp_path / "run.json"
    model = {"bundle": bundle, "profile": profile.to_json(), "rows": rows}
    run = {"format": fb.RECORD_FORMAT, "version": 1, "cluster": "local_cpu.json", "date": "test",
           "models": {"tiny_mlp": model}}
    (model if overheads_in == "model" else run)["overheads"] = overheads
    write_json(path, run)
    assert fb.main(["--replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"median {expected:.1%} (recorded {expected:.1%})" in out, out


def test_replay_rejects_a_file_of_another_format(tmp_path):
    from tfplace.formats.errors import InputError
    path = tmp_path / "run.json"
    write_json(path, {"format": "tfplace.strategy", "version": 1})
    with pytest.raises(InputError):
        fb.replay([str(path)])


@pytest.mark.parametrize("steps, round_steps, medians", [
    ([1.0, 2.0, 3.0, 10.0, 20.0, 30.0], [3, 3], [2.0, 20.0]),
    ([4.0, 1.0, 2.0, 3.0], [2, 2], [2.5, 2.5]),
    ([5.0], [1], [5.0]),
    ([1.0, 2.0, 3.0, 4.0, 10.0, 20.0], [4, 2], [2.5, 15.0]),  # rounds of different lengths
])
def test_round_medians_follow_the_order_the_steps_ran(steps, round_steps, medians):
    assert fb.round_medians(steps, round_steps) == pytest.approx(medians)


@pytest.mark.parametrize("step_s, steps, min_s, timed", [
    (0.001, 10, 0.05, 50),   # 10 steps are 10 ms: five calls reach 50 ms
    (0.1, 10, 0.05, 10),     # one call of 10 steps is already 1 s
    (0.001, 3, 0.0, 3),      # no minimum: one call
    (0.004, 4, 0.03, 8),     # 16 ms, then 32 ms >= 30 ms
])
def test_timed_round_times_whole_calls_until_the_minimum_seconds(step_s, steps, min_s, timed):
    calls = []

    def run_steps(n):
        calls.append(n)
        return [step_s] * n
    out = fb.timed_round(run_steps, steps, min_s)
    assert len(out) == timed
    assert set(calls) == {steps}


def test_round_spread_is_the_noise_floor_of_the_median_error():
    # real 10 with rounds 9, 10, 12 -> 0.1, 0, 0.2; real 4 with rounds 4, 4, 5 -> 0, 0, 0.25
    rows = [("a", 10.0, 0.0, 0.0, [9.0, 10.0, 12.0]), ("b", 4.0, 0.0, 0.0, [4.0, 4.0, 5.0])]
    assert fb.round_spread(rows) == pytest.approx(0.05)  # median of 0, 0, 0, 0.1, 0.2, 0.25


def test_bundled_comm_fit_has_what_the_model_and_the_overheads_read():
    comm = fb.cluster_comm()
    assert comm["comm"]["p2p"]["latency_s"] > 0 and {"2", "3"} <= set(comm["comm"]["allreduce"])
    assert "allreduce_points" in comm["conditions"]["comm"]
    lines = fb.conditions_table({"m": (comm, None)})
    assert len(lines) == 3 and lines[2].startswith("| m | 71 | 893 / 1816 |")  # µs of the bundled fit


def test_conditions_table_shows_the_feed_costs_where_a_record_has_them():
    comm = fb.cluster_comm()
    over = {"step_s": 2e-4, "worker_s": 3e-4, "transfer_s": {}, "message_cpu_s": {}}
    old = fb.conditions_table({"m": (comm, over)})[2]
    new = fb.conditions_table({"m": (comm, {**over, "feed_input_s": 2.5e-5, "feed_s_per_byte": 5e-10})})[2]
    assert "| 200 | - | 300 |" in old and "| 200 | 25 / 0.50 | 300 |" in new


def test_conditions_table_shows_each_kinds_collective_cpu_where_a_record_has_it():
    comm = fb.cluster_comm()
    over = {"step_s": 2e-4, "worker_s": 3e-4, "transfer_s": {}, "message_cpu_s": {}}
    mean = {"bytes": [16, 4096], "seconds": [2e-4, 5e-4]}
    old = fb.conditions_table({"m": (comm, {**over, "collective_cpu_s": {"3": mean}})})[2]
    by_kind = {**mean, "seconds_by_kind": {"CPU_half": [2.5e-4, 5.5e-4], "CPU": [1.5e-4, 4e-4]}}
    new = fb.conditions_table({"m": (comm, {**over, "collective_cpu_s": {"3": by_kind}})})[2]
    assert old.endswith("| 200 / 500 |")
    assert new.endswith("| mean 200 / 500; CPU 150 / 400; CPU_half 250 / 550 |")


def test_conditions_table_shows_each_ends_message_share_where_a_record_has_it():
    comm = fb.cluster_comm()
    over = {"step_s": 2e-4, "worker_s": 3e-4, "transfer_s": {}, "message_cpu_s": {"CPU|CPU_half": 9e-5}}
    old = fb.conditions_table({"m": (comm, over)})[2]
    share = {"CPU|CPU_half": {"CPU": 0.44, "CPU_half": 0.56}}
    new = fb.conditions_table({"m": (comm, {**over, "message_cpu_share": share})})[2]
    assert "| CPU-CPU_half 90 |" in old
    assert "| CPU-CPU_half 90; CPU-CPU_half: CPU 44%, CPU_half 56% |" in new


@pytest.mark.parametrize("cpu_ms, fractions, bound_ms", [
    ((2.0, 7.0, 6.0), (None, 0.5, 0.5), 14.0),   # a task at half a core needs twice its CPU in wall time
    ((6.0, 2.0, 2.5), (None, 0.5, 0.5), 6.0),    # the unlimited task is the bound
    ((1.0, 3.0), None, 3.0),                     # no quotas: the busiest task's CPU
    ((), None, 0.0),
])
def test_cpu_bound_is_the_busiest_task_under_its_quota(cpu_ms, fractions, bound_ms):
    got = fb.cpu_bound_seconds([c * 1e-3 for c in cpu_ms], fractions)
    assert got == pytest.approx(bound_ms * 1e-3)


@pytest.mark.parametrize("hetero, inter_threads", [(False, 1), (False, 2), (True, 1), (True, 2)])
def test_cluster_setup_gives_every_task_the_inter_op_threads_asked_for(monkeypatch, hetero, inter_threads):
    # --inter-threads: a TF server runs its RPC handlers on its inter-op pool, so the count changes
    # when a busy task serves tensors; the heterogeneous setup keeps its pinning and quotas
    monkeypatch.setattr(cluster_setup, "pin_this_process", lambda cpus: None)  # this test process stays as it is
    cluster, kwargs = fb.local_cluster_setup(hetero, inter_threads)
    assert kwargs["inter_threads_per_task"] == [inter_threads] * 3
    assert kwargs["threads_per_task"] == [1, 1, 1]
    assert cluster.num_devices == 3
    assert kwargs.get("cpu_fraction_per_task") == (fb.HETERO["fractions"] if hetero else None)


def test_ms_list_writes_milliseconds():
    assert fb.ms_list([0.0012, 0.0034]) == "1.20/3.40"
    assert fb.ms_list([]) == ""


def test_inter_threads_below_one_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        fb.main(["--inter-threads", "0"])
    assert "--inter-threads must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("passes, medians", [
    # op a's CPU times at batch 1 over three passes, op b's at batch 2: the median of each
    ([{"a": 1.0, "b": 4.0}, {"a": 3.0, "b": 2.0}, {"a": 2.0, "b": 9.0}], {"a": 2.0, "b": 4.0}),
    ([{"a": 1.0, "b": 4.0}, {"a": 3.0, "b": 2.0}], {"a": 2.0, "b": 3.0}),
    ([{"a": 5.0, "b": 6.0}], {"a": 5.0, "b": 6.0}),
])
def test_median_profile_takes_each_op_time_over_the_passes(tmp_path, passes, medians):
    paths = []
    for i, times in enumerate(passes):
        path = tmp_path / f"pass{i}.json"
        write_json(path, {"format": "tfplace.profile", "conditions": {"repeats": 3, "pass": i},
                          "ops": {"a": {"CPU": {"1": times["a"]}}, "b": {"CPU_half": {"2": times["b"]}}}})
        paths.append(str(path))
    out = fb.median_profile(paths, str(tmp_path / "out.json"))
    with open(out) as f:
        data = json.load(f)
    assert data["ops"]["a"]["CPU"]["1"] == pytest.approx(medians["a"])
    assert data["ops"]["b"]["CPU_half"]["2"] == pytest.approx(medians["b"])
    assert data["conditions"]["pass"] == 0 and data["conditions"]["profile_passes"] == len(passes)


@pytest.mark.parametrize("passes, repeats", [(1, 9), (3, 3), (2, 5), (4, 3), (20, 1)])
def test_profile_repeats_cover_the_profile_repeats_over_the_passes(passes, repeats):
    assert fb.profile_repeats(passes) == repeats
    assert passes * repeats >= fb.PROFILE_REPEATS


@pytest.mark.parametrize("flags, setup", [
    ([], "(clusters/local_cpu.json), 1 intra-op + 1 inter-op thread(s) each, homogeneous, unpinned"),
    (["--hetero", "--inter-threads", "2"], "(clusters/local_cpu_hetero.json), 1 intra-op + 2 inter-op thread(s)"),
])
def test_the_page_has_the_command_the_setup_the_summary_and_every_row(flags, setup):
    args = fb.parser().parse_args(flags)
    # real 10 / 4 ms, sim 11 / 4 ms: errors 10% and 0%, median 5%, worst 10%; fastest 8 / 4 ms
    rows = [("a", 0.010, 0.011, 0.008, [0.010], [0.002, 0.001, 0.001], [0.009, 0.0, 0.0], 0.002),
            ("b", 0.004, 0.004, 0.004, [0.004], [0.001, 0.001, 0.001], [0.003, 0.0, 0.0], 0.001)]
    page = fb.markdown(args, flags, {"m": rows}, {"m": (fb.cluster_comm(), None)}, 12.0)
    assert page.startswith("# Simulator fidelity on the local CPU cluster\n")
    assert f"Command: `.venv/bin/python benchmarks/fidelity_bench.py {' '.join(flags)}`" in page
    assert setup in page and "(12 s)" in page
    summary_row = [line for line in page.splitlines() if line.startswith("| m | 2 |")]
    assert len(summary_row) == 1 and summary_row[0].startswith("| m | 2 | 5.0% | 10.0% | 1.00 | 0.0% |")
    assert summary_row[0].endswith("| 37.5% | 1.00 |")  # against the fastest: 37.5% and 0%
    assert "| m | a | 10.00 | 8.00 | 11.00 | 1.10 | 1.38 | 2.00/1.00/1.00 | 2.00 | 9.00/0.00/0.00 |" in page


def test_a_comm_fit_that_fails_mid_write_leaves_the_profile_whole(tmp_path):
    """attach_comm rewrites a profile that a later --reuse-profiles run reads: a write stopped
    half-way (here a value json cannot write, after the first keys are out) used to leave a
    truncated file there, which that run then failed to read."""
    path = str(tmp_path / "m_t1.json")
    write_json(path, {"ops": {"a": {"CPU": {"1": 1e-3}}}, "conditions": {"pass": 0}})
    with open(path) as f:
        before = f.read()
    with pytest.raises(TypeError):
        fb.attach_comm(path, {"comm": {"latency_s": 1e-5, "fit": object()}, "conditions": {"comm": {}}})
    with open(path) as f:
        assert f.read() == before
    assert os.listdir(tmp_path) == ["m_t1.json"]


def test_a_second_run_on_the_same_workdir_stops_before_it_measures(tmp_path, monkeypatch, capsys):
    """Two runs on one --workdir (by default one folder for every run on the machine) removed and
    rewrote each other's profiles; the second now stops at once, naming the flag."""
    from tfplace.cli.common import OutputLock
    monkeypatch.setattr(fb, "bench_model", lambda *a, **k: pytest.fail("ran beside the run holding the workdir"))
    workdir = str(tmp_path / "work")
    os.makedirs(workdir)
    with OutputLock(workdir, "the other run"):
        with pytest.raises(SystemExit) as stop:
            fb.main(["--workdir", workdir, "--models", "tiny_mlp", "--out", str(tmp_path / "page.md")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "argument --workdir" in err and "is in use by another run" in err, err
