import json
import os

from tfplace.formats.config import load_train_config
from tfplace.formats.strategy import load_strategy, validate_strategy
from tfplace.policy import planner, train_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_plan_zero_shot_on_another_cluster_is_never_worse_than_baselines(tmp_path):
    cfg = {"format": "tfplace.train_config", "version": 1,
           "graphs": [{"graph": os.path.join(REPO, "graph_defs/zoo/tiny_mlp_b16_sgd.json"), "batch_size": 16}],
           "clusters": [os.path.join(REPO, "clusters/two_kind_4gpu.json")], "max_groups": 16,
           "budget": {"steps": 2}, "checkpoint_every_steps": 1, "output_dir": str(tmp_path / "run"),
           "network": {"hidden_size": 16, "num_message_passing_steps": 1, "mlp_layers": 1},
           "rl": {"samples_per_step": 2}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    config = load_train_config(tmp_path / "c.json")
    train_lib.train(config, log=lambda m: None, progress=False)
    out = str(tmp_path / "strategy.json")
    r = planner.plan(config.output_dir, graph=os.path.join(REPO, "graph_defs/zoo/tiny_cnn_b16_s16_sgd.json"),
                     model=None, batch_size=None, cluster=os.path.join(REPO, "clusters/heterog_testbed.json"),
                     search_seconds=1.0, samples=2, out=out)
    assert r.best.effective_time_s <= min(b["time_s"] for b in r.baselines.values() if not b["oom"]) + 1e-12
    s = load_strategy(out)
    validate_strategy(s, None, list(s.all_devices()), 16)
    assert "best baseline" in planner.format_result(r)
