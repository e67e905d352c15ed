"""Pre-training by expert iteration: the task draw respects the split, imitation moves the policy
to the search's targets (a flipped loss would not), and an interrupted run resumes."""

import dataclasses
import json
import os

import numpy as np
import pytest

from tfplace.formats.config import NetworkConfig, RLConfig
from tfplace.policy import actions as A
from tfplace.policy import distribution, pretrain, pretrained
from tfplace.policy.testing_fixtures import tiny_task

SMALL = NetworkConfig(hidden_size=16, num_message_passing_steps=1, mlp_layers=1)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = {("tiny_mlp", 16): "tiny_mlp_b16_sgd.json", ("tiny_cnn", 16): "tiny_cnn_b16_s16_sgd.json"}


def bundle_for_entry(entry):
    """The committed zoo bundle of a tiny model (the binaries export on demand instead)."""
    return os.path.join(REPO, "graph_defs", "zoo", ZOO[(entry.model, entry.batch_size)])


def test_the_task_draw_is_seeded_and_never_holds_out_data():
    split = distribution.load_split()
    a, b = pretrain.draw_tasks(split, 24, 0), pretrain.draw_tasks(split, 24, 0)
    assert [t.label for t in a] == [t.label for t in b]
    assert [t.label for t in pretrain.draw_tasks(split, 24, 1)] != [t.label for t in a]
    held = {m["model"] for m in split.heldout_models}
    assert not held & {t.model for t in a}
    held_shapes = {s.name for s in split.heldout_shapes}
    assert not any(t.cluster_name.rsplit("_s", 1)[0] in held_shapes for t in a)
    assert len({t.label for t in a}) == 24
    counts = {m["model"] + str(m["batch_size"]): 0 for m in split.train_models}
    for t in a:
        counts[t.model + str(t.batch_size)] += 1
    assert max(counts.values()) - min(counts.values()) <= 1  # every model entry about equally often


@pytest.mark.parametrize("sign, closer", [(1.0, True), (-1.0, False)])
def test_imitation_moves_the_greedy_strategy_to_the_target(sign, closer, monkeypatch):
    """40 imitation steps (learning rate 0.01) towards a fixed target action: the greedy action
    then agrees with the target on most entries; with the gradient's sign flipped it agrees on
    fewer than before."""
    import tensorflow as tf
    tf.keras.utils.set_random_seed(5)
    task = tiny_task("mlp", "two", batch_size=8, max_groups=8)  # two devices of different kinds
    obs = task.features.as_observation()
    learner = pretrained.new_learner(SMALL, RLConfig(learning_rate=0.01))
    # one random decision for every group: groups (or devices) whose features tie cannot learn
    # different targets
    one = A.random_action(np.random.default_rng(1), 1, task.num_devices)
    target = {k: np.repeat(v, task.num_groups, axis=0) for k, v in one.items()}

    def agreement():
        g = learner.greedy(obs)
        return np.mean(np.concatenate([(g[k] == target[k]).ravel() for k in A.ACTION_KEYS]))
    before = agreement()
    if sign < 0:
        original = learner._imitation_grads

        def flipped(o, t):
            loss, grads = original(o, t)
            return loss, [-g for g in grads]
        monkeypatch.setattr(learner, "_imitation_grads", flipped)
    for _ in range(40):
        learner.imitate([(obs, target)])
    after = agreement()
    if closer:
        assert after >= 0.9 and after > before
    else:
        assert after < before


def _tiny_split(tmp_path):
    body = {"format": "tfplace.policy_split", "version": 1, "seed": 0,
            "train_models": [{"model": "tiny_mlp", "batch_size": 16}, {"model": "tiny_cnn", "batch_size": 16}],
            "heldout_models": [{"model": "tiny_transformer", "batch_size": 24}],
            "train_shapes": [{"num_devices": 3, "num_kinds": 2, "num_hosts": 2, "nic": "10GbE", "intra": "PCIe3",
                              "memory_cap_bytes": None}],
            "clusters_per_train_shape": 2,
            "heldout_shapes": [s.to_json() for s in distribution.load_split().heldout_shapes]}
    path = tmp_path / "split.json"
    path.write_text(json.dumps(body))
    return str(path)


