"""Gradient buckets (tfplace.lowering.buckets): what the lowering packs, and what it keeps.

The rewritten, bucketed steps are checked against single-device training in
tests/test_equivalence.py; here the PlacedGraph itself: the collectives merged, every gradient's
output buffer kept, bytes conserved, no dependency cycle, and the bucket-size bound.
"""

import dataclasses
import json
import os

import numpy as np
import pytest

from tfplace.formats.cluster import load_cluster
from tfplace.formats.errors import InputError
from tfplace.formats.strategy import even_strategy, load_strategy
from tfplace.ir.grouping import make_grouping
from tfplace.lowering.lower import lower
from tfplace.lowering.placed_graph import TASK_COLLECTIVE, TASK_TRANSFER
from tfplace.simulator import simulate
from tfplace.testing import tiny_graph, uniform_profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def case():
    cluster = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    graph = tiny_graph("mlp", 12, "adam")
    return graph, make_grouping(graph, 4), cluster, uniform_profile(graph, cluster.kinds)


def _lower(case, bucket, sync="allreduce"):
    graph, grouping, cluster, profile = case
    devs = list(cluster.device_names)
    strategy = even_strategy(devs, 12, 4, sync, devs[1] if sync == "ps" else None)
    return lower(graph, grouping, cluster, dataclasses.replace(strategy, bucket_bytes=bucket), profile)


def _collective_outputs(p):
    """{(device, tensor)} of every collective output buffer, and the bytes of each collective."""
    coll = np.nonzero(p.task_kind == TASK_COLLECTIVE)[0]
    outs = {(int(p.buf_device[b]), int(p.buf_tensor[b])) for t in coll for b in range(p.out_ptr[t], p.out_ptr[t + 1])}
    return outs, p.task_bytes[coll]


@pytest.mark.parametrize("bucket, collectives", [(1, 4), (1 << 22, 1)])
def test_every_gradient_keeps_its_result_when_packed(case, bucket, collectives):
    one, bytes_one = _collective_outputs(_lower(case, 1))
    p = _lower(case, bucket)
    outs, nbytes = _collective_outputs(p)
    assert len(nbytes) == collectives and outs == one and nbytes.sum() == pytest.approx(bytes_one.sum())
    report = simulate(p, case[2])  # a dependency cycle would raise here
    assert report.iteration_time_s > 0 and not report.oom


def test_buckets_hold_at_most_bucket_bytes_unless_one_gradient_is_larger(case):
    _, bytes_one = _collective_outputs(_lower(case, 1))
    limit = 600
    p = _lower(case, limit)
    _, nbytes = _collective_outputs(p)
    assert 1 < len(nbytes) < len(bytes_one)
    coll = np.nonzero(p.task_kind == TASK_COLLECTIVE)[0]
    for t, b in zip(coll, nbytes):
        tensors = set(p.buf_tensor[p.out_ptr[t]:p.out_ptr[t + 1]].tolist())
        assert b <= limit or len(tensors) == 1, (b, tensors)


def _gradient_sends(p, server):
    """Per TRANSFER into `server` with output buffers: (source device, {tensors}, bytes)."""
    x = np.nonzero((p.task_kind == TASK_TRANSFER) & (p.task_device == server) & (np.diff(p.out_ptr) > 0))[0]
    return [(int(p.task_src_device[t]), frozenset(p.buf_tensor[p.out_ptr[t]:p.out_ptr[t + 1]].tolist()),
             float(p.task_bytes[t])) for t in x]


