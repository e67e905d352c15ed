"""Checkpoints of a hooked run: N steps, a restart (a new graph, hook and
MonitoredTrainingSession on a cluster that forgot every variable, same checkpoint_dir) and N
more steps train exactly like 2N uninterrupted steps on the same batches: every mirror of every
variable, optimizer slot (Momentum, Adam m/v and beta powers) and the global step agree to 1e-5
relative, and so do the losses of the last N steps. The final checkpoint holds the trained
values under the script's names: the plain single-device script restores them with its own
tf.compat.v1.train.Saver. So do the checkpoints of a Saver the script brings: one passed in
MonitoredTrainingSession's Scaffold (CheckpointSaverHook saves with it before any hook of the
script runs; it used to save the untrained values under the trained global step) and one in the
graph's SAVERS collection.
"""

import os

import numpy as np
import pytest

from tfplace.testing import mlp_training_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "clusters", "local_cpu.json")
N, BATCH, RTOL = 3, 16, 1e-5


def _strategy_path(name, tmp_dir):
    if name == "uneven":  # 8 / 4 / 2+2 micro-batches, all-reduce
        return os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json")
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.strategy import even_strategy, save_strategy
    path = os.path.join(tmp_dir, "data_parallel.json")
    save_strategy(even_strategy(list(load_cluster(CLUSTER).device_names), BATCH, 64), path)
    return path


def _batches():
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((BATCH, 16)).astype(np.float32), rng.integers(0, 4, BATCH).astype(np.int32))
            for _ in range(2 * N)]


def _train(lc, strategy_path, optimizer, batches, checkpoint_dir, saver="hook"):
    """One lifetime of the script: trains on `batches`, saving to checkpoint_dir (every 2 steps
    and at the end) with the hook's Saver (`saver="hook"`), the script's own in the Scaffold
    ("scaffold") or the script's own in the SAVERS collection ("collection"). Returns (losses,
    global step, {variable: [mirror values]}); then the servers forget every variable, as a
    restarted cluster would."""
    import tensorflow as tf
    from tfplace.rewrite.hook import SCOPE, PlacementHook
    losses = []
    with tf.Graph().as_default() as g:
        x, y, loss, train_op, _, step = mlp_training_script(8, optimizer, global_step=True)
        own = tf.compat.v1.train.Saver(max_to_keep=2) if saver != "hook" else None
        if saver == "collection":
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, own)
        scaffold = tf.compat.v1.train.Scaffold(saver=own) if saver == "scaffold" else None
        hook = PlacementHook(strategy_path, CLUSTER, train_op, loss)
        with tf.compat.v1.train.MonitoredTrainingSession(
                master=lc.target, config=hook.session_config(lc.session_config()), hooks=[hook], scaffold=scaffold,
                checkpoint_dir=checkpoint_dir, save_checkpoint_steps=2, save_checkpoint_secs=None,
                save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None) as sess:
            for fx, fy in batches:
                losses.append(sess.run([train_op, hook.loss], feed_dict={x: fx, y: fy})[1])
            mirrors = sess.run({name: [g.get_tensor_by_name(f"{SCOPE}/{r}") for r in reads]
                                for name, reads in hook.step.variables.items()})
            global_step = sess.run(step)
    tf.compat.v1.Session.reset(lc.target)
    return losses, global_step, mirrors


def _plain_restore(optimizer, checkpoint):
    """The single-device script restoring a checkpoint with its own Saver."""
    import tensorflow as tf
    with tf.Graph().as_default():
        mlp_training_script(8, optimizer, global_step=True)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, checkpoint)
            return {v.op.name: sess.run(v) for v in tf.compat.v1.global_variables()}


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / (np.max(np.abs(b)) + 1e-8))


@pytest.fixture(scope="module")
def local_cluster():
    from tfplace.runtime.local_cluster import LocalCluster
    with LocalCluster(num_tasks=3, threads_per_task=[1, 1, 1]) as lc:
        yield lc


@pytest.fixture(scope="module")
def runs(local_cluster, tmp_path_factory):
    """(optimizer, strategy) -> the uninterrupted and the resumed run (computed once per case)."""
    done = {}

    def get(optimizer, strategy, saver):
        if (optimizer, strategy, saver) not in done:
            tmp = str(tmp_path_factory.mktemp(f"{optimizer}_{strategy}_{saver}"))
            path, batches = _strategy_path(strategy, tmp), _batches()
            whole = _train(local_cluster, path, optimizer, batches, os.path.join(tmp, "whole"), saver)
            resumed_dir = os.path.join(tmp, "resumed")
            first = _train(local_cluster, path, optimizer, batches[:N], resumed_dir, saver)
            second = _train(local_cluster, path, optimizer, batches[N:], resumed_dir, saver)
            done[(optimizer, strategy, saver)] = whole, first, second, resumed_dir
        return done[(optimizer, strategy, saver)]
    return get


