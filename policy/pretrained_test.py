"""Policy weights files: exact round trip, one clear error for a file from another network or a
damaged one, and the shipped pre-trained policy (loads, says how it was made)."""

import dataclasses
import json
import os

import numpy as np
import pytest

from tfplace.formats.config import NetworkConfig
from tfplace.formats.errors import InputError
from tfplace.policy import pretrained
from tfplace.policy.testing_fixtures import tiny_task

SMALL = NetworkConfig(hidden_size=8, num_message_passing_steps=1, mlp_layers=1)


@pytest.mark.parametrize("network", [SMALL, dataclasses.replace(SMALL, device_rank_feature=1)])
def test_weights_round_trip_bit_exactly_and_plan_the_same(tmp_path, network):
    learner = pretrained.new_learner(network)
    path = str(tmp_path / "w.json")
    pretrained.save_weights(learner, path, network, 16, {"seed": 3})
    back, weights = pretrained.load_weights(path)
    assert weights.network == network and weights.max_groups == 16 and weights.provenance == {"seed": 3}
    for a, b in zip(learner.network.trainable_variables, back.network.trainable_variables):
        assert a.name == b.name and np.array_equal(a.numpy(), b.numpy())
    obs = tiny_task("cnn", "four").features.as_observation()
    assert all(np.array_equal(learner.greedy(obs)[k], v) for k, v in back.greedy(obs).items())


def _edit(path, change):
    with open(path) as f:
        body = json.load(f)
    change(body)
    with open(path, "w") as f:
        json.dump(body, f)


@pytest.mark.parametrize("change, field", [
    (lambda b: b.update(format="tfplace.cluster"), "format"),
    (lambda b: b.update(version=9), "version"),
    (lambda b: b["network"].update(hidden_size=0), "network"),
    (lambda b: b["network"].update(device_rank_feature=2), "network"),
    (lambda b: b["network"].update(device_rank_feature=True), "network"),
    (lambda b: b.update(max_groups="64"), "max_groups"),
    (lambda b: b["variables"][0]["values"].pop(), "variables[0]"),
    (lambda b: b["network"].update(hidden_size=16), "variables[0]"),  # another architecture: shapes differ
    (lambda b: b["variables"].pop(), "variables"),
])
def test_a_bad_weights_file_is_one_error_naming_the_field(tmp_path, change, field):
    path = str(tmp_path / "w.json")
    pretrained.save_weights(pretrained.new_learner(SMALL), path, SMALL, 16)
    _edit(path, change)
    with pytest.raises(InputError) as err:
        pretrained.load_weights(path)
    assert err.value.source == path and err.value.field == field, str(err.value)
    assert "Fix:" in str(err.value)


def test_the_shipped_policy_loads_and_says_how_it_was_made():
    learner, weights = pretrained.load_pretrained()
    assert weights.path == pretrained.PRETRAINED_PATH
    prov = weights.provenance
    assert prov["command"] == pretrained.PRETRAIN_COMMAND and prov["seed"] == 0
    assert prov["split"] == "policy/split.json" and len(prov["tasks"]) == prov["config"]["num_tasks"]
    # it learned: its greedy strategies are closer to the search's targets than before imitation
    first = prov["rounds"][0]
    assert first["greedy_over_target_after"] < first["greedy_over_target_before"]
    obs = tiny_task("cnn", "four").features.as_observation()
    assert set(learner.greedy(obs)) == {"shares", "micro", "sync", "ps_device", "priority"}


def _train_config(tmp_path, **extra):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = {"format": "tfplace.train_config", "version": 1,
           "graphs": [{"graph": os.path.join(repo, "graph_defs/zoo/tiny_mlp_b16_sgd.json"), "batch_size": 16}],
           "clusters": [os.path.join(repo, "clusters/two_kind_4gpu.json")], "max_groups": 16,
           "budget": {"steps": 2}, "output_dir": str(tmp_path / "run"), **extra}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    return str(tmp_path / "c.json")


def test_training_starts_from_init_policy_with_its_network_sizes(tmp_path):
    """init_policy gives the network sizes and the first step's weights; a config whose network
    section differs is refused naming that field."""
    from tfplace.formats.config import load_train_config
    from tfplace.policy import train_lib
    weights = str(tmp_path / "w.json")
    learner = pretrained.new_learner(SMALL)
    pretrained.save_weights(learner, weights, SMALL, 16)
    config = load_train_config(_train_config(tmp_path, init_policy=weights))
    assert config.network == SMALL and config.init_policy == weights
    trainer = train_lib.Trainer(config, log=lambda m: None, progress=False)
    for a, b in zip(learner.network.trainable_variables, trainer.network.trainable_variables):
        assert np.array_equal(a.numpy(), b.numpy())
    with pytest.raises(InputError) as err:
        load_train_config(_train_config(tmp_path, init_policy=weights, network={"hidden_size": 32}))
    assert err.value.field == "network" and "init_policy" in err.value.problem
    shipped = load_train_config(_train_config(tmp_path, init_policy="pretrained"))
    assert shipped.init_policy == pretrained.PRETRAINED_PATH


def test_a_training_run_reads_its_init_policy_once_and_a_changed_file_again(tmp_path, monkeypatch):
    """Loading the config (network sizes) and starting the trainer (the weights) parse the file
    once; a file written anew is parsed again, so an edited file is never served stale."""
    from tfplace.formats import jsonio
    from tfplace.formats.config import load_train_config
    from tfplace.policy import train_lib
    weights = str(tmp_path / "w.json")
    pretrained.save_weights(pretrained.new_learner(SMALL), weights, SMALL, 16)
    parsed = []
    real = jsonio.FieldReader.from_file.__func__

    def counting(cls, path, *a, **k):
        if os.path.abspath(path) == os.path.abspath(weights):
            parsed.append(path)
        return real(cls, path, *a, **k)
    monkeypatch.setattr(jsonio.FieldReader, "from_file", classmethod(counting))
    config = load_train_config(_train_config(tmp_path, init_policy=weights))
    train_lib.Trainer(config, log=lambda m: None, progress=False)
    assert len(parsed) == 1
    _edit(weights, lambda b: b["provenance"].update(seed=5, note="written again"))
    _, again = pretrained.load_weights(weights)
    assert len(parsed) == 2 and again.provenance["seed"] == 5
