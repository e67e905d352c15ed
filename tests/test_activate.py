"""`python activate.py cfg` end to end on the local CPU cluster:
one good strategy, one bad entry (a strategy naming a device the cluster lacks) and one baseline;
the run completes, the bad entry is reported while the others run, results.json carries
measured and simulated times and their ratio, and every timeline is a valid Chrome trace."""

import io
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return str(path)


@pytest.mark.multiprocess
def test_activate_runs_good_entries_and_reports_the_bad_one(tmp_path, monkeypatch):
    from tfplace.cli.activate import run
    good = _write(tmp_path / "good.json", {
        "format": "tfplace.strategy", "global_batch_size": 16, "max_groups": 4,
        "default": {"shares": {"cpu0": 8, "cpu1": 4, "cpu2": [2, 2]}, "sync": "allreduce"}})
    bad = _write(tmp_path / "bad.json", {
        "format": "tfplace.strategy", "global_batch_size": 16, "max_groups": 4,
        "default": {"shares": {"cpu0": 8, "gpu7": 8}, "sync": "allreduce"}})
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
    assert by_name["bad"]["error"], "the bad entry must be reported"
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