CASES = [(o, s, "hook") for s in ("data_parallel", "uneven") for o in ("sgd", "momentum", "adam")] + [
    ("adam", "uneven", "scaffold"), ("momentum", "data_parallel", "collection")]


@pytest.mark.multiprocess
@pytest.mark.parametrize("optimizer,strategy,saver", CASES)
def test_resumed_run_continues_like_an_uninterrupted_one(runs, optimizer, strategy, saver):
    (losses, whole_step, whole), first, (resumed_losses, resumed_step, resumed), _ = runs(optimizer, strategy, saver)
    assert first[1] == N and whole_step == resumed_step == 2 * N
    assert _rel(resumed_losses, np.asarray(losses[N:])) <= RTOL, "the resumed steps' losses differ"
    expected = {"sgd": 4 + 1, "momentum": 2 * 4 + 1, "adam": 3 * 4 + 3}[optimizer]  # + step, beta powers
    assert len(whole) == expected, sorted(whole)
    for name, mirrors in resumed.items():
        if name != "global_step" and "bias" not in name:
            assert not np.array_equal(whole[name][0], first[2][name][0]), f"{name} did not train after step {N}"
        for k, m in enumerate(mirrors):
            assert _rel(m, whole[name][0]) <= RTOL, f"{name} mirror {k}: resumed run differs"


@pytest.mark.multiprocess
@pytest.mark.parametrize("optimizer,strategy,saver", CASES)
def test_plain_script_restores_the_trained_values(runs, optimizer, strategy, saver):
    import tensorflow as tf
    (_, _, whole), _, _, resumed_dir = runs(optimizer, strategy, saver)
    checkpoint = tf.train.latest_checkpoint(resumed_dir)
    assert checkpoint.endswith(f"-{2 * N}"), checkpoint
    restored = _plain_restore(optimizer, checkpoint)
    assert set(restored) == set(whole)
    for name, value in restored.items():
        assert _rel(value, whole[name][0]) <= RTOL, f"{name}: the checkpoint does not hold the trained value"


class _Stop(Exception):
    pass


@pytest.mark.multiprocess
def test_a_session_ended_by_an_error_leaves_the_next_sessions_first_save_as_restored(local_cluster, tmp_path):
    """A session closed by an exception skips the hooks' end(): the hook's flag stays set on the
    servers, and the next session's first save (CheckpointSaverHook's, before the hook's copy)
    synced the replicas, holding a step the checkpoint never saw, into what it had just restored,
    saving them under the restored step. The restore now writes every replica too (the hook's own
    Saver included): that save holds the restored values."""
    import tensorflow as tf
    from tfplace.rewrite.hook import PlacementHook
    path, batches = _strategy_path("data_parallel", str(tmp_path)), _batches()
    ckpt_dir = str(tmp_path / "ckpt")
    with tf.Graph().as_default():
        x, y, loss, train_op, _, _ = mlp_training_script(8, "momentum", global_step=True)
        hook = PlacementHook(path, CLUSTER, train_op, loss)

        def session():
            return tf.compat.v1.train.MonitoredTrainingSession(
                master=local_cluster.target, config=hook.session_config(local_cluster.session_config()), hooks=[hook],
                checkpoint_dir=ckpt_dir, save_checkpoint_steps=2, save_checkpoint_secs=None,
                save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None)
        with pytest.raises(_Stop):
            with session() as sess:
                for fx, fy in batches[:3]:  # saves at steps 0 and 2; step 3 lives in the replicas only
                    sess.run(train_op, feed_dict={x: fx, y: fy})
                raise _Stop()
        saved = tf.train.load_checkpoint(tf.train.latest_checkpoint(ckpt_dir))
        before = {name: saved.get_tensor(name) for name in saved.get_variable_to_shape_map()}
        with session():
            pass  # restores step 2, saves it again at creation
    tf.compat.v1.Session.reset(local_cluster.target)
    again = tf.train.load_checkpoint(tf.train.latest_checkpoint(ckpt_dir))
    assert tf.train.latest_checkpoint(ckpt_dir).endswith("-2") and before["global_step"] == 2
    for name, value in before.items():
        assert np.array_equal(again.get_tensor(name), value), f"{name}: the first save is not what was restored"