@pytest.mark.slow
def test_pretrain_learns_the_targets_writes_provenance_and_resumes(tmp_path):
    out = str(tmp_path / "policy.json")
    config = pretrain.PretrainConfig(out=out, seed=0, num_tasks=3, num_validation_tasks=1, rounds=2, search_seconds=0.5, epochs=25,
                                     rl_steps=2, tasks_per_update=3, max_groups=16, network=SMALL,
                                     split_path=_tiny_split(tmp_path))
    logs = []
    prov = pretrain.pretrain(config, logs.append, bundle_for_entry)
    first = prov["rounds"][0]
    assert first["loss_last_epoch"] < first["loss_first_epoch"]
    assert first["greedy_over_target_after"] < first["greedy_over_target_before"]
    _, weights = pretrained.load_weights(out)
    assert weights.provenance["tasks"] == prov["tasks"] and weights.network == SMALL
    targets = json.load(open(os.path.join(config.work, "targets.json")))
    drawn = prov["tasks"] + prov["validation_tasks"]
    assert len(drawn) == 4 and sorted(targets["done"]) == sorted(f"{r}:{t}" for r in (0, 1) for t in drawn)
    # a second run finds both rounds done: no search, no imitation, the same round weights
    again = []
    pretrain.pretrain(config, again.append, bundle_for_entry)
    assert sum("resumed from" in m for m in again) == 2
    assert not any("search" in m and "target" in m for m in again)


@pytest.mark.parametrize("restored", [True, False])
def test_imitation_resumed_with_the_saved_optimizer_continues_exactly(tmp_path, restored):
    """3 imitation steps, the weights and optimizer state saved, a new learner restored from them
    and 3 more steps: the same weights as 6 steps straight. Without the optimizer state (Adam's
    moments start again) they differ, which is what a resumed pre-training run used to do."""
    import tensorflow as tf
    task = tiny_task("mlp", "two", batch_size=8, max_groups=8)
    obs = task.features.as_observation()
    one = A.random_action(np.random.default_rng(1), 1, task.num_devices)
    target = {k: np.repeat(v, task.num_groups, axis=0) for k, v in one.items()}

    def learner():
        tf.keras.utils.set_random_seed(5)
        return pretrained.new_learner(SMALL, RLConfig(learning_rate=0.01))
    straight = learner()
    for _ in range(6):
        straight.imitate([(obs, target)])
    first = learner()
    for _ in range(3):
        first.imitate([(obs, target)])
    pretrained.save_weights(first, str(tmp_path / "round0.json"), SMALL, 8)
    pretrain.save_optimizer(first, str(tmp_path / "round0.optimizer.json"))
    second = learner()
    pretrained.assign_weights(second, *pretrained.read_weights(str(tmp_path / "round0.json")))
    if restored:
        assert pretrain.restore_optimizer(second, str(tmp_path / "round0.optimizer.json"))
    for _ in range(3):
        second.imitate([(obs, target)])
    same = all(np.allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-8)
               for a, b in zip(straight.network.trainable_variables, second.network.trainable_variables))
    assert same == restored


@pytest.mark.parametrize("change, refused", [
    (dict(seed=1), "settings.seed"),                       # another task draw: the targets are not its
    (dict(network=dataclasses.replace(SMALL, hidden_size=32)), "settings.network"),
    (dict(search_seconds=2.0), "settings.search_seconds"),
    (dict(rounds=3), None),                                # more rounds continue the folder
    (dict(rl_steps=0), None),
    (dict(out="other.json"), None),
])
def test_a_work_folder_resumes_only_the_settings_it_was_made_with(tmp_path, change, refused):
    from tfplace.formats.errors import InputError
    base = pretrain.PretrainConfig(out=str(tmp_path / "policy.json"), num_tasks=3, network=SMALL,
                                   work_dir=str(tmp_path / "work"))
    os.makedirs(base.work)
    pretrain.check_work_settings(base)     # a new folder: the settings are recorded
    pretrain.check_work_settings(base)     # the same settings: resumed
    other = dataclasses.replace(base, **change)
    if refused is None:
        pretrain.check_work_settings(other)
        return
    with pytest.raises(InputError) as info:
        pretrain.check_work_settings(other)
    assert refused in str(info.value) and "--work_dir" in str(info.value), str(info.value)


@pytest.mark.parametrize("canonical", [False, True])
def test_expert_targets_are_relabelled_for_a_network_that_reads_the_device_rank(canonical, monkeypatch):
    # the search "finds" a strategy that puts every group on v100_1 and none on v100_0, its
    # identical twin: the target of a network that reads the device rank is the same strategy
    # on v100_0 (the first of the pair carries the work), with its own simulated time
    import types
    from tfplace.policy import planner
    task = tiny_task("mlp", "four")
    found = A.proportional_action(task.num_groups, task.num_devices)
    found["shares"][:] = 0
    found["shares"][:, 1] = 2
    entry = types.SimpleNamespace(action=found, source="search", strategy=task.decode(found))
    monkeypatch.setattr(planner, "plan_task", lambda *a, **k: types.SimpleNamespace(best=entry, best_action=entry))
    learner = pretrained.new_learner(dataclasses.replace(SMALL, device_rank_feature=int(canonical)))
    act, t, _ = pretrain.expert_target(learner, task, 0.5, seed=1, canonical=canonical)
    assert t == task.evaluate(act).effective_time_s
    on = [task.cluster.device_names[int(i)] for i in np.flatnonzero(act["shares"].any(axis=0))]
    assert on == (["v100_0"] if canonical else ["v100_1"])


