"""`python activate.py cfg` end to end on the local CPU cluster:
one good strategy, one entry that fails while it runs and one baseline; the run completes, the failed entry is reported while the others run,
results.json carries measured and simulated times and their ratio, and every timeline is a valid
Chrome trace. An entry that is bad before any run (an unknown baseline, a strategy naming a device
the cluster lacks, or a group its graph lacks) stops the run before any work."""

import io
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return str(path)


@pytest.mark.parametrize("entry, says", [
    ({"baselines": ["single", "horovod_evn"]}, "baselines[1]: unknown baseline 'horovod_evn' (did you mean "
                                               "'horovod_even'?)"),
    ({"strategies": [{"name": "other", "strategy": "{other}", "model": "tiny_mlp"}]}, "gpu7"),
])
def test_a_bad_entry_stops_activate_before_any_work(tmp_path, monkeypatch, capsys, entry, says):
    """Exit 2 with one line naming the entry, before any export, server or output folder."""
    from tfplace.cli import activate, common
    from tfplace.graph_defs import export
    from tfplace.runtime import local_cluster
    monkeypatch.setattr(local_cluster.subprocess, "Popen", lambda *a, **k: pytest.fail("a server was started"))
    monkeypatch.setattr(export, "ensure_bundle", lambda *a, **k: pytest.fail("a graph was exported"))
    other = _write(tmp_path / "other.json", {
        "format": "tfplace.strategy", "global_batch_size": 16, "max_groups": 4,
        "default": {"shares": {"cpu0": 8, "gpu7": 8}, "sync": "allreduce"}})
    config = {"format": "tfplace.activate_config", "cluster": os.path.join(ROOT, "clusters", "local_cpu.json"),
              "graphs": [{"model": "tiny_mlp", "batch_size": 16}], "output_dir": str(tmp_path / "out")}
    config.update(json.loads(json.dumps(entry).replace("{other}", other)))
    status = common.call(activate, [_write(tmp_path / "activate_config.txt", config)])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and says in err and "Fix:" in err, err
    assert not (tmp_path / "out").exists()


def test_a_strategy_deciding_a_group_the_graph_lacks_stops_activate_before_any_server(tmp_path, monkeypatch,
                                                                                       capsys):
    """The group names need the graph: it is exported and grouped first, and no server starts."""
    from tfplace.cli import activate, common
    from tfplace.runtime import local_cluster
    monkeypatch.setattr(local_cluster.LocalCluster, "start", lambda *a, **k: pytest.fail("a server was started"))
    bad = _write(tmp_path / "bad.json", {
        "format": "tfplace.strategy", "global_batch_size": 16, "max_groups": 4,
        "default": {"shares": {"cpu0": 16}, "sync": "allreduce"},
        "groups": {"no_such_group": {"shares": {"cpu1": 16}, "sync": "allreduce"}}})
    config = {"format": "tfplace.activate_config", "cluster": os.path.join(ROOT, "clusters", "local_cpu.json"),
              "strategies": [{"name": "bad", "strategy": bad, "model": "tiny_mlp"}], "baselines": ["single"],
              "output_dir": str(tmp_path / "out")}
    status = common.call(activate, [_write(tmp_path / "activate_config.txt", config)])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert f"{bad}: groups.no_such_group: no such group in the graph at this max_groups" in err and "Fix:" in err
    assert not (tmp_path / "out" / "results.json").exists()


