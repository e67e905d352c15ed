"""benchmarks/fidelity_bench.py --replay: recorded runs re-simulated with the current simulator
(no cluster, no TensorFlow session): the same strategies, profile and overheads give the same
simulated times, and the error is taken against the recorded real steps."""

import os
import sys

import pytest

from tfplace.cluster import load_cluster
from tfplace.graph_loader import load_op_graph
from tfplace.jsonio import write_json
from tfplace.lowering import lower
from tfplace.simulator import simulate
from tfplace.strategy import even_strategy
from tfplace.testing import uniform_profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import fidelity_bench as fb  # noqa: E402


@pytest.mark.parametrize("ratio, expected", [(1.0, 0.0), (1.25, 0.2), (0.8, 0.25)])
def test_replay_compares_recorded_real_steps_with_the_simulator(tmp_path, capsys, ratio, expected):
    # real = sim * ratio for every strategy: |sim - real| / real = |1 - ratio| / ratio
    from tfplace.baselines.problem import make_problem
    bundle = "graph_defs/zoo/tiny_mlp_b16_sgd.json"  # committed
    graph = load_op_graph(os.path.join(ROOT, bundle))
    batch = int(graph.reference_batch_size)
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    profile = uniform_profile(graph, ["CPU"], 1e-5)
    overheads = {"step_s": 5e-4, "message_cpu_s": {"CPU|CPU": 1e-4}, "transfer_gap_s": 5e-5}
    with_over = fb.with_overheads(profile, overheads)
    grouping = make_problem(graph, cluster, with_over, max_groups=fb.MAX_GROUPS, global_batch_size=batch).grouping
    devs = list(cluster.device_names)
    rows = []
    for name, st in (("even", even_strategy(devs, batch, fb.MAX_GROUPS)),
                     ("even_ps", even_strategy(devs, batch, fb.MAX_GROUPS, "ps", devs[1])),
                     ("single", even_strategy(devs[:1], batch, fb.MAX_GROUPS))):
        sim = simulate(lower(graph, grouping, cluster, st, with_over), cluster).iteration_time_s
        rows.append({"name": name, "strategy": st.to_json(), "real_s": [sim * ratio] * 3, "sim_s": sim})
    path = tmp_path / "run.json"
    write_json(path, {"format": fb.RECORD_FORMAT, "version": 1, "cluster": "local_cpu.json", "date": "test",
                      "overheads": overheads,
                      "models": {"tiny_mlp": {"bundle": bundle, "profile": profile.to_json(), "rows": rows}}})
    assert fb.main(["--replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"median {expected:.1%} (recorded {expected:.1%})" in out, out


def test_replay_rejects_a_file_of_another_format(tmp_path):
    from tfplace.errors import InputError
    path = tmp_path / "run.json"
    write_json(path, {"format": "tfplace.strategy", "version": 1})
    with pytest.raises(InputError):
        fb.replay([str(path)])
