"""The runtime-overheads measurement (tfplace.profiling.overheads_probe) and its command line
(python -m tfplace.cli.overheads): the pure helpers against hand-computed values, the command's
contract (help, bad cluster files and arguments refused before any server starts), and one real
measurement on the local cluster (multi-process, slow)."""

import json
import os
import subprocess
import sys

import pytest

from tfplace.cli import common
from tfplace.cli import overheads as cli
from tfplace.formats.jsonio import write_json
from tfplace.overheads.model import load_overheads
from tfplace.profiling import overheads_probe as probe

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
LOCAL_CPU = os.path.join(REPO, "clusters", "local_cpu.json")
BUNDLED_COMM = os.path.join(REPO, "graph_defs", "profiles", "local_comm_cpu.json")


# ------------------------------------------------------------------------------- the probe's helpers

@pytest.mark.parametrize("steps, min_s, call_s", [
    (2, 0.0, 0.0),            # no time floor: the count
    (2, 0.05, 0.01),          # the time floor decides
    (8, 0.01, 0.005),         # the count decides
])
def test_warm_up_runs_the_count_and_the_time(steps, min_s, call_s):
    import time
    starts = []
    t0 = time.perf_counter()
    probe.warm_up(lambda: (starts.append(time.perf_counter()), time.sleep(call_s)), steps, min_s)
    assert len(starts) >= steps and time.perf_counter() - t0 >= min_s
    # and it stopped once both held: the last call was needed for the count or for the time
    assert len(starts) == steps or starts[-1] - t0 < min_s


def test_task_cpu_seconds_counts_this_process_work():
    import time
    before = probe.task_cpu_seconds([os.getpid()])
    t0 = time.process_time()
    while time.process_time() - t0 < 0.1:
        pass
    used = probe.task_cpu_seconds([os.getpid()]) - before
    assert used.shape == (1,) and 0.05 <= used[0] <= 1.0


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
        assert probe.run_resent(step, tries) == "done" and len(calls) == len(messages) + 1
    else:
        with pytest.raises(tf.errors.AbortedError):
            probe.run_resent(step, tries)
        assert len(calls) == min(len(messages), tries)


@pytest.mark.parametrize("wall_us, cpu_us, link_us, latency_us, expected_us", [
    (150, 60, 72, 71.5, 18),        # the hop takes more than its CPU and the link: the rest
    (94, 88, 72, 71.5, -64.35),     # CPU and link more than the wall: cut, at most 0.9 latency
    (130, 50, 72, 71.5, 8),
    (94, 88, 46, 45.0, -40),        # with a 45 us link the same hop would keep 40 us off
])
def test_transfer_is_the_hop_beyond_its_cpu_and_the_simulated_link(wall_us, cpu_us, link_us, latency_us,
                                                                   expected_us):
    got = probe.transfer_beyond(wall_us * 1e-6, cpu_us * 1e-6, link_us * 1e-6, latency_us * 1e-6)
    assert got == pytest.approx(expected_us * 1e-6)


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
    out = probe.median_overheads(runs)
    ends = out["message_cpu_share"]["CPU|CPU_half"]
    assert ends["CPU"] == pytest.approx(expected_cpu) and ends["CPU"] + ends["CPU_half"] == pytest.approx(1.0)
    assert out["message_cpu_s"]["CPU|CPU_half"] == pytest.approx(1e-4 * (len(shares) + 1) / 2)
    assert out["raw"]["first"] and len(out["raw"]["passes"]) == len(shares)


@pytest.mark.parametrize("kinds, per_task_ms, mean_ms, by_kind_ms", [
    # the hetero cluster's 3-task group: task 0 unthrottled, tasks 1 and 2 under the quota
    (["CPU", "CPU_half", "CPU_half"], [[0.2, 0.3, 0.4], [2.0, 2.2, 2.4]], [0.3, 2.2],
     {"CPU": [0.2, 2.0], "CPU_half": [0.35, 2.3]}),
    (["CPU", "CPU_half"], [[0.2, 0.4], [1.0, 3.0]], [0.3, 2.0], {"CPU": [0.2, 1.0], "CPU_half": [0.4, 3.0]}),
    (["CPU", "CPU"], [[0.2, 0.4], [1.0, 3.0]], [0.3, 2.0], {"CPU": [0.3, 2.0]}),
])
def test_participant_curves_give_the_mean_and_each_kinds_mean(kinds, per_task_ms, mean_ms, by_kind_ms, monkeypatch):
    monkeypatch.setattr(probe, "COLLECTIVE_CPU_BYTES", (16, 1 << 20))
    curve = probe.participant_curves([[v * 1e-3 for v in row] for row in per_task_ms], kinds)
    assert curve["bytes"] == [16, 1 << 20]
    assert curve["seconds"] == pytest.approx([v * 1e-3 for v in mean_ms], rel=1e-12)
    assert sorted(curve["seconds_by_kind"]) == sorted(by_kind_ms)
    for kind, want in by_kind_ms.items():
        assert curve["seconds_by_kind"][kind] == pytest.approx([v * 1e-3 for v in want], rel=1e-12)


