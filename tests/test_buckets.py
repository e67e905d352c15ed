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
from tfplace.lowering.placed_graph import TASK_COLLECTIVE
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


def test_a_parameter_server_strategy_has_nothing_to_pack(case):
    a, b = _lower(case, 1, "ps"), _lower(case, 1 << 22, "ps")
    assert a.num_tasks == b.num_tasks and np.array_equal(a.task_seconds, b.task_seconds)


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
