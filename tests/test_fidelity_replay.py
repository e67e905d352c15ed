"""benchmarks/fidelity_bench.py --replay: recorded runs re-simulated with the current simulator
(no cluster, no TensorFlow session): the same strategies, profile and overheads give the same
simulated times, and the error is taken against the recorded real steps."""

import json
import os

import pytest

from tfplace.formats.cluster import load_cluster
from tfplace.ir.loader import load_op_graph
from tfplace.formats.jsonio import write_json
from tfplace.formats.strategy import even_strategy
from tfplace.testing import uniform_profile

import fidelity_bench as fb

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


def _overheads_pass(share_cpu, message_s, raw=False):
    out = {"step_s": 3e-4, "message_cpu_s": {"CPU|CPU_half": message_s},
           "message_cpu_share": {"CPU|CPU_half": {"CPU": share_cpu, "CPU_half": 1.0 - share_cpu}}, "how": "test"}
    if raw:
        out["raw"] = {"first": True}
    return out


@pytest.mark.parametrize("shares, expected_cpu", [
    ([0.42], 0.42),                    # one pass: as measured
    ([0.40, 0.47, 0.44], 0.44),        # the median end, the other end its complement
    ([0.40, 0.50], 0.45),              # an even count: both ends' medians still add up to 1
])
def test_median_overheads_takes_each_ends_median_message_share(shares, expected_cpu):
    runs = [_overheads_pass(s, 1e-4 * (i + 1), raw=not i) for i, s in enumerate(shares)]
    out = fb.median_overheads(runs)
    ends = out["message_cpu_share"]["CPU|CPU_half"]
    assert ends["CPU"] == pytest.approx(expected_cpu) and ends["CPU"] + ends["CPU_half"] == pytest.approx(1.0)
    assert out["message_cpu_s"]["CPU|CPU_half"] == pytest.approx(1e-4 * (len(shares) + 1) / 2)
    assert out["raw"]["first"] and len(out["raw"]["passes"]) == len(shares)


@pytest.mark.parametrize("steps, min_s, call_s", [
    (2, 0.0, 0.0),            # no time floor: the count
    (2, 0.05, 0.01),          # the time floor decides
    (8, 0.01, 0.005),         # the count decides
])
def test_warm_up_runs_the_count_and_the_time(steps, min_s, call_s):
    import time
    starts = []
    t0 = time.perf_counter()
    fb.warm_up(lambda: (starts.append(time.perf_counter()), time.sleep(call_s)), steps, min_s)
    assert len(starts) >= steps and time.perf_counter() - t0 >= min_s
    # and it stopped once both held: the last call was needed for the count or for the time
    assert len(starts) == steps or starts[-1] - t0 < min_s


@pytest.mark.parametrize("wall_us, cpu_us, link_us, latency_us, expected_us", [
    (150, 60, 72, 71.5, 18),        # the hop takes more than its CPU and the link: the rest
    (94, 88, 72, 71.5, -64.35),     # CPU and link more than the wall: cut, at most 0.9 latency
    (130, 50, 72, 71.5, 8),
    (94, 88, 46, 45.0, -40),        # with a 45 us link the same hop would keep 40 us off
])
def test_transfer_is_the_hop_beyond_its_cpu_and_the_simulated_link(wall_us, cpu_us, link_us, latency_us,
                                                                   expected_us):
    got = fb.transfer_beyond(wall_us * 1e-6, cpu_us * 1e-6, link_us * 1e-6, latency_us * 1e-6)
    assert got == pytest.approx(expected_us * 1e-6)


@pytest.mark.parametrize("cpu_ms, fractions, bound_ms", [
    ((2.0, 7.0, 6.0), (None, 0.5, 0.5), 14.0),   # a task at half a core needs twice its CPU in wall time
    ((6.0, 2.0, 2.5), (None, 0.5, 0.5), 6.0),    # the unlimited task is the bound
    ((1.0, 3.0), None, 3.0),                     # no quotas: the busiest task's CPU
    ((), None, 0.0),
])
def test_cpu_bound_is_the_busiest_task_under_its_quota(cpu_ms, fractions, bound_ms):
    got = fb.cpu_bound_seconds([c * 1e-3 for c in cpu_ms], fractions)
    assert got == pytest.approx(bound_ms * 1e-3)


def test_task_cpu_seconds_counts_this_process_work():
    import time
    before = fb.task_cpu_seconds([os.getpid()])
    t0 = time.process_time()
    while time.process_time() - t0 < 0.1:
        pass
    used = fb.task_cpu_seconds([os.getpid()]) - before
    assert used.shape == (1,) and 0.05 <= used[0] <= 1.0
    assert fb.ms_list([0.0012, 0.0034]) == "1.20/3.40"