@pytest.mark.multiprocess
def test_activate_runs_good_entries_and_reports_the_bad_one(tmp_path, monkeypatch):
    from tfplace.cli.activate import run
    from tfplace.rewrite import graph_rewrite
    good = _write(tmp_path / "good.json", {
        "format": "tfplace.strategy", "global_batch_size": 16, "max_groups": 4,
        "default": {"shares": {"cpu0": 8, "cpu1": 4, "cpu2": [2, 2]}, "sync": "allreduce"}})
    bad = _write(tmp_path / "bad.json", {
        "format": "tfplace.strategy", "global_batch_size": 16, "max_groups": 4,
        "default": {"shares": {"cpu0": 16}, "sync": "allreduce"}})
    rewrite = graph_rewrite.rewrite_step

    def failing_for_bad(graph, strategy, *args, **kwargs):  # as a worker running out of memory would
        if strategy.source == bad:
            raise RuntimeError("no_such_group: the entry failed while it ran")
        return rewrite(graph, strategy, *args, **kwargs)
    monkeypatch.setattr(graph_rewrite, "rewrite_step", failing_for_bad)
    out_dir = tmp_path / "out"
    cfg = _write(tmp_path / "activate_config.txt", {
        "format": "tfplace.activate_config",
        "cluster": os.path.join(ROOT, "clusters", "local_cpu.json"),
        "strategies": [{"name": "good", "strategy": good, "model": "tiny_mlp"},
                       {"name": "bad", "strategy": bad, "model": "tiny_mlp"}],
        "baselines": ["dp_even_allreduce"],
        "steps": 2, "warmup_steps": 1, "output_dir": str(out_dir), "trace": True})
    text = io.StringIO()
    rows = run(cfg, out=text)
    by_name = {r["name"]: r for r in rows}
    assert len(rows) == 3 and {"good", "bad"} <= set(by_name), text.getvalue()
    assert [n for n in by_name if n.startswith("dp_even_allreduce.tiny_mlp")], text.getvalue()
    assert "no_such_group" in by_name["bad"]["error"], "the failed entry must be reported"
    assert "FAILED" in text.getvalue() and "bad" in text.getvalue()
    with open(out_dir / "results.json") as f:
        results = json.load(f)["results"]
    assert [r["name"] for r in results] == [r["name"] for r in rows]
    for r in results:
        if r["name"] == "bad":
            continue
        assert r["error"] is None, r["error"]
        assert len(r["step_times_s"]) == 2 and r["mean_s"] > 0 and r["std_s"] >= 0
        assert r["simulated_s"] > 0
        assert r["ratio"] == pytest.approx(r["simulated_s"] / r["mean_s"])
        with open(r["timeline"]) as f:
            trace = json.load(f)
        assert trace["traceEvents"], "empty timeline"


@pytest.mark.multiprocess
def test_rounds_run_every_entry_on_fresh_servers_and_report_the_median_round(tmp_path, monkeypatch):
    from tfplace.cli.activate import run
    from tfplace.runtime import machine_speed
    from tfplace.runtime.local_cluster import LocalCluster
    started = []
    real_start = LocalCluster.start

    def start(self):
        started.append(self)
        return real_start(self)
    monkeypatch.setattr(LocalCluster, "start", start)
    # a quiet machine: every round counts (a slow one is left out, tests/test_machine_speed.py)
    monkeypatch.setattr(machine_speed, "probe_core_s", lambda core, **_: 1e-3)
    cfg = _write(tmp_path / "activate_config.txt", {
        "format": "tfplace.activate_config", "cluster": os.path.join(ROOT, "clusters", "local_cpu.json"),
        "baselines": ["single", "dp_even_allreduce"], "graphs": [{"model": "tiny_mlp", "batch_size": 16}],
        "steps": 2, "warmup_steps": 1, "rounds": 3, "output_dir": str(tmp_path / "out"), "trace": False})
    text = io.StringIO()
    rows = run(cfg, out=text)
    assert len(started) == 3, "one fresh cluster per round"
    assert text.getvalue().count("(round 3 of 3)") == 2 and "rounds " in text.getvalue()
    for r in rows:
        assert r["error"] is None, r["error"]
        means = r["round_means_s"]
        assert len(means) == 3 and all(len(x["step_times_s"]) == 2 for x in r["rounds"])
        assert r["mean_s"] == sorted(means)[1]  # the median round
        assert r["ratio"] == pytest.approx(r["simulated_s"] / r["mean_s"])
    with open(tmp_path / "out" / "results.json") as f:
        saved = json.load(f)
    assert saved["complete"] and [len(r["round_means_s"]) for r in saved["results"]] == [3, 3]


def test_rounds_must_be_positive(tmp_path):
    from tfplace.formats.config import load_activate_config
    from tfplace.formats.errors import InputError
    cfg = _write(tmp_path / "a.txt", {"format": "tfplace.activate_config", "baselines": ["single"],
                                      "cluster": os.path.join(ROOT, "clusters", "local_cpu.json"),
                                      "graphs": [{"model": "tiny_mlp", "batch_size": 16}], "rounds": 0,
                                      "output_dir": str(tmp_path / "out")})
    with pytest.raises(InputError) as err:
        load_activate_config(cfg)
    assert err.value.field == "rounds" and "> 0" in str(err.value)


@pytest.mark.parametrize("name", ["single", "dp_even_allreduce", "dp_even_ps", "dp_proportional_allreduce",
                                  "dp_proportional_ps"])
