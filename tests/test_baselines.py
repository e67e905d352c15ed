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
