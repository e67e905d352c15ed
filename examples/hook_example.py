"""A tf.compat.v1 training script made distributed by one hook (tfplace.rewrite.hook.PlacementHook).

    python examples/hook_example.py [strategy.json] [steps] [checkpoint_dir]

Starts a local 3-task cluster (clusters/local_cpu.json), builds a small MLP, and trains it with
MonitoredTrainingSession; the only tfplace line is the hook. With a checkpoint_dir, a second run
continues from the first one's last checkpoint (global step included), and the checkpoints are
the plain script's: its own tf.compat.v1.train.Saver restores the trained values.
"""
import os
import sys

import numpy as np
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(batch_features=16):
    v1 = tf.compat.v1
    x = v1.placeholder(tf.float32, [None, batch_features], name="features")
    y = v1.placeholder(tf.int32, [None], name="labels")
    h = v1.layers.dense(x, 32, activation=tf.nn.relu, name="dense_0")
    logits = v1.layers.dense(h, 4, name="dense_1")
    loss = tf.identity(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)),
                       name="loss")
    step = v1.train.get_or_create_global_step()
    train_op = tf.group(v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step), name="train_op")
    return x, y, loss, train_op


def main(strategy_path, steps=5, checkpoint_dir=None):
    from tfplace.rewrite.hook import PlacementHook
    from tfplace.runtime.local_cluster import LocalCluster
    tf.compat.v1.disable_eager_execution()
    rng = np.random.default_rng(0)
    with tf.Graph().as_default():
        x, y, loss, train_op = build()
        # reads the strategy and the cluster (a bad file is an InputError) before any server starts
        hook = PlacementHook(strategy_path, os.path.join(ROOT, "clusters", "local_cpu.json"), train_op, loss)
        with LocalCluster(num_tasks=3) as lc:
            _train(lc, hook, x, y, train_op, steps, checkpoint_dir, rng)


def _train(lc, hook, x, y, train_op, steps, checkpoint_dir, rng):
    """The script's own training loop, on the cluster `lc`, with the hook."""
    config = hook.session_config(lc.session_config())
    with tf.compat.v1.train.MonitoredTrainingSession(master=lc.target, config=config, checkpoint_dir=checkpoint_dir,
                                                     hooks=[hook]) as sess:
        first = sess.run(tf.compat.v1.train.get_global_step())   # > 0 when a checkpoint was restored
        for i in range(first, first + steps):
            feed = {x: rng.standard_normal((16, 16)).astype(np.float32), y: rng.integers(0, 4, 16)}
            _, value = sess.run([train_op, hook.loss], feed_dict=feed)  # unchanged training loop
            print(f"step {i}: loss {value:.4f}")


def cli(argv):
    """The command line of the module docstring: the exit status (2, with one line on stderr, for
    bad arguments and for bad input, tfplace's InputError)."""
    from tfplace.formats.errors import InputError
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__.strip())
        return 0
    usage = "error: usage: python examples/hook_example.py [strategy.json] [steps] [checkpoint_dir]. Fix: "
    if len(argv) > 3:
        print(usage + f"give at most these three arguments ({len(argv)} given)", file=sys.stderr)
        return 2
    if len(argv) > 1 and not argv[1].isdigit():
        print(usage + "give steps as a whole number, e.g. 5", file=sys.stderr)
        return 2
    try:
        main(argv[0] if argv else os.path.join(ROOT, "examples", "formats", "strategy_local_cpu.json"),
             int(argv[1]) if len(argv) > 1 else 5, argv[2] if len(argv) > 2 else None)
    except InputError as err:  # a strategy or cluster file tfplace refuses: the file, the field, the fix
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