def test_activate_baselines_are_the_registry_strategies(name):
    """activate builds its baselines with make_problem + registry.generate (compare's grouping
    level), so its strategy is the one compare and training evaluate."""
    from tfplace.cli.activate import BASELINE_MAX_GROUPS, baseline_plan
    from tfplace.baselines import registry
    from tfplace.baselines.problem import make_problem
    from tfplace.formats.cluster import load_cluster
    from tfplace.profiling.device_model import default_profile
    from tfplace.ir.loader import load_op_graph
    graph = load_op_graph(os.path.join(ROOT, "graph_defs", "zoo", "tiny_mlp_b16_sgd.json"))
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    profile = default_profile(graph, cluster.kinds)
    strategy, grouping = baseline_plan(name, graph, cluster, profile, 16)
    problem = make_problem(graph, cluster, profile, max_groups=BASELINE_MAX_GROUPS, global_batch_size=16)
    assert strategy.to_json() == registry.generate(name, problem).to_json()
    assert grouping.group_names == problem.grouping.group_names


def _config(tmp_path, cluster, graphs=None, baselines=("single",)):
    return _write(tmp_path / "activate_config.txt", {
        "format": "tfplace.activate_config", "cluster": cluster, "baselines": list(baselines),
        "graphs": graphs or [{"model": "tiny_mlp", "batch_size": 16}], "steps": 1, "warmup_steps": 0,
        "output_dir": str(tmp_path / "out")})


def test_a_cluster_on_other_hosts_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    from tfplace.cli import activate, common
    from tfplace.runtime import local_cluster
    monkeypatch.setattr(local_cluster.subprocess, "Popen", lambda *a, **k: pytest.fail("a server was started"))
    with open(os.path.join(ROOT, "clusters", "local_cpu.json")) as f:
        remote = json.load(f)
    remote["hosts"][0]["address"] = "gpu-node-3.example.org"
    cluster = _write(tmp_path / "remote_cluster.json", remote)
    status = common.call(activate, [_config(tmp_path, cluster)])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert "remote_cluster.json" in err and "hosts[0].address" in err and "start the TF servers on those hosts" in err
    assert not (tmp_path / "out").exists()


def test_a_quota_that_cannot_be_applied_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    from tfplace.cli import activate, common
    from tfplace.emulation import cpu_quota
    from tfplace.runtime import local_cluster
    monkeypatch.setattr(local_cluster.subprocess, "Popen", lambda *a, **k: pytest.fail("a server was started"))
    monkeypatch.setattr(cpu_quota, "available", lambda: False)
    status = common.call(activate, [_config(tmp_path, os.path.join(ROOT, "clusters", "local_cpu_hetero.json"))])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "local_cpu_hetero.json" in err and "devices[1].emulation.cpu_fraction" in err, err
    assert not (tmp_path / "out").exists()


def test_graph_entry_sizes_reach_the_bundle(tmp_path, monkeypatch):
    # "image_size": 16 of a tiny_cnn entry is the exported bundle's size (it once ran the default)
    from tfplace.cli import activate
    from tfplace.formats.config import load_activate_config
    from tfplace.graph_defs import bundle, export
    from tfplace.graph_defs.export import resolve_options
    real = export.ensure_bundle
    monkeypatch.setattr(export, "ensure_bundle", lambda model, **opts: real(model, out_dir=str(tmp_path), **opts))
    config = load_activate_config(_config(tmp_path, os.path.join(ROOT, "clusters", "local_cpu.json"), graphs=[
        {"model": "tiny_cnn", "batch_size": 8, "image_size": 12},
        {"model": "tiny_transformer", "batch_size": 8, "seq_len": 6, "num_layers": 1}]), check_model=resolve_options)
    jobs = activate._jobs(config)
    paths = [j["graph"] for j in jobs]
    assert [os.path.basename(p) for p in paths] == ["tiny_cnn_b8_s12_sgd.json", "tiny_transformer_b8_t6_n1_sgd.json"]
    metas = [bundle.read_meta(p) for p in paths]
    assert metas[0]["image_size"] == 12 and (metas[1]["seq_len"], metas[1]["num_layers"]) == (6, 1)
    assert all(os.path.dirname(p) == str(tmp_path) for p in paths)


@pytest.mark.parametrize("graph, field", [
    ({"model": "tiny_mlp", "batch_size": 16, "image_size": 32}, "graphs[0].image_size"),
    ({"model": "tiny_cnn", "batch_size": 16, "seq_len": 8}, "graphs[0].seq_len"),
])
def test_an_option_the_model_does_not_take_is_an_error_naming_it(tmp_path, capsys, graph, field):
    from tfplace.cli import activate, common
    status = common.call(activate, [_config(tmp_path, os.path.join(ROOT, "clusters", "local_cpu.json"), [graph])])
    err = capsys.readouterr().err.strip()
    assert status == 2 and field in err and "does not apply" in err, err
    assert not (tmp_path / "out").exists()


