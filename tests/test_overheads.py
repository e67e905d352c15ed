"""tfplace.overheads: the RuntimeOverheads file and the optional pass after the lowering.

The pass must (a) be the identity without overheads and never be imported then, (b) leave the
lowering's PlacedGraph untouched (the rewrite emits that one), and (c) reproduce the recorded
simulated times of a measured run on the emulated heterogeneous cluster bit for bit
(benchmarks/records/hetero_tiny_mlp.json; the overheads pass was first checked this way against a
run recorded while the overheads still lived inside the lowering).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tfplace.formats.errors import InputError
from tfplace.lowering.lower import lower
from tfplace.lowering.placed_graph import TASK_HANDLER
from tfplace.overheads.apply import apply
from tfplace.overheads.model import (FORMAT, RuntimeOverheads, load_overheads, overheads_from_json,
                                     save_overheads)
from tfplace.simulator import fakes as fk
from tfplace.simulator import simulate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(ROOT, "benchmarks", "records", "hetero_tiny_mlp.json")

FULL = {"step_s": 9e-4, "feed_input_s": 2e-5, "feed_s_per_byte": 4e-10, "worker_s": 2.6e-4, "step_cpu_s": 1.6e-4,
        "master_worker_cpu_s": 4e-5, "worker_cpu_s": 2.8e-4, "op_s": 3e-6, "transfer_s": {"P100|V100": -1e-5},
        "transfer_gap_s": 6e-5, "message_cpu_s": {"P100|V100": 1.4e-4}, "collective_s": {"2": -5e-4},
        "message_cpu_share": {"P100|V100": {"P100": 0.6, "V100": 0.4}}, "inter_op_threads": 1,
        "collective_cpu_s": {"2": {"bytes": [16, 1048576], "seconds": [2.4e-4, 1.9e-3],
                                   "seconds_by_kind": {"V100": [2e-4, 1.5e-3]}}},
        "message_cpu_s_per_byte": 1.1e-9, "machine_probe_s": 7.5e-4, "how": "by hand", "raw": {"note": [1, 2]}}


def _dp_pair():
    g = fk.dp_graph(1_200_000)
    gr = fk.grouping(g, [["x", "f", "g"], ["w", "r", "apply", "lr", "train_op"]])
    from tfplace.formats.strategy import Strategy, decision
    st = Strategy(8, 2, decision({"v100_0": 6, "p100_0": 2}, "allreduce"), {})
    cluster = fk.pair_cluster()
    return lower(g, gr, cluster, st, fk.dp_profile(g)), cluster


def test_the_file_round_trips(tmp_path):
    over = overheads_from_json(FULL)
    path = tmp_path / "overheads.json"
    save_overheads(over, path)
    with open(path) as f:
        assert json.load(f)["format"] == FORMAT
    again = load_overheads(path)
    assert again.to_json() == over.to_json()
    assert again.collective_cpu_s["2"]["seconds_by_kind"]["V100"] == (2e-4, 1.5e-3)
    assert again.source == str(path) and again.machine_probe_s == 7.5e-4


def test_the_value_is_read_only():
    over = overheads_from_json(FULL)
    with pytest.raises(Exception):
        over.step_s = 1.0
    with pytest.raises(TypeError):
        over.transfer_s["P100|V100"] = 1.0


@pytest.mark.parametrize("patch, field, words", [
    ({"step_s": -1e-3}, "step_s", ">= 0"),
    ({"op_s": "3us"}, "op_s", "must be a number"),
    ({"stepp_s": 1e-3}, "stepp_s", "did you mean 'step_s'"),
    ({"transfer_s": {"V100": 1e-5}}, "transfer_s.V100", "pair of device kinds"),
    ({"collective_s": {"three": 1e-4}}, "collective_s.three", "group size"),
    ({"collective_s": {"1": 1e-4}}, "collective_s.1", "group size"),
    ({"message_cpu_s": {"P100|V100": -1e-4}}, "message_cpu_s.P100|V100", ">= 0"),
    ({"inter_op_threads": 0}, "inter_op_threads", ">= 1"),
    ({"machine_probe_s": 0}, "machine_probe_s", "> 0"),
    ({"machine_probe_s": "fast"}, "machine_probe_s", "must be a number"),
    ({"message_cpu_share": {"P100|V100": {"P100": 0.7, "V100": 0.7}}}, "message_cpu_share.P100|V100", "add up to 1"),
    ({"collective_cpu_s": {"2": {"bytes": [16, 8], "seconds": [1e-4, 2e-4]}}}, "collective_cpu_s.2", "increasing"),
    ({"collective_cpu_s": {"2": {"bytes": [16], "seconds": [1e-4], "extra": 1}}}, "collective_cpu_s.2.extra",
     "unknown key"),
    ({"format": "tfplace.profile"}, "format", "expected 'tfplace.runtime_overheads'"),
])
def test_a_bad_field_is_one_error_naming_file_field_and_fix(tmp_path, patch, field, words):
    path = tmp_path / "over.json"
    with open(path, "w") as f:
        json.dump({"format": FORMAT, "version": 1, **FULL, **patch}, f)
    with pytest.raises(InputError) as err:
        load_overheads(path)
    text = str(err.value)
    assert text.startswith(f"{path}: {field}: ") and words in text and "Fix:" in text, text


def test_without_overheads_the_pass_is_the_identity():
    placed, cluster = _dp_pair()
    assert apply(placed, cluster, None) is placed


def test_the_pass_leaves_the_lowerings_graph_untouched():
    placed, cluster = _dp_pair()
    before = {k: np.array(v, copy=True) for k, v in vars(placed).items() if isinstance(v, np.ndarray)}
    applied = apply(placed, cluster, overheads_from_json(FULL))
    assert applied is not placed and applied.num_tasks > placed.num_tasks  # handlers were added
    assert (applied.task_kind[placed.num_tasks:] == TASK_HANDLER).all()
    assert len(applied.device_cpu_seconds) == 2 and len(placed.device_cpu_seconds) == 0
    for name, value in before.items():
        assert np.array_equal(getattr(placed, name), value), name
    assert simulate(applied, cluster).iteration_time_s > simulate(placed, cluster).iteration_time_s
    with pytest.raises(ValueError, match="already"):
        apply(applied, cluster, overheads_from_json(FULL))


def test_all_defaults_change_no_time():
    placed, cluster = _dp_pair()
    applied = apply(placed, cluster, RuntimeOverheads())
    assert np.array_equal(applied.task_seconds, placed.task_seconds)
    assert simulate(applied, cluster).iteration_time_s == simulate(placed, cluster).iteration_time_s


def test_a_problem_with_overheads_simulates_the_applied_graph():
    from tfplace.baselines.problem import make_problem
    from tfplace.formats.strategy import even_strategy
    placed, cluster = _dp_pair()
    g = fk.dp_graph(1_200_000)
    over = overheads_from_json(FULL)
    with_over = make_problem(g, cluster, fk.dp_profile(g), max_groups=2, overheads=over)
    without = make_problem(g, cluster, fk.dp_profile(g), max_groups=2)
    st = even_strategy(cluster.device_names, g.reference_batch_size, 2)
    expect = simulate(apply(with_over.lowerer.lower(st), cluster, over), cluster, with_over.sim_options)
    assert with_over.evaluate(st).iteration_time_s == expect.iteration_time_s
    assert without.evaluate(st).iteration_time_s < expect.iteration_time_s


def test_the_simulators_path_never_imports_the_overheads():
    code = ("import sys\n"
            "from tfplace.simulator import fakes as fk, simulate\n"
            "from tfplace.lowering.lower import lower\n"
            "from tfplace.baselines.problem import make_problem\n"
            "from tfplace.formats.strategy import even_strategy\n"
            "g = fk.dp_graph(1000); c = fk.pair_cluster()\n"
            "p = make_problem(g, c, fk.dp_profile(g), max_groups=2)\n"
            "p.evaluate(even_strategy(c.device_names, g.reference_batch_size, 2))\n"
            "sys.exit(1 if any(m.startswith('tfplace.overheads') for m in sys.modules) else 0)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
def test_a_recorded_run_replays_to_its_recorded_figures():
    # A run of benchmarks/fidelity_bench.py --hetero --record (tiny MLP, the baselines, measured
    # overheads with every key, one inter-op thread): every strategy simulates to the time recorded
    # then, to the last bit. A change of the lowering, the overheads pass or the simulator shows here.
    import fidelity_bench as fb
    from tfplace.baselines.problem import make_problem
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.jsonio import FieldReader
    from tfplace.formats.profile import profile_from_reader
    from tfplace.formats.strategy import strategy_from_reader
    from tfplace.ir.loader import load_op_graph
    with open(RECORD) as f:
        rec = json.load(f)
    cluster = load_cluster(os.path.join(ROOT, "clusters", rec["cluster"]))
    m = rec["models"]["tiny_mlp"]
    graph = load_op_graph(os.path.join(ROOT, fb.bundle_path("tiny_mlp")))
    assert os.path.relpath(fb.bundle_path("tiny_mlp"), ROOT) == m["bundle"]
    profile = profile_from_reader(FieldReader(m["profile"], RECORD))
    over = fb.typed_overheads(m["overheads"], RECORD)
    grouping = make_problem(graph, cluster, profile, max_groups=fb.MAX_GROUPS,
                            global_batch_size=graph.reference_batch_size).grouping
    assert len(m["rows"]) >= 8 and {"dp_even_allreduce", "dp_even_ps"} <= {r["name"] for r in m["rows"]}
    for r in m["rows"]:
        strategy = strategy_from_reader(FieldReader(r["strategy"], RECORD))
        report = fb.simulate_with(graph, grouping, cluster, strategy, profile, over)
        assert report.iteration_time_s == pytest.approx(r["sim_s"], rel=1e-12, abs=0), r["name"]
        assert list(report.busy_s) == pytest.approx(r["sim_busy_s"], rel=1e-12), r["name"]


# ---- the tools that simulate read the file when given --------------------------------------------

def _write_overheads(tmp_path, **fields):
    path = tmp_path / "overheads.json"
    save_overheads(overheads_from_json(fields), path)
    return str(path)


def test_simulate_adds_the_overheads_it_is_given(tmp_path):
    from tfplace.cli import common, simulate as simulate_cli
    args = ["--graph", os.path.join(ROOT, "graph_defs", "zoo", "tiny_mlp_b16_sgd.json"),
            "--cluster", os.path.join(ROOT, "clusters", "local_cpu.json"),
            "--strategy", os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json")]
    times = []
    for extra in ([], ["--overheads", _write_overheads(tmp_path, step_s=0.25)]):
        out = tmp_path / f"report{len(times)}.json"
        assert common.call(simulate_cli, args + extra + ["--json", str(out)]) == 0
        with open(out) as f:
            times.append(json.load(f)["iteration_time_s"])
    assert times[1] == pytest.approx(times[0] + 0.25, rel=1e-9)  # step_s: once per step, on the feed
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": FORMAT, "step_s": -1}))
    assert common.call(simulate_cli, args + ["--overheads", str(bad)]) == 2


@pytest.mark.parametrize("entries, error", [
    (None, None),                                   # absent: none for every cluster
    (["overheads.json"], None),                     # resolved against the config's folder
    ([None], None),
    (["overheads.json", None], "has 2 entries for 1 clusters"),
    ([3], "must be a path or null"),
    (["missing.json"], "not found"),
])
def test_a_train_config_names_one_overheads_file_per_cluster(tmp_path, entries, error):
    from tfplace.formats.config import load_train_config
    _write_overheads(tmp_path, step_s=1e-3)
    cfg = {"format": "tfplace.train_config", "version": 1, "graphs": [{"model": "tiny_mlp", "batch_size": 16}],
           "clusters": [os.path.join(ROOT, "clusters", "local_cpu.json")]}
    if entries is not None:
        cfg["overheads"] = entries
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    if error:
        with pytest.raises(InputError, match=error):
            load_train_config(path)
        return
    config = load_train_config(path)
    want = [None] if entries in (None, [None]) else [str(tmp_path / "overheads.json")]
    assert list(config.overheads) == want


def test_a_training_task_simulates_with_its_clusters_overheads(tmp_path):
    from tfplace.formats.config import load_train_config
    from tfplace.policy import train_lib
    over = _write_overheads(tmp_path, step_s=0.5)
    cfg = {"format": "tfplace.train_config", "version": 1, "graphs": [{"model": "tiny_mlp", "batch_size": 16}],
           "clusters": [os.path.join(ROOT, "clusters", "local_cpu.json")], "max_groups": 4}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    config = load_train_config(path)
    bundle = os.path.join(ROOT, "graph_defs", "zoo", "tiny_mlp_b16_sgd.json")
    plain = train_lib.build_task("t", bundle, 16, config.clusters[0], None, config)
    with_over = train_lib.build_task("t", bundle, 16, config.clusters[0], None, config, over)
    assert plain.overheads is None and with_over.overheads.step_s == 0.5
    from tfplace.formats.strategy import even_strategy
    st = even_strategy(plain.cluster.device_names, 16, 4)
    assert with_over.simulate(st).iteration_time_s == pytest.approx(plain.simulate(st).iteration_time_s + 0.5,
                                                                     rel=1e-9)