@pytest.mark.parametrize("per_task, expected", [
    ([1, 1, 1], 1),
    ([2, 2, 2], 2),
    ([4, 2, 3], 2),                     # the fewest: the task whose handlers wait longest
    ([None, 0, 3], min(os.cpu_count() or 1, 3)),  # None / 0: TF's default, one per core
])
def test_overheads_record_the_fewest_inter_op_threads_of_any_task(per_task, expected):
    # measure_runtime_overheads writes it as inter_op_threads: with 2 or more the
    # simulator runs a message's CPU beside the lanes instead of on them
    assert probe.handler_threads(per_task) == expected


def test_the_collective_cpu_curve_gives_every_size_instance_keys_of_its_own():
    """A collective instance key names one shape for the servers' lifetime: two sizes of the curve
    that shared a key would abort the bench ("Shape mismatch in the collective instance")."""
    import tensorflow as tf
    devs = [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(3)]
    keys_by_size = {}
    for nbytes in probe.COLLECTIVE_CPU_BYTES:
        g = tf.Graph()
        with g.as_default():
            x0 = tf.constant(0.0)
            probe.collective_chain(devs, probe.CURVE_CHAIN, 3, True, nbytes // 4, key_base=probe.CURVE_KEY_BASE,
                                   all_reduce="collective")(x0)
        keys_by_size[nbytes] = {int(tf.get_static_value(n.inputs[3])) for n in g.get_operations()
                                if n.type == "CollectiveReduceV2"}  # inputs: input, group size, group key, instance key
        assert len(keys_by_size[nbytes]) == probe.CURVE_CHAIN
    sizes = list(keys_by_size)
    for i, a in enumerate(sizes):
        for b in sizes[i + 1:]:
            assert not keys_by_size[a] & keys_by_size[b], (a, b)


@pytest.mark.parametrize("tasks, pairs", [
    (2, [(0, 1)]),
    (3, [(1, 2), (0, 1), (0, 2)]),  # the order every recorded run used: task 0 also serves the client
    (4, [(1, 2), (1, 3), (2, 3), (0, 1), (0, 2), (0, 3)]),
])
def test_message_pairs_time_the_tasks_without_the_master_first(tasks, pairs):
    assert probe.message_pairs(tasks) == pairs


def test_median_overheads_of_passes_without_raw_keeps_every_pass():
    runs = [{"step_s": s, "transfer_s": {"CPU|CPU": -s}, "how": "test"} for s in (3e-4, 1e-4, 2e-4)]
    out = probe.median_overheads(runs)
    assert out["step_s"] == pytest.approx(2e-4) and out["transfer_s"]["CPU|CPU"] == pytest.approx(-2e-4)
    assert [p["step_s"] for p in out["raw"]["passes"]] == [3e-4, 1e-4, 2e-4]
    assert out["how"] == "test; median of 3 passes"


# ------------------------------------------------------------------------------- the command line

def _cluster_file(tmp_path, address="127.0.0.1", kinds=("CPU", "CPU", "CPU"), tasks=(0, 1, 2)):
    path = tmp_path / "cluster.json"
    write_json(path, {"format": "tfplace.cluster", "version": 1, "name": "t",
                      "hosts": [{"name": "h", "address": address}],
                      "devices": [{"name": f"d{i}", "kind": k, "host": "h", "memory_bytes": 10 ** 9, "task": t}
                                  for i, (k, t) in enumerate(zip(kinds, tasks))]})
    return str(path)