def test_quota_kinds_get_the_cpu_profile_over_their_share():
    from tfplace.cli.activate import _speed_weights
    from tfplace.formats.cluster import load_cluster
    from tfplace.ir.loader import load_op_graph
    from tfplace.profiling.device_model import cluster_profile
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu_hetero.json"))
    graph = load_op_graph(os.path.join(ROOT, "graph_defs", "zoo", "tiny_mlp_b16_sgd.json"))
    profile = cluster_profile(graph, cluster)
    for op in graph.names:
        if profile.has(op, "CPU"):
            assert profile.seconds(op, "CPU_half", 8) == pytest.approx(2 * profile.seconds(op, "CPU", 8))
    w = _speed_weights(cluster)
    assert w[1] == w[2] == pytest.approx(w[0] / 2)


@pytest.mark.multiprocess
def test_profile_of_a_cluster_measures_each_kind_as_its_devices_are_emulated(tmp_path):
    """`python -m tfplace.profile --cluster C`: one profile, every kind of C, each measured pinned
    to its devices' cores and under their quota (the conditions record both, and the quota kind's
    op times carry the slowdown measured under it)."""
    import subprocess
    import sys
    out = tmp_path / "p.json"
    done = subprocess.run([sys.executable, "-m", "tfplace.profile", "--graph", "tiny_mlp", "--batch-sizes", "2,4",
                           "--repeats", "2", "--cluster", os.path.join(ROOT, "clusters", "local_cpu_hetero.json"),
                           "--out", str(out), "--quiet"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out) as f:
        prof = json.load(f)
    by_kind = prof["conditions"]["by_kind"]
    assert set(by_kind) == {"CPU", "CPU_half"}
    assert by_kind["CPU"]["emulation"] == {"cpus": [0]}
    half = by_kind["CPU_half"]["emulation"]
    assert half["cpus"] == [1] and half["cpu_fraction"] == 0.5 and half["throttle_wall_per_cpu_s"] > 1.2
    assert all(set(per) == {"CPU", "CPU_half"} for per in prof["ops"].values())


@pytest.mark.parametrize("argv, says", [
    (["--kind", "CPU"], "--cluster sets each kind"),
    (["--cpu-fraction", "0.5"], "--cluster sets each kind"),
    (["--device", "GPU:0"], "--cluster sets each kind"),
])
def test_profile_of_a_cluster_refuses_per_kind_flags(tmp_path, capsys, argv, says):
    from tfplace.cli import common
    from tfplace.cli import profile
    status = common.call(profile, ["--graph", "tiny_mlp", "--cluster",
                                   os.path.join(ROOT, "clusters", "local_cpu_hetero.json"),
                                   "--out", str(tmp_path / "p.json")] + argv)
    err = capsys.readouterr().err.strip()
    assert status == 2 and says in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("cluster, field", [
    ("two_kind_4gpu.json", "devices[0].kind"),  # a GPU kind is measured on its GPU
])
def test_profile_of_a_cluster_refuses_what_it_cannot_emulate(tmp_path, capsys, cluster, field):
    from tfplace.cli import common
    from tfplace.cli import profile
    status = common.call(profile, ["--graph", "tiny_mlp", "--cluster", os.path.join(ROOT, "clusters", cluster),
                                   "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and cluster in err and field in err, err


def test_a_kind_with_two_quotas_is_refused():
    from tfplace.cli.profile import cluster_kind_settings
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.errors import InputError
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu_hetero.json"))
    assert cluster_kind_settings(cluster) == [("CPU", [0], None), ("CPU_half", [1], 0.5)]
    import dataclasses
    devices = list(cluster.devices)
    devices[2] = dataclasses.replace(devices[2], emulation=dataclasses.replace(devices[2].emulation, cpu_fraction=0.25))
    with pytest.raises(InputError, match=r"devices\[2\].emulation.cpu_fraction"):
        cluster_kind_settings(dataclasses.replace(cluster, devices=tuple(devices)))


def test_activate_simulates_with_the_profile_it_measured(tmp_path, monkeypatch):
    """"profile": "measure": each graph's simulated time comes from the profile measured on the
    cluster (here a stand-in that says every op takes 1 ms), with the overheads file's comm fit."""
    from tfplace import testing
    from tfplace.cli import activate
    from tfplace.formats.profile import save_profile
    from tfplace.ir.loader import load_op_graph
    calls = []

    def fake_profile_cluster(graph, cluster, out, batch_sizes, **kw):
        calls.append((os.path.basename(graph), list(batch_sizes)))
        save_profile(testing.uniform_profile(load_op_graph(graph), cluster.kinds, 1e-3), out)
        return out

    monkeypatch.setattr("tfplace.cli.profile.profile_cluster", fake_profile_cluster)
    ran = []
    monkeypatch.setattr(activate, "_run_one", lambda job, cluster, lc, config, overheads, watch:
                        ran.append(job["profile"]) or {"step_times_s": [1.0], "simulated_s": 1.0, "timeline": "",
                                                       "probes_s": []})
    monkeypatch.setattr(activate, "_running_cluster", lambda lc, cluster, out: None)
    cfg = _write(tmp_path / "a.txt", {
        "format": "tfplace.activate_config", "cluster": os.path.join(ROOT, "clusters", "local_cpu_hetero.json"),
        "baselines": ["single", "horovod_even"], "graphs": [{"model": "tiny_mlp", "batch_size": 16}],
        "profile": "measure", "overheads": os.path.join(ROOT, "clusters", "local_cpu_hetero.overheads.json"),
        "output_dir": str(tmp_path / "out"), "trace": False})
    activate.run(cfg, out=io.StringIO())
    assert calls == [("tiny_mlp_b16_sgd.json", [1, 2, 4, 8, 16])]  # once per graph, not for Horovod
    assert len(ran) == 2 and ran[0] is ran[1] and ran[0] is not None
    assert ran[0].comm is not None and 3 in ran[0].comm.allreduce  # the overheads' comm fit
    assert (tmp_path / "out" / "profiles" / "tiny_mlp_b16_sgd.profile.json").exists()


@pytest.mark.parametrize("value", ["measured", 3, ""])
def test_activate_profile_takes_two_values(tmp_path, value):
    from tfplace.formats.config import load_activate_config
    from tfplace.formats.errors import InputError
    cfg = _write(tmp_path / "a.txt", {"format": "tfplace.activate_config", "baselines": ["single"],
                                      "graphs": [{"model": "tiny_mlp", "batch_size": 16}], "profile": value})
    with pytest.raises(InputError, match="profile"):
        load_activate_config(cfg)


def _verdict_row(name, real_ms, sim_ms=None, graph="g/tiny_mlp_b16_sgd.json", error=None, rounds_ms=None,
                 oom=False, ratio=None):
    """A settled result row; its simulated / real `ratio` is sim_ms / real_ms unless given."""
    fits = bool(sim_ms and real_ms) and not oom
    return {"name": name, "graph": graph, "error": error, "rounds": [{}] if error is None else [],
            "horovod": name.startswith("horovod"), "simulated_oom": oom if sim_ms else None,
            "mean_s": real_ms / 1e3 if real_ms else None, "simulated_s": sim_ms / 1e3 if sim_ms else None,
            "round_means_s": [m / 1e3 for m in rounds_ms] if rounds_ms else ([real_ms / 1e3] if real_ms else None),
            "ratio": (ratio or sim_ms / real_ms) if fits else None}


@pytest.mark.parametrize("rows, expected", [
    # the simulator's first pick ran fastest
    ([_verdict_row("a", 2.0, 1.0), _verdict_row("b", 3.0, 1.5)],
     ["tiny_mlp_b16_sgd: fastest for real a (2.00 ms); the simulator ranked a first of its 2 entries too",
      "  simulated / real on its 2 simulated entries: 0.50-0.50 (median 0.50); 1 is exact"]),
    # it did not: the pick ran 1.50x slower than the fastest simulated entry; Horovod (not simulated) ran fastest
    ([_verdict_row("a", 3.0, 1.0), _verdict_row("b", 2.0, 1.5), _verdict_row("horovod_even.x", 1.0)],
     ["tiny_mlp_b16_sgd: fastest for real horovod_even.x (1.00 ms); the simulator ranked a first of its 2 entries, "
      "which ran 1.50x slower than b",
      "  against Horovod: b ran 2.00x slower than horovod_even.x, the fastest Horovod row",
      "  simulated / real on its 2 simulated entries: 0.33-0.75 (median 0.54); 1 is exact"]),
    # the fastest of ours against the fastest of two Horovod rows; one simulated entry
    ([_verdict_row("a", 2.0, 2.2), _verdict_row("horovod_even.x", 3.0), _verdict_row("horovod_prop.x", 2.5)],
     ["tiny_mlp_b16_sgd: fastest for real a (2.00 ms)",
      "  against Horovod: a ran 1.25x faster than horovod_prop.x, the fastest Horovod row",
      "  simulated / real on its 1 simulated entry: 1.10; 1 is exact"]),
    # the pick and the fastest simulated alike (one placement spelled twice): no ranking claimed; rounds overlap
    ([_verdict_row("plan", 3.0, 1.5, rounds_ms=[2.8, 3.0, 3.3]), _verdict_row("single", 2.75, 1.5,
                                                                             rounds_ms=[2.7, 2.75, 2.9])],
     ["tiny_mlp_b16_sgd: fastest for real single (2.75 ms); the simulator gave plan and single the same time, and "
      "single ran 1.09x faster; their rounds overlap: within this machine's spread they tie",
      "  simulated / real on its 2 simulated entries: 0.50-0.55 (median 0.52); 1 is exact"]),
    # a ranking missed within the rounds' spread
    ([_verdict_row("a", 3.0, 1.0, rounds_ms=[2.5, 3.0, 3.1]), _verdict_row("b", 2.6, 1.5, rounds_ms=[2.4, 2.6, 2.7])],
     ["tiny_mlp_b16_sgd: fastest for real b (2.60 ms); the simulator ranked a first of its 2 entries, which ran 1.15x "
      "slower than b; their rounds overlap: within this machine's spread they tie",
      "  simulated / real on its 2 simulated entries: 0.33-0.58 (median 0.46); 1 is exact"]),
    # equal to two decimals: as fast
    ([_verdict_row("a", 2.0), _verdict_row("horovod_even.x", 2.004)],
     ["tiny_mlp_b16_sgd: fastest for real a (2.00 ms)",
      "  against Horovod: a ran as fast as horovod_even.x, the fastest Horovod row"]),
    # failed rows do not count; a graph with one row that ran says nothing; graphs apart
    ([_verdict_row("a", None, 1.0, error="boom"), _verdict_row("b", 2.0, 1.5), _verdict_row("c", 1.0, 1.0, graph="h.json"),
      _verdict_row("d", 4.0, 2.0, graph="h.json")],
     ["h: fastest for real c (1.00 ms); the simulator ranked c first of its 2 entries too",
      "  simulated / real on its 2 simulated entries: 0.50-1.00 (median 0.75); 1 is exact"]),
    # an entry the simulator says runs out of memory is neither ranked nor in the range
    ([_verdict_row("a", 3.0, 1.0, oom=True), _verdict_row("b", 2.0, 1.5), _verdict_row("c", 2.5, 2.0)],
     ["tiny_mlp_b16_sgd: fastest for real b (2.00 ms); the simulator ranked b first of its 2 entries too",
      "  simulated / real on its 2 simulated entries: 0.75-0.80 (median 0.78); 1 is exact"]),
    # the range reads the rows' own ratios (one computation: _settle's, which the table shows), not its own
    ([_verdict_row("a", 2.0, 1.0, ratio=0.6), _verdict_row("b", 3.0, 1.5, ratio=0.9)],
     ["tiny_mlp_b16_sgd: fastest for real a (2.00 ms); the simulator ranked a first of its 2 entries too",
      "  simulated / real on its 2 simulated entries: 0.60-0.90 (median 0.75); 1 is exact"]),
])
def test_the_verdict_names_the_fastest_for_real_and_whether_the_simulator_agreed(rows, expected):
    from tfplace.cli.activate import verdict_lines
    assert verdict_lines(rows) == expected


def test_the_table_lines_up_however_long_the_entry_names():
    from tfplace.cli.activate import print_table
    rows = [{"name": n, "error": None, "mean_s": 0.012, "std_s": 0.001, "simulated_s": 0.006, "ratio": 0.5}
            for n in ("single.tiny_mlp_b16_sgd", "dp_proportional_allreduce.tiny_transformer_b16_t8_n2_sgd")]
    text = io.StringIO()
    print_table(rows, text)
    lines = text.getvalue().splitlines()
    assert len({line.index("±") for line in lines[1:]}) == 1, lines
    assert lines[0].index("measured ms") + len("measured ms") == lines[1].index("±") + 7, lines


def test_an_entry_the_simulator_says_runs_out_of_memory_is_marked_and_has_no_ratio():
    from tfplace.cli.activate import _settle, print_table
    rows = [{"name": n, "error": None, "simulated_s": 0.006, "simulated_oom": oom,
             "rounds": [{"step_times_s": [0.012], "mean_s": 0.012, "std_s": 0.0, "probes_s": []}]}
            for n, oom in (("single.tiny_cnn", True), ("dp_even_allreduce.tiny_cnn", False))]
    for row in rows:
        _settle(row, {})
    assert [r["ratio"] for r in rows] == [None, pytest.approx(0.5)]
    text = io.StringIO()
    print_table(rows, text)
    lines = text.getvalue().splitlines()
    assert lines[1].split()[-3:] == ["OOM", "6.00", "-"], lines
    assert lines[2].split()[-2:] == ["6.00", "0.500"], lines
    assert lines[-1].startswith("OOM: the simulator says single.tiny_cnn runs out of device memory"), lines


@pytest.mark.multiprocess
def test_activate_marks_an_entry_the_simulator_says_runs_out_of_memory(tmp_path, monkeypatch):
    """On a cluster whose devices hold 50 kB (under what tiny_mlp at batch 16 needs on one device)
    the single baseline runs (a CPU task has more memory than the file says) but the simulator says
    it runs out of memory: results.json and the table say so, and it has no sim/real ratio."""
    from tfplace.cli.activate import run
    from tfplace.formats import cluster as cluster_format
    monkeypatch.setattr(cluster_format, "MIN_FILE_MEMORY_BYTES", 1)  # the file's floor against a unit slip
    with open(os.path.join(ROOT, "clusters", "local_cpu.json")) as f:
        cluster = json.load(f)
    for device in cluster["devices"]:
        device["memory_bytes"] = 50_000
    cfg = _write(tmp_path / "activate_config.txt", {
        "format": "tfplace.activate_config", "cluster": _write(tmp_path / "small.json", cluster),
        "baselines": ["single"], "graphs": [{"model": "tiny_mlp", "batch_size": 16}],
        "steps": 1, "warmup_steps": 1, "output_dir": str(tmp_path / "out"), "trace": False})
    text = io.StringIO()
    run(cfg, out=text)
    with open(tmp_path / "out" / "results.json") as f:
        (row,) = json.load(f)["results"]
    assert row["error"] is None and row["simulated_oom"] is True and row["simulated_s"] > 0, row
    assert row["ratio"] is None
    assert "OOM: the simulator says single" in text.getvalue(), text.getvalue()


@pytest.mark.parametrize("errors, status", [
    ([None, None], 0),
    ([None, "MemoryError: out of memory"], 1),   # one failed while running, the other ran
    (["WorkerDiedError: task 1", "MemoryError: out of memory"], 1),
])
def test_activate_exits_1_when_an_entry_failed(monkeypatch, capsys, errors, status):
    from tfplace.cli import activate
    rows = [{"name": f"e{i}", "error": e} for i, e in enumerate(errors)]
    monkeypatch.setattr(activate, "run", lambda path: rows)
    assert activate.main(["activate.py", "cfg"]) == status
    err = capsys.readouterr().err
    failed = [r["name"] for r in rows if r["error"]]
    assert (f"error: {len(failed)} of 2 entries failed ({', '.join(failed)})" in err) == bool(failed), err


def test_a_new_run_moves_the_earlier_results_aside_before_any_entry(tmp_path):
    """Stopped before its first entry ends, a run must not leave the earlier run's results.json
    (complete: true) beside its own files: it is moved to results.previous.json, and this run's
    results.json says it is not complete."""
    from tfplace.cli import activate
    from tfplace.formats.config import ActivateConfig
    from tfplace.runtime import machine_speed
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"complete": True, "results": [{"name": "earlier"}]}))
    config = ActivateConfig(cluster=os.path.join(ROOT, "clusters", "local_cpu.json"), strategies=(), baselines=(),
                            graphs=(), output_dir=str(tmp_path))
    activate._start_results(str(results), "a.txt", config, machine_speed.SpeedWatch([0]))
    assert json.loads((tmp_path / activate.PREVIOUS_RESULTS).read_text())["results"] == [{"name": "earlier"}]
    now = json.loads(results.read_text())
    assert now["complete"] is False and now["results"] == []