@pytest.mark.parametrize("limit", [1 << 22, 600])
def test_a_parameter_server_gets_each_workers_gradients_in_buckets(case, limit):
    """PS: each worker's gradients go to the server in one TRANSFER per bucket (one per worker
    when everything fits), every gradient still arrives (the same (worker, tensor) pairs and bytes),
    a bucket stays within the limit unless it holds one gradient; the send-backs of the updated
    variables are bucketed alike, each variable still reaching each mirror; and the simulator
    runs it (a dependency cycle would raise)."""
    server = 1
    one, packed = _lower(case, 1, "ps"), _lower(case, limit, "ps")
    sends_one, sends = _gradient_sends(one, server), _gradient_sends(packed, server)
    pairs = lambda sends: {(src, x) for src, xs, _ in sends for x in xs}  # noqa: E731
    assert pairs(sends) == pairs(sends_one) and len(pairs(sends_one)) == len(sends_one)
    assert sum(b for *_, b in sends) == pytest.approx(sum(b for *_, b in sends_one))
    workers = {src for src, *_ in sends_one}
    assert len(workers) == 2
    if limit == 1 << 22:
        assert sorted(src for src, *_ in sends) == sorted(workers)
    else:
        assert len(workers) < len(sends) < len(sends_one)
        assert all(b <= limit or len(xs) == 1 for _, xs, b in sends)
    # the updated variables come back the same way: one send-back per worker (or per bucket)
    back_one, back = _send_backs(one, server), _send_backs(packed, server)
    assert {(d, h) for d, hs in back for h in hs} == {(d, h) for d, hs in back_one for h in hs}
    assert len(back_one) == len({(d, h) for d, hs in back_one for h in hs}) > 2 * len(workers)
    assert sorted(d for d, _ in back) == sorted(workers) if limit == 1 << 22 else len(workers) < len(back) < len(back_one)
    report = simulate(packed, case[2])
    assert report.iteration_time_s > 0 and not report.oom


def _send_backs(p, server):
    """Per PS send-back out of `server`: (destination device, handle ops it carries)."""
    x = np.nonzero((p.task_kind == TASK_TRANSFER) & (p.task_src_device == server) & (np.diff(p.out_ptr) == 0))[0]
    return [(int(p.task_device[t]), p.send_back_ops(int(t))) for t in x.tolist()
            if not p.is_step_message(t) and not p.is_control_message(t)]


@pytest.mark.parametrize("value", [0, -4, 1.5, "4MB", True])
def test_a_bad_bucket_size_is_one_error_naming_the_field(tmp_path, value):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"format": "tfplace.strategy", "version": 1, "global_batch_size": 12,
                                "max_groups": 4, "bucket_bytes": value,
                                "default": {"shares": {"cpu0": 12}}}))
    with pytest.raises(InputError) as err:
        load_strategy(path)
    assert f"{path}: bucket_bytes" in str(err.value) and "Fix:" in str(err.value)


@pytest.mark.parametrize("cpu_only, size", [(True, 64 << 20), (False, 4 << 20)])
def test_the_default_bucket_size_follows_the_devices(cpu_only, size):
    """Without bucket_bytes, all-reduces among CPU devices only use DEFAULT_BUCKET_BYTES_CPU
    (64 MiB, measured against Horovod) and those among GPUs DEFAULT_BUCKET_BYTES_GPU (4 MiB, the
    simulator's best for ResNet-50 on the HeteroG testbed); a given size wins on both."""
    from tfplace.formats.strategy import DEFAULT_BUCKET_BYTES_CPU, DEFAULT_BUCKET_BYTES_GPU
    s = even_strategy(["a", "b"], 8, 4)
    assert s.bucket_bytes_among(cpu_only) == size
    assert (DEFAULT_BUCKET_BYTES_CPU, DEFAULT_BUCKET_BYTES_GPU) == (64 << 20, 4 << 20)
    assert dataclasses.replace(s, bucket_bytes=1000).bucket_bytes_among(cpu_only) == 1000


