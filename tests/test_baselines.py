"""The comparison CLI end to end on a tiny bundle (python -m tfplace.compare)."""

import json
import os

import pytest

from tfplace.cli import common, compare

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_MLP = os.path.join(REPO, "graph_defs", "zoo", "tiny_mlp_b16_sgd.json")
CLUSTER = os.path.join(REPO, "clusters", "two_kind_4gpu.json")


def test_compare_writes_table_json_png_and_strategies(tmp_path, capsys):
    out = tmp_path / "cmp"
    names = "single,dp_even_allreduce,dp_proportional_ps,heft,pipeline,horovod_even"
    rc = common.call(compare, ["--graph", TINY_MLP, "--cluster", CLUSTER, "--max-groups", "12", "--out", str(out),
                               "--strategies", names])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "estimated speed-up" in printed and "ideal compute bound" in printed
    result = json.loads((out / "compare.json").read_text())
    rows = {r["strategy"]: r for r in result["rows"]}
    assert set(rows) == {"single", "dp_even_allreduce", "dp_proportional_ps", "heft", "pipeline"}
    # speed-ups are over DP-EV (not over the first row, `single`, which is slower or faster)
    ref_s = rows["dp_even_allreduce"]["time_s"]
    assert result["reference"] == "dp_even_allreduce" and rows["single"]["time_s"] != pytest.approx(ref_s)
    for r in rows.values():
        assert r["time_s"] >= result["ideal_compute_s"]  # no strategy beats the compute bound
        assert r["speedup_vs_dp_even"] == pytest.approx(ref_s / r["time_s"])
        assert r["fraction_of_ideal"] == pytest.approx(result["ideal_compute_s"] / r["time_s"])
    assert (out / "compare.png").stat().st_size > 10_000
    assert (out / "strategies" / "heft.json").exists()
    assert "dp_proportional_ps" in (out / "table.txt").read_text()


def test_bad_input_exits_2(tmp_path, capsys):
    assert common.call(compare, ["--graph", TINY_MLP, "--cluster", CLUSTER, "--strategies", "magic",
                                 "--out", str(tmp_path)]) == 2
    assert "unknown baseline" in capsys.readouterr().err
    assert common.call(compare, ["--graph", "no_such_model", "--cluster", CLUSTER, "--out", str(tmp_path)]) == 2


def _strategy_file(folder, name, **change):
    """A strategy file for TINY_MLP on CLUSTER: data parallel over the first two devices."""
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.strategy import even_strategy, save_strategy
    devices = load_cluster(CLUSTER).device_names[:2]
    strategy = even_strategy(devices, change.get("batch", 16), change.get("max_groups", 12), graph="tiny_mlp")
    path = str(folder / name)
    save_strategy(strategy, path)
    return path


def test_compare_simulates_strategy_files_beside_the_baselines(tmp_path, capsys):
    """A row per file, named by it ("file:" first when a baseline has that name), simulated on the
    same problem: the same strategy as a baseline gets the same time; files are not copied out."""
    ours, clash = _strategy_file(tmp_path, "ours.json"), _strategy_file(tmp_path, "single.json")
    out = tmp_path / "cmp"
    rc = common.call(compare, ["--graph", TINY_MLP, "--cluster", CLUSTER, "--max-groups", "12", "--out", str(out),
                               "--strategies", "single,dp_even_allreduce", "--strategy-files", f"{ours},{clash}",
                               "--no-plot"])
    assert rc == 0, capsys.readouterr().err
    rows = {r["strategy"]: r for r in json.loads((out / "compare.json").read_text())["rows"]}
    assert list(rows) == ["single", "dp_even_allreduce", "ours", "file:single"]
    from tfplace.baselines.problem import make_problem
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.strategy import load_strategy
    from tfplace.ir.loader import load_op_graph
    from tfplace.profiling.device_model import cluster_profile
    graph, cluster = load_op_graph(TINY_MLP), load_cluster(CLUSTER)
    alone = make_problem(graph, cluster, cluster_profile(graph, cluster), max_groups=12).evaluate(load_strategy(ours))
    assert rows["ours"]["file"] and rows["ours"]["time_s"] == pytest.approx(alone.iteration_time_s)
    assert rows["ours"]["devices_used"] == 2
    dp = rows["dp_even_allreduce"]["time_s"]
    assert rows["ours"]["speedup_vs_dp_even"] == pytest.approx(dp / rows["ours"]["time_s"])
    assert sorted(os.listdir(out / "strategies")) == ["dp_even_allreduce.json", "single.json"]
    assert "ours" in (out / "table.txt").read_text()


@pytest.mark.parametrize("change, says", [
    (dict(batch=8), "global_batch_size: is 8, the comparison's is 16. Fix: give --batch-size 8"),
    (dict(max_groups=5), "max_groups: is 5, the comparison's is 12. Fix: give --max-groups 5"),
])
def test_a_strategy_file_that_does_not_fit_the_comparison_names_the_flag(tmp_path, capsys, change, says):
    path = _strategy_file(tmp_path, "other.json", **change)
    rc = common.call(compare, ["--graph", TINY_MLP, "--cluster", CLUSTER, "--max-groups", "12",
                               "--out", str(tmp_path / "cmp"), "--strategy-files", path, "--no-plot"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{path}: {says}" in err, err


def test_strategy_files_of_one_stem_get_a_row_each(tmp_path):
    """Three folders' s.json (e.g. three plans): three rows; none replaces another."""
    from tfplace.baselines.problem import make_problem
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.strategy import load_strategy
    from tfplace.ir.loader import load_op_graph
    from tfplace.profiling.device_model import cluster_profile
    paths = []
    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
        paths.append(_strategy_file(tmp_path / folder, "s.json"))
    graph, cluster = load_op_graph(TINY_MLP), load_cluster(CLUSTER)
    problem = make_problem(graph, cluster, cluster_profile(graph, cluster), max_groups=12)
    rows = compare.file_rows_for(problem, {p: load_strategy(p) for p in paths})
    assert list(rows) == ["s", "file:s", "file:s#2"]