@pytest.mark.parametrize("before, after", [
    # the earlier run's timelines go aside with its results, which name them there
    ({"results.json": ["a", "b"], "a.timeline.json": "A", "b.timeline.json": "B"},
     {"results.previous.json": ["a.timeline.previous.json", "b.timeline.previous.json"],
      "a.timeline.previous.json": "A", "b.timeline.previous.json": "B"}),
    # the run before it: its results and timelines are replaced (c had no timeline in the earlier run)
    ({"results.json": ["a"], "a.timeline.json": "A2", "results.previous.json": ["a", "c"],
      "a.timeline.previous.json": "A1", "c.timeline.previous.json": "C1"},
     {"results.previous.json": ["a.timeline.previous.json"], "a.timeline.previous.json": "A2"}),
    # a timeline its (stopped) run did not record yet goes aside too
    ({"results.json": [], "a.timeline.json": "A"}, {"results.previous.json": [], "a.timeline.previous.json": "A"}),
    # no results.json (removed by hand): the older results keep their own timelines, nothing moves
    ({"results.previous.json": ["a"], "a.timeline.previous.json": "A1", "a.timeline.json": "A2"},
     {"results.previous.json": ["a.timeline.json"], "a.timeline.previous.json": "A1", "a.timeline.json": "A2"}),
])
def test_a_new_run_moves_the_earlier_runs_timelines_aside_with_its_results(tmp_path, before, after):
    from tfplace.cli import activate
    from tfplace.formats.config import ActivateConfig
    from tfplace.runtime import machine_speed

    def results(entries):  # rows naming their timelines as written (<entry>.timeline.json)
        return json.dumps({"complete": False, "results": [
            {"name": e, "timeline": str(tmp_path / f"{e}.timeline.json")} for e in entries]})
    for name, body in before.items():
        (tmp_path / name).write_text(body if isinstance(body, str) else results(body))
    config = ActivateConfig(cluster=os.path.join(ROOT, "clusters", "local_cpu.json"), strategies=(), baselines=(),
                            graphs=(), output_dir=str(tmp_path), trace=True)
    activate._start_results(str(tmp_path / "results.json"), "a.txt", config, machine_speed.SpeedWatch([0]))
    assert sorted(os.listdir(tmp_path)) == sorted(["results.json", *after])
    for name, body in after.items():
        text = (tmp_path / name).read_text()
        if isinstance(body, str):
            assert text == body, name
        else:
            assert [r["timeline"] for r in json.loads(text)["results"]] == [str(tmp_path / t) for t in body]


