"""Message costs on the local cluster: one chain of hops by size, and several chains at once.

    .venv/bin/python benchmarks/message_probe.py [--hetero] [--hops 12] [--steps 20] [--repeats 2]

What the runtime overheads (tfplace.profiling.overheads_probe) do not cover. They time one
chain of 16-byte hops between one pair of tasks; a model's step sends tensors of any size, and a
strategy with uneven shares per group sends many at once between all three tasks. Prints, per
hop (the wall of a chain of --hops dependent hops between two tasks, less the same chain kept on
one task, over --hops):
  * sizes 16 B ... 1 MiB between tasks 1-2 and 0-1, next to the link the simulator charges
    (Cluster.transfer_seconds of the cluster file; the simulator adds each message's CPU on
    the lanes, which the hop's wall holds);
  * 16-byte chains alone (1-2, 0-1, 0-2), all three at once, and two at once on one pair: if
    messages did not compete, a hop of several chains at once would cost what one chain's does.
Each wall is the median of --steps steps after 3 warm-up steps; --repeats passes.
--hetero: the emulated heterogeneous cluster and client pinning of fidelity_bench.
"""

from __future__ import annotations

import argparse
import os
import sys

from tfplace.profiling.overheads_probe import hop_chain, median_call_seconds

import fidelity_bench as fb

SIZES_BYTES = (16, 64 << 10, 256 << 10, 1 << 20)
SIZE_PAIRS = ((1, 2), (0, 1))
CONCURRENT = (("1-2", ((1, 2),)), ("0-1", ((0, 1),)), ("0-2", ((0, 2),)),
              ("all three", ((1, 2), (0, 1), (0, 2))), ("1-2 twice", ((1, 2), (1, 2))),
              ("0-1 twice", ((0, 1), (0, 1))))


def hop_seconds(lc, chains, nbytes: int, hops: int, steps: int) -> float:
    """Wall per hop of `chains` (pairs of tasks) running at once, each `hops` dependent hops of
    an `nbytes` tensor, less the same chains kept on their first task."""
    import tensorflow as tf
    from tfplace.runtime.step_runner import step_session_config

    def wall(cross: bool) -> float:
        g = tf.Graph()
        with g.as_default():
            fetch = tf.group(*[hop_chain(lc.device_names, a, b, hops, cross, max(nbytes // 4, 1), j + 1)[:1]
                               for j, (a, b) in enumerate(chains)])
        with lc.session(graph=g, config=step_session_config(None, lc)) as sess:
            return median_call_seconds(lambda: lc.run(sess, fetch), steps, warmup=3)
    return (wall(True) - wall(False)) / hops


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hetero", action="store_true", help="the emulated heterogeneous cluster (needs root)")
    p.add_argument("--hops", type=int, default=12)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    for name in ("hops", "steps", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfplace.runtime.local_cluster import LocalCluster
    cluster, lc_kwargs = fb.local_cluster_setup(args.hetero)
    with LocalCluster(**lc_kwargs) as lc:
        for r in range(args.repeats):
            print(f"pass {r + 1}: one chain by size (us per hop; link = what the simulator charges "
                  "before the message CPU)", flush=True)
            for a, b in SIZE_PAIRS:
                for nbytes in SIZES_BYTES:
                    hop = hop_seconds(lc, ((a, b),), nbytes, args.hops, args.steps)
                    link = cluster.transfer_seconds(a, b, nbytes)
                    print(f"  tasks {a}-{b} {nbytes:>8} B: hop {hop * 1e6:6.0f}  link {link * 1e6:5.0f}", flush=True)
            print(f"pass {r + 1}: 16-byte chains at once (us per hop of each chain)", flush=True)
            for name, chains in CONCURRENT:
                print(f"  {name:>10}: {hop_seconds(lc, chains, 16, args.hops, args.steps) * 1e6:6.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