@pytest.mark.parametrize("hetero, inter_threads", [(False, 1), (False, 2), (True, 1), (True, 2)])
def test_cluster_setup_gives_every_task_the_inter_op_threads_asked_for(monkeypatch, hetero, inter_threads):
    # --inter-threads: a TF server runs its RPC handlers on its inter-op pool, so the count changes
    # when a busy task serves tensors; the heterogeneous setup keeps its pinning and quotas
    monkeypatch.setattr(fb, "pin_this_process", lambda cpus: None)  # this test process stays as it is
    cluster, kwargs = fb.local_cluster_setup(hetero, inter_threads)
    assert kwargs["inter_threads_per_task"] == [inter_threads] * 3
    assert kwargs["threads_per_task"] == [1, 1, 1]
    assert cluster.num_devices == 3
    assert kwargs.get("cpu_fraction_per_task") == (fb.HETERO["fractions"] if hetero else None)


def test_inter_threads_below_one_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        fb.main(["--inter-threads", "0"])
    assert "--inter-threads must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("per_task, expected", [
    ([1, 1, 1], 1),
    ([2, 2, 2], 2),
    ([4, 2, 3], 2),                     # the fewest: the task whose handlers wait longest
    ([None, 0, 3], min(os.cpu_count() or 1, 3)),  # None / 0: TF's default, one per core
])
def test_overheads_record_the_fewest_inter_op_threads_of_any_task(per_task, expected):
    # model_conditions writes it as runtime_overheads.inter_op_threads: with 2 or more the
    # simulator runs a message's CPU beside the lanes instead of on them
    assert fb.handler_threads(per_task) == expected


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


@pytest.mark.parametrize("messages, tries, outcome", [
    ([], 3, "ok"),  # no abort: one call
    (["The same RunGraph (Worker) request was received twice. graph_handle: 1"], 3, "ok"),  # sent again once
    (["... request was received twice ..."] * 2, 3, "ok"),
    (["... request was received twice ..."] * 3, 3, "raised"),  # the last try's abort propagates
    (["Graph handle is not found"], 3, "raised"),  # another abort is not a resend
])
def test_a_micro_benchmark_step_is_run_again_only_when_its_request_came_twice(messages, tries, outcome):
    tf = pytest.importorskip("tensorflow")
    pending = list(messages)
    calls = []

    def step():
        calls.append(1)
        if pending:
            raise tf.errors.AbortedError(None, None, pending.pop(0))
        return "done"
    if outcome == "ok":
        assert fb.run_resent(step, tries) == "done" and len(calls) == len(messages) + 1
    else:
        with pytest.raises(tf.errors.AbortedError):
            fb.run_resent(step, tries)
        assert len(calls) == min(len(messages), tries)


@pytest.mark.parametrize("kinds, per_task_ms, mean_ms, by_kind_ms", [
    # the hetero cluster's 3-task group: task 0 unthrottled, tasks 1 and 2 under the quota
    (["CPU", "CPU_half", "CPU_half"], [[0.2, 0.3, 0.4], [2.0, 2.2, 2.4]], [0.3, 2.2],
     {"CPU": [0.2, 2.0], "CPU_half": [0.35, 2.3]}),
    (["CPU", "CPU_half"], [[0.2, 0.4], [1.0, 3.0]], [0.3, 2.0], {"CPU": [0.2, 1.0], "CPU_half": [0.4, 3.0]}),
    (["CPU", "CPU"], [[0.2, 0.4], [1.0, 3.0]], [0.3, 2.0], {"CPU": [0.3, 2.0]}),
])
def test_participant_curves_give_the_mean_and_each_kinds_mean(kinds, per_task_ms, mean_ms, by_kind_ms, monkeypatch):
    monkeypatch.setattr(fb, "COLLECTIVE_CPU_BYTES", (16, 1 << 20))
    curve = fb.participant_curves([[v * 1e-3 for v in row] for row in per_task_ms], kinds)
    assert curve["bytes"] == [16, 1 << 20]
    assert curve["seconds"] == pytest.approx([v * 1e-3 for v in mean_ms], rel=1e-12)
    assert sorted(curve["seconds_by_kind"]) == sorted(by_kind_ms)
    for kind, want in by_kind_ms.items():
        assert curve["seconds_by_kind"][kind] == pytest.approx([v * 1e-3 for v in want], rel=1e-12)


def test_the_collective_cpu_curve_gives_every_size_instance_keys_of_its_own():
    """A collective instance key names one shape for the servers' lifetime: two sizes of the curve
    that shared a key would abort the bench ("Shape mismatch in the collective instance")."""
    import tensorflow as tf
    devs = [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(3)]
    keys_by_size = {}
    for nbytes in fb.COLLECTIVE_CPU_BYTES:
        g = tf.Graph()
        with g.as_default():
            x0 = tf.constant(0.0)
            fb.collective_chain(devs, fb.CURVE_CHAIN, 3, True, nbytes // 4, key_base=fb.CURVE_KEY_BASE)(x0)
        keys_by_size[nbytes] = {int(tf.get_static_value(n.inputs[3])) for n in g.get_operations()
                                if n.type == "CollectiveReduceV2"}  # inputs: input, group size, group key, instance key
        assert len(keys_by_size[nbytes]) == fb.CURVE_CHAIN
    sizes = list(keys_by_size)
    for i, a in enumerate(sizes):
        for b in sizes[i + 1:]:
            assert not keys_by_size[a] & keys_by_size[b], (a, b)