def test_a_timeline_that_a_new_run_would_move_onto_a_folder_is_refused_before_any_work(tmp_path):
    """<entry>.timeline.previous.json as a folder: moving the earlier timeline there would fail after
    results.json was moved aside; the pre-flight check names it instead (exit 2, nothing moved)."""
    (tmp_path / "results.json").write_text(json.dumps({"complete": True, "results": []}))
    (tmp_path / "a.timeline.json").write_text("A")
    (tmp_path / "a.timeline.previous.json").mkdir()
    config = tmp_path / "activate.txt"
    config.write_text(json.dumps({"format": "tfplace.activate_config", "version": 1,
                                  "cluster": os.path.join(ROOT, "clusters", "local_cpu.json"),
                                  "graphs": [{"model": "tiny_mlp", "batch_size": 12}],
                                  "baselines": ["dp_even_allreduce"],
                                  "output_dir": str(tmp_path)}))
    from tfplace.cli import activate
    from tfplace.formats.errors import InputError
    with pytest.raises(InputError, match="a.timeline.previous.json"):
        activate.run(str(config))
    assert sorted(os.listdir(tmp_path)) == ["a.timeline.json", "a.timeline.previous.json", "activate.txt",
                                            "results.json"]


def _rounds_row(*means_ms, disturbed=()):
    rounds = [{"mean_s": m / 1e3, "disturbed": i in disturbed} for i, m in enumerate(means_ms)]
    return {"rounds": rounds, "round_means_s": [m / 1e3 for m in means_ms], "mean_s": sorted(means_ms)[0] / 1e3}


