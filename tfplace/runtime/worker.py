"""One TensorFlow server task of a local cluster (started by `tfplace.runtime.local_cluster`).

    python -m tfplace.runtime.worker --cluster-spec '{"worker": ["127.0.0.1:4001", "127.0.0.1:4002"]}' \
        --task 1 [--job worker] [--intra-threads 1] [--inter-threads 1] \
        [--collective-leader /job:worker/replica:0/task:0] [--ready-file PATH] [--parent-pid PID] \
        [--orphan-cleanup-dir DIR]

Starts a `tf.distribute.Server` for task `--task` of job `--job`, writes `--ready-file` (the
address it serves) once the server listens, and then waits. It exits by itself, within
`PARENT_POLL_S`, when the process that started it (`--parent-pid`) is gone, so a crashed or
SIGKILLed launcher never leaves servers behind, nor (with `--orphan-cleanup-dir`) its temporary
log folder; the launcher still terminates it explicitly on a normal shutdown. A port taken by
another process exits with `PORT_IN_USE_EXIT`, which the launcher answers by starting the cluster
again on new ports.

Thread limits (`--intra-threads`, `--inter-threads`) apply to every op this task runs; they are
how a local cluster emulates devices of different speeds on one machine. Its malloc keeps freed
memory, as the profiler's does (tfplace.emulation.allocator).

`TFPLACE_WORKER_LIBRARIES` (environment; paths joined by os.pathsep, e.g. through LocalCluster's
`env_per_task`): TensorFlow plugin libraries loaded with `tf.load_library` before the server
starts. The master (task 0) runs the session's Grappler optimizers, so a custom optimizer such as
tfplace's (tfplace.rewrite.grappler) must be registered in the workers, not only in the client.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import socket
import sys
import time

PARENT_POLL_S = 0.5
READY_PREFIX = "tfplace-worker-ready"
PORT_IN_USE_EXIT = 75  # the server could not bind: its port was taken (EX_TEMPFAIL: try again)
LIBRARIES_ENV = "TFPLACE_WORKER_LIBRARIES"
PLUGIN_OPTIMIZER = "tfplace"  # the Grappler optimizer those libraries may register (tfplace.rewrite.grappler)


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m tfplace.runtime.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster-spec", required=True, help="JSON object: job name -> list of host:port")
    p.add_argument("--task", type=int, required=True, help="task index inside --job")
    p.add_argument("--job", default="worker")
    p.add_argument("--intra-threads", type=int, default=0, help="0 = TensorFlow's default")
    p.add_argument("--inter-threads", type=int, default=0, help="0 = TensorFlow's default")
    p.add_argument("--collective-leader", default="",
                   help="task that leads collective groups, e.g. /job:worker/replica:0/task:0")
    p.add_argument("--ready-file", default="", help="written with the address once serving")
    p.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    p.add_argument("--orphan-cleanup-dir", default="",
                   help="the launcher's temporary log folder: removed when the launcher is gone (see remove_log_dir)")
    args = p.parse_args(argv)
    try:
        spec = json.loads(args.cluster_spec)
    except json.JSONDecodeError as e:
        p.error(f"--cluster-spec is not JSON ({e})")
    if not isinstance(spec, dict) or args.job not in spec or not isinstance(spec[args.job], list):
        p.error(f"--cluster-spec must map job {args.job!r} to a list of host:port addresses")
    if not 0 <= args.task < len(spec[args.job]):
        p.error(f"--task {args.task} out of range for {len(spec[args.job])} tasks")
    if args.intra_threads < 0 or args.inter_threads < 0:
        p.error("thread counts must be >= 0")
    return args, spec


def _port_in_use(port: int) -> bool:
    """True when another socket holds `port` (binding it here fails with EADDRINUSE)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError as err:
            return err.errno == errno.EADDRINUSE
    return False


def parent_alive(pid: int) -> bool:
    """Whether the launcher `pid` (this process's parent; <= 0: none to watch) still runs."""
    if pid <= 0:
        return True
    if os.getppid() != pid:  # re-parented: the launcher died
        return False
    from tfplace.emulation.cpu_quota import pid_alive
    return pid_alive(pid)


def main(argv=None) -> int:
    args, spec = _parse(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfplace.emulation.allocator import steady_allocator
    steady_allocator()  # as the profiler measures: freed tensors stay in the heap (tfplace.emulation.allocator)
    import tensorflow as tf  # deferred: argument errors come back without loading TF
    for path in filter(None, os.environ.get(LIBRARIES_ENV, "").split(os.pathsep)):
        tf.load_library(path)  # registers its ops / Grappler optimizers in this task

    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=args.intra_threads,
                                      inter_op_parallelism_threads=args.inter_threads)
    if args.collective_leader:
        config.experimental.collective_group_leader = args.collective_leader
    address = spec[args.job][args.task]
    try:
        server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=args.job,
                                      task_index=args.task, config=config, start=True)
    except tf.errors.UnknownError:
        # TF says only "Could not start gRPC server" (gRPC's reason is below its log level):
        # tell a taken port, which the launcher retries with new ports, from other failures
        if _port_in_use(int(address.rsplit(":", 1)[1])):
            print(f"tfplace-worker: port of {address} is in use (Address already in use)", file=sys.stderr)
            return PORT_IN_USE_EXIT
        raise
    if args.ready_file:
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{READY_PREFIX} {address} {server.target}\n")
        os.replace(tmp, args.ready_file)
    # server.join() never returns; poll instead so the task dies with its launcher.
    while parent_alive(args.parent_pid):
        time.sleep(PARENT_POLL_S)
    if args.orphan_cleanup_dir:
        remove_log_dir(args.orphan_cleanup_dir)
    return 0


# the files a LocalCluster writes into its log folder (tfplace.runtime.local_cluster)
_CLUSTER_FILE = re.compile(r"task\d+\.try\d+\.(log|ready)(\.tmp)?")


def remove_log_dir(path: str) -> None:
    """Removes a launcher's temporary log folder after the launcher died without closing its
    cluster (SIGKILL): every task file in it, then the folder once it is empty. Each orphaned task
    calls it; whichever is last removes the folder. Anything else in the folder keeps it."""
    try:
        names = os.listdir(path)
    except OSError:
        return
    for name in names:
        if _CLUSTER_FILE.fullmatch(name):
            try:
                os.unlink(os.path.join(path, name))
            except OSError:  # another task removed it first
                pass
    try:
        os.rmdir(path)
    except OSError:  # not empty yet, or already gone
        pass


if __name__ == "__main__":
    sys.exit(main())