def test_a_gpu_cluster_packs_with_the_gpu_default():
    """ResNet-50's 100 MB of gradients on GPUs: buckets of at most 4 MiB unless one gradient is
    larger (many collectives); the same strategy at 64 MiB packs them into two."""
    from tfplace.graph_defs.export import ensure_bundle
    from tfplace.ir.loader import load_op_graph
    from tfplace.profiling.device_model import default_profile
    cluster = load_cluster(os.path.join(ROOT, "clusters", "two_kind_4gpu.json"))
    graph = load_op_graph(ensure_bundle("resnet50", batch_size=16, image_size=32))
    grouping = make_grouping(graph, 16)
    profile = default_profile(graph, cluster.kinds)
    s = even_strategy(list(cluster.device_names), 16, 16)
    p = lower(graph, grouping, cluster, s, profile)
    big = _collective_outputs(lower(graph, grouping, cluster, dataclasses.replace(s, bucket_bytes=64 << 20),
                                    profile))[1]
    coll = np.nonzero(p.task_kind == TASK_COLLECTIVE)[0]
    assert len(big) == 2 and len(coll) > 20
    for t in coll:  # a bucket over 4 MiB is one gradient larger than that
        grads = {int(p.buf_tensor[b]) for b in range(p.out_ptr[t], p.out_ptr[t + 1])}
        assert p.task_bytes[t] <= 4 << 20 or len(grads) == 1, (p.task_bytes[t], len(grads))


def test_random_strategies_bucket_without_a_dependency_cycle():
    """Mixed PS / all-reduce strategies on the 4-GPU fake cluster: gradients that pass through
    update-side Identities and go back and forth between devices once packed a bucket whose
    input waited for its own output (15 of 300 draws); every draw now lowers and simulates,
    and many of them carry transfer buckets."""
    from tfplace.testing import four_device_cluster, random_strategy
    from tfplace.profiling.device_model import default_profile
    from tfplace.testing import tiny_graph
    cluster = four_device_cluster()
    graph = tiny_graph("cnn", 16)
    grouping = make_grouping(graph, 16)
    profile = default_profile(graph, cluster.kinds)
    rng = np.random.default_rng(0)
    packed = 0
    for _ in range(300):
        s = dataclasses.replace(random_strategy(rng, grouping.group_names, cluster.device_names, 16),
                                min_batch_per_replica=1)
        p = lower(graph, grouping, cluster, s, profile)
        assert simulate(p, cluster).iteration_time_s > 0  # a cycle raises
        x = np.nonzero(p.task_kind == TASK_TRANSFER)[0]
        packed += any(len(set(p.buf_tensor[p.out_ptr[t]:p.out_ptr[t + 1]].tolist())) > 1 for t in x)
    assert packed >= 30


def _worker_gradient_buckets(p, worker, server):
    """TRANSFER buckets (several gradients) from `worker` to `server`."""
    x = np.nonzero((p.task_kind == TASK_TRANSFER) & (p.task_src_device == worker) & (p.task_device == server)
                   & (np.diff(p.out_ptr) > 1))[0]
    return x


def test_a_ps_worker_holds_its_bucket_packed_next_to_the_gradients(case):
    """The rewrite concatenates a bucket's gradients on the worker and sends that one tensor:
    at the send, the worker holds its weights, the member gradients and the packed bucket
    (measured on the real step: 66 MB packed next to 68 MB of gradients on a ResNet-50 worker)."""
    server, worker = 1, 0
    p = _lower(case, 1 << 22, "ps")
    (bucket,) = _worker_gradient_buckets(p, worker, server)
    members = float(p.task_bytes[bucket])
    report = simulate(p, case[2])
    assert report.peak_memory_bytes[worker] >= p.static_bytes[worker] + 2 * members


@pytest.mark.parametrize("bucket", [1, 1 << 22])
def test_a_cpu_all_reduce_holds_its_received_shards(case, bucket):
    """Among n CPU devices the all-reduce is an exchange of shards (tfplace.ir.node_defs): each
    participant holds (n-1)/n of the tensor it receives next to its own, packed or not."""
    p = _lower(case, bucket)
    coll = np.nonzero(p.task_kind == TASK_COLLECTIVE)[0]
    n = 3
    held = {}
    for t, d, b in zip(p.scratch_task.tolist(), p.scratch_device.tolist(), p.scratch_bytes.tolist()):
        held[(t, d)] = held.get((t, d), 0.0) + b  # a bucket's: its members' added up
    for t in coll.tolist():
        for d in p.part_dev[p.part_ptr[t]:p.part_ptr[t + 1]].tolist():
            assert held[(t, d)] == pytest.approx((n - 1) / n * p.task_bytes[t])
    free = np.asarray(p.scratch_free_task)
    assert (free == p.scratch_task).all()