@pytest.mark.parametrize("faster, slower, tie", [
    (_rounds_row(2.0, 2.0, 2.1), _rounds_row(3.0, 3.0, 3.0), False),
    (_rounds_row(2.0, 2.0, 3.0), _rounds_row(3.0, 3.1, 3.2), True),              # a round of each at 3.0
    (_rounds_row(2.0, 2.0, 5.0, disturbed=(2,)), _rounds_row(3.0, 3.0, 3.0), False),  # the slow round was left out
    (_rounds_row(2.0, 2.0, 2.0), _rounds_row(1.5, 3.0, 3.0, disturbed=(0,)), False),
    (_rounds_row(5.0, 5.0, disturbed=(0, 1)), _rounds_row(4.9), True),           # every round disturbed: all count
])
def test_rounds_tie_only_over_the_rounds_the_medians_were_taken_over(faster, slower, tie):
    from tfplace.cli.activate import rounds_tie_note
    assert ("they tie" in rounds_tie_note(faster, slower)) == tie


def test_a_strategy_entry_whose_graph_does_not_load_is_left_to_fail_alone(tmp_path):
    """check_groups loads each strategy entry's graph; one that does not load becomes that entry's
    error (reported as the entries run), and the other entries are still checked."""
    from tfplace.cli.activate import check_groups
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.errors import InputError
    from tfplace.formats.strategy import Strategy, decision
    broken = tmp_path / "broken.pb"
    broken.write_bytes(b"not a graph")
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    good = Strategy(16, 4, decision({"cpu0": 16}), {"no_such_group": decision({"cpu1": 16})}, source="s.json")
    jobs = [{"name": "a", "kind": "strategy", "strategy": good, "graph": str(broken), "error": None},
            {"name": "b", "kind": "strategy", "strategy": good, "graph": os.path.join(ROOT, "graph_defs", "zoo",
                                                                                   "tiny_mlp_b16_sgd.json"),
             "error": None}]
    with pytest.raises(InputError, match="s.json: groups.no_such_group"):
        check_groups(jobs, cluster)
    assert "not a valid GraphDef" in str(jobs[0]["error"])