@pytest.fixture
def no_servers(monkeypatch):
    """Records measure_runtime_overheads calls instead of starting servers; returns the calls."""
    calls = []

    def fake(cluster, lc_kwargs, **kwargs):
        calls.append((cluster, lc_kwargs, kwargs))
        n = lc_kwargs["num_tasks"]
        return ({"step_s": 4e-4, "transfer_s": {"CPU|CPU": -5e-5}, "collective_s": {str(g): -1e-4 for g in
                 range(2, n + 1)}, "inter_op_threads": 1, "how": "probe", "raw": {"passes": []}}, None)
    monkeypatch.setattr(probe, "measure_runtime_overheads", fake)
    return calls


def _call(argv, capsys):
    code = common.call(cli, argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_help_exits_0_and_documents_the_emulation_settings(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tfplace.cli.overheads", "--help"], capture_output=True,
                            text=True, timeout=120, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    for flag in ("--cluster", "--out", "--passes", "--inter-threads", "--cpus-per-task", "--cpu-fraction-per-task",
                 "--client-cpus", "--comm", "--[no]raw"):
        assert flag in result.stdout, flag
    assert "local_cpu_hetero.json" in result.stdout and '"0;1;1"' in result.stdout


def test_a_cluster_of_another_host_exits_2_naming_the_field(tmp_path, capsys, no_servers):
    code, _, err = _call(["--cluster", _cluster_file(tmp_path, "10.0.0.7"), "--out", str(tmp_path / "o.json")],
                         capsys)
    assert code == 2 and "hosts[0].address" in err and "loopback" in err
    assert not no_servers and not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("kinds, tasks, field", [
    (("CPU", "V100", "CPU"), (0, 1, 2), "devices[1].kind"),
    (("CPU", "CPU", "CPU"), (0, 0, 1), "devices[1].task"),
    (("CPU",), (0,), "devices"),
])
def test_a_cluster_the_command_cannot_run_exits_2(tmp_path, capsys, no_servers, kinds, tasks, field):
    code, _, err = _call(["--cluster", _cluster_file(tmp_path, kinds=kinds, tasks=tasks),
                          "--out", str(tmp_path / "o.json")], capsys)
    assert code == 2 and field in err and not no_servers


def test_out_in_a_missing_folder_exits_2_before_any_server_starts(tmp_path):
    out = tmp_path / "no_such_folder" / "o.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, "-m", "tfplace.cli.overheads", "--cluster", LOCAL_CPU, "--out", str(out)],
                            capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no_such_folder" in errors[0], result.stderr
    assert "starting" not in result.stderr  # no pass began


@pytest.mark.parametrize("argv, field", [
    (["--cpus-per-task", "0;1"], "--cpus-per-task"),                 # 2 entries, 3 tasks
    (["--cpus-per-task", "0;x;1"], "cpus-per-task"),                 # not a CPU id (parse time)
    (["--cpu-fraction-per-task", ",2e3,0.5"], "cpu-fraction-per-task"),  # not a share of one CPU
    (["--comm", "{comm_2}"], "comm.allreduce"),                      # no fit for 3 tasks
])
def test_bad_settings_exit_2_naming_them(tmp_path, capsys, no_servers, argv, field):
    comm_2 = tmp_path / "comm.json"
    write_json(comm_2, {"format": "tfplace.profile", "ops": {}, "comm": {
        "p2p": {"latency_s": 7e-5, "bandwidth_bytes_per_s": 2e9},
        "allreduce": {"2": {"latency_s": 9e-4, "bandwidth_bytes_per_s": 4e8}}}})
    argv = [a.format(comm_2=comm_2) for a in argv]
    code, _, err = _call(["--cluster", LOCAL_CPU, "--out", str(tmp_path / "o.json"), *argv], capsys)
    assert code == 2 and field in err, err
    assert not no_servers


def test_the_settings_reach_the_servers_and_the_file_says_how(tmp_path, capsys, no_servers, monkeypatch):
    from tfplace.emulation import cpu_quota
    monkeypatch.setattr(cpu_quota, "available", lambda: True)
    out = tmp_path / "o.json"
    code, stdout, _ = _call(["--cluster", LOCAL_CPU, "--out", str(out), "--passes", "2", "--inter-threads", "2",
                             "--cpus-per-task", "0;1;1", "--cpu-fraction-per-task", ",0.5,0.5",
                             "--comm", BUNDLED_COMM, "--noraw", "--reps", "7", "--client-cpus", "1"], capsys)
    assert code == 0 and f"wrote {out}" in stdout
    (cluster, kwargs, options), = no_servers
    assert cluster.num_devices == 3
    assert kwargs == {"num_tasks": 3, "threads_per_task": [1, 1, 1], "inter_threads_per_task": [2, 2, 2],
                      "cpus_per_task": [[0], [1], [1]], "cpu_fraction_per_task": [None, 0.5, 0.5]}
    assert options["passes"] == 2 and options["reps"] == 7 and options["raw"] is False
    assert options["client_cpus"] == [1]  # pinned while it drives the steps, not before the servers start
    assert options["comm"]["allreduce"]["3"]["latency_s"] == pytest.approx(1.8156e-3, rel=1e-3)
    written = load_overheads(out)
    assert written.step_s == pytest.approx(4e-4) and written.collective_s["3"] == pytest.approx(-1e-4)
    assert "[[0], [1], [1]]" in written.how and "[None, 0.5, 0.5]" in written.how
    assert "local_comm_cpu.json" in written.how and written.how.endswith("probe")


@pytest.mark.parametrize("argv, cpus, fractions", [
    ([], [[0], [1], [1]], [None, 0.5, 0.5]),                        # the file's emulation
    (["--cpus-per-task", "1;0;0"], [[1], [0], [0]], [None, 0.5, 0.5]),  # a flag replaces the file's value
])
def test_the_cluster_files_emulation_is_the_default(tmp_path, capsys, no_servers, monkeypatch, argv, cpus, fractions):
    from tfplace.emulation import cpu_quota
    from tfplace.formats.cluster import Device
    if "emulation" not in Device.__dataclass_fields__:
        pytest.skip("this checkout's cluster files declare no emulation")
    monkeypatch.setattr(cpu_quota, "available", lambda: True)
    hetero = os.path.join(REPO, "clusters", "local_cpu_hetero.json")
    code, _, err = _call(["--cluster", hetero, "--out", str(tmp_path / "o.json"), "--comm", BUNDLED_COMM, *argv],
                         capsys)
    assert code == 0, err
    (_, kwargs, _), = no_servers
    assert kwargs["cpus_per_task"] == cpus and kwargs["cpu_fraction_per_task"] == fractions


def test_a_quota_without_cgroups_exits_2_naming_the_flag(tmp_path, capsys, no_servers, monkeypatch):
    from tfplace.emulation import cpu_quota
    monkeypatch.setattr(cpu_quota, "available", lambda: False)
    code, _, err = _call(["--cluster", LOCAL_CPU, "--out", str(tmp_path / "o.json"),
                          "--cpu-fraction-per-task", ",0.5,0.5"], capsys)
    assert code == 2 and "--cpu-fraction-per-task" in err and "root" in err and not no_servers


# ------------------------------------------------------------------------------- a real measurement

@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_command_measures_the_local_cluster_and_writes_a_valid_file(tmp_path):
    out = tmp_path / "overheads.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, "-m", "tfplace.cli.overheads", "--cluster", LOCAL_CPU, "--out", str(out),
                             "--passes", "2", "--noraw", "--reps", "5", "--cpu-reps", "10", "--fan", "4"],
                            capture_output=True, text=True, timeout=300, cwd=str(tmp_path), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pass 2 of 2" in result.stderr and f"wrote {out}" in result.stdout
    overheads = load_overheads(out)
    assert overheads.inter_op_threads == 1
    assert set(overheads.transfer_s) == {"CPU|CPU"} and set(overheads.message_cpu_s) == {"CPU|CPU"}
    assert set(overheads.collective_s) == {"2", "3"} and overheads.message_cpu_s["CPU|CPU"] > 0
    # one gRPC step through the master costs tens of microseconds at least, not seconds
    assert 1e-5 < overheads.step_s < 0.1 and overheads.worker_s >= 0
    # the comm fit was measured in each pass; collective_s is relative to it, kept in raw
    assert len(overheads.raw["passes"]) == 2 and set(overheads.raw["comm"]["allreduce"]) == {"2", "3"}
    assert "2 pass(es)" in overheads.how and not overheads.collective_cpu_s  # --noraw
    # stamped with this machine's quiet speed: the probe's loop takes well under a second here
    assert 1e-5 < overheads.machine_probe_s < 1.0 and "machine: quiet speed probe" in result.stdout
    with open(out) as f:
        assert json.load(f)["format"] == "tfplace.runtime_overheads"
