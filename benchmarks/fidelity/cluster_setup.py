"""The bench's 3-task local cluster: homogeneous and unpinned, or the emulated heterogeneous
cluster (HETERO: pinned cores, CPU quotas, the client pinned too)."""

from __future__ import annotations

import os

from tfplace.profiling.overheads_probe import pin_this_process

from .models import ROOT

# Emulated heterogeneous cluster (--hetero): task 0 alone on core 0, tasks 1 and 2 on core 1 with
# half of it each; every profile kind is pinned like its tasks, the quota kind scaled by the
# slowdown measured under its quota (profiler_cli --cpu-fraction).
# The client (this process) runs on core 1: unpinned, its threads also ran on core 0 and slowed
# task 0 (the tiny transformer's single-device step took 5.3 ms instead of 2.9 ms), which no
# profile of task 0's kind shows.
HETERO = {"cluster": "local_cpu_hetero.json", "cpus": [[0], [1], [1]], "fractions": [None, 0.5, 0.5],
          "client_cpus": [1], "kinds": {"CPU": ("0", 0.0), "CPU_half": ("1", 0.5)}}

__all__ = ["HETERO", "local_cluster_setup", "pin_this_process"]


def local_cluster_setup(hetero: bool, inter_threads: int = 1):
    """(tfplace Cluster, LocalCluster keyword arguments) of the bench's 3-task cluster: 1 intra-op
    and `inter_threads` inter-op threads per task; with `hetero`, HETERO's pinning and quotas, and
    this process (the client) pinned to HETERO["client_cpus"].

    A TF server runs its RPC handlers (RecvTensor included) on its inter-op pool: with one thread,
    a task that runs a long chain of ops serves no tensor to the others until the chain ends (in
    ResNet-50's PS step on the heterogeneous cluster, the workers' batch-norm statistics, ready
    after 31-36 ms, reached the server at 257 ms, and its own forward pass waited for them). The
    overheads record the count (runtime_overheads.inter_op_threads): with one thread the
    simulator charges each message's CPU to the lanes of its two ends, the sending half as a
    handler that runs only when nothing else is ready there; with more it runs it beside them
    (tfplace.lowering.assemble._runtime_overheads)."""
    from tfplace.formats.cluster import load_cluster
    cluster = load_cluster(os.path.join(ROOT, "clusters", HETERO["cluster"] if hetero else "local_cpu.json"))
    kwargs = dict(num_tasks=3, threads_per_task=[1, 1, 1], inter_threads_per_task=[inter_threads] * 3)
    if hetero:
        kwargs.update(cpus_per_task=HETERO["cpus"], cpu_fraction_per_task=HETERO["fractions"])
        pin_this_process(HETERO["client_cpus"])
    return cluster, kwargs