def test_a_bad_split_leaves_no_work_folder_so_the_corrected_command_runs(tmp_path):
    """The split is read before the work folder records its settings: a wrong --split is refused
    (InputError) and leaves nothing that would refuse the run without it."""
    from tfplace.formats.errors import InputError
    bad = tmp_path / "not_a_split.json"
    bad.write_text(json.dumps({"format": "tfplace.strategy", "version": 1}))
    config = pretrain.PretrainConfig(out=str(tmp_path / "policy.json"), num_tasks=3, network=SMALL,
                                     split_path=str(bad))
    with pytest.raises(InputError):
        pretrain.pretrain(config, lambda message: None, resolve_bundle=None)
    assert not os.path.exists(config.work)
    os.makedirs(config.work)  # as the corrected run makes it
    pretrain.check_work_settings(dataclasses.replace(config, split_path=None))  # not refused: nothing recorded


class _Stopped(Exception):
    """What the handler before pre-training raises (the command lines': KeyboardInterrupt, Terminated)."""


@pytest.fixture
def raising_handlers():
    """SIGINT and SIGTERM raise _Stopped (with the signal) for the test, then are put back."""
    import signal

    def handler(signum, frame):
        raise _Stopped(signum)
    kept = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    yield handler
    for s, h in kept.items():
        signal.signal(s, h)


@pytest.mark.parametrize("signame, signals_sent, finished", [
    ("SIGINT", 1, 1),    # the update under way finishes; the next step's safe point stops
    ("SIGTERM", 1, 1),
    ("SIGINT", 2, 0),    # a second signal stops at once, inside the first update
])
def test_a_signal_during_a_reinforce_update_waits_for_the_next_step(raising_handlers, signame, signals_sent,
                                                                     finished):
    """Ctrl-C landing inside a TensorFlow update used to cut it half-way ("AssertionError: Concurrent
    access?" from the next call); now the update finishes and the run stops before the next one."""
    import signal
    import tensorflow as tf
    tf.keras.utils.set_random_seed(5)
    task = tiny_task("mlp", "two", batch_size=8, max_groups=8)
    learner = pretrained.new_learner(SMALL, RLConfig(learning_rate=0.01))
    greedy = learner.greedy(task.features.as_observation())
    targets = {task.label: {"action": A.action_to_json(greedy),
                            "effective_time_s": task.evaluate(greedy).effective_time_s}}
    spec = pretrain.TaskSpec(task.label, "tiny_mlp", 8, "two", {})
    config = pretrain.PretrainConfig(out="", rl_steps=3, rl_samples=2, tasks_per_update=1)
    update, calls = learner.update, []

    def update_then_signalled(batch):
        calls.append("started")
        update(batch)
        for _ in range(signals_sent):
            os.kill(os.getpid(), getattr(signal, signame))
            sum(range(1000))  # Python code after the signal: where its handler runs
        calls.append("finished")
    learner.update = update_then_signalled
    with pytest.raises(_Stopped) as stopped:
        with pretrain.stop_at_safe_points() as stop_here:
            pretrain._reinforce(learner, [spec], {task.label: task}, targets, config, np.random.default_rng(0),
                                lambda m: None, stop_here)
    assert stopped.value.args == (getattr(signal, signame),)
    assert calls.count("started") == 1 and calls.count("finished") == finished
    assert signal.getsignal(signal.SIGINT) is signal.getsignal(signal.SIGTERM) is raising_handlers


def test_a_signal_held_through_the_last_stretch_still_ends_the_run_as_that_signal(raising_handlers, monkeypatch):
    """After the last safe point (the last step, the last round's imitation) a held signal is not
    dropped: the run ends with it (the command lines: exit 130 / 143), as its notice said."""
    import signal

    def last_stretch(config, log, resolve_bundle, stop_here):
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(1000))  # Python code after the signal: where its handler runs
        return {"written": True}
    monkeypatch.setattr(pretrain, "_pretrain", last_stretch)
    with pytest.raises(_Stopped) as stopped:
        pretrain.pretrain(pretrain.PretrainConfig(out=""), lambda m: None, None)
    assert stopped.value.args == (signal.SIGTERM,)


def test_a_handler_that_returns_leaves_later_signals_held():
    """A handler there before pre-training that only logs and returns (a user's own) is called at
    the safe point, and pre-training goes on holding signals: the next one waits for the next safe
    point too, instead of reaching that handler mid-step (the handlers used to be put back first)."""
    import signal
    seen = []
    kept = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with pretrain.stop_at_safe_points() as stop_here:
            for delivered in range(2):
                os.kill(os.getpid(), signal.SIGTERM)
                sum(range(1000))  # Python code after the signal: where its handler runs
                assert len(seen) == delivered  # held, not handed over mid-step
                stop_here()
                assert len(seen) == delivered + 1
        assert seen == [signal.SIGTERM, signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, kept)
