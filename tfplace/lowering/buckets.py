"""Gradient bucketing: all-reduces of several gradients packed into one collective.

A data-parallel step aggregates one gradient per variable; one collective each costs a
collective's fixed latency (and on a CPU runtime its per-call overhead) per variable, which is
what Horovod's tensor fusion and PyTorch DDP's buckets avoid. `bucket_collectives` rewrites the
lowering's PlacedGraph so that all-reduces with the same participants and dtype, whose results
only feed variable updates, are packed into buckets of at most `bucket_bytes` (one gradient
larger than that is a bucket of its own), in the order the backward pass makes them (the
producers' priority, i.e. their topological rank): a bucket's collective starts when its last
gradient is ready and overlaps the rest of the backward pass.

A bucket is one COLLECTIVE task that reads several buffers per participant and writes one
output buffer per (participant, gradient); the rewrite emits it as flatten + concat, one
all-reduce (CollectiveReduceV2 among GPUs, the exchange of shards among CPU devices), split +
reshape (tfplace.rewrite.graph_rewrite), so the simulator costs the all-reduce the rewrite runs
(LinkCosts.collective_seconds, or the profile's fit) at the bucket's bytes.
Only collectives whose outputs are read by update ops, and whose gradients are not made downstream
of any update-side op, are packed: then no member can wait for another member's result.

Pure: numpy only, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence, Tuple

import numpy as np

from tfplace.lowering.placed_graph import TASK_COLLECTIVE, TASK_COMPUTE, PlacedGraph


def plan_buckets(placed: PlacedGraph, update_op: np.ndarray, after_update: np.ndarray, tensor_dtype: Sequence[str],
                 sizes: Tuple[int, int], is_cpu: Sequence[bool]) -> List[List[int]]:
    """The buckets of two or more collectives (task ids, in backward order); collectives not
    listed stay alone. update_op [N] bool: ops that update variables (or only feed updates);
    after_update [N] bool: ops downstream of one of them (their gradients are never packed);
    tensor_dtype [T]: each tensor's dtype name; sizes: the bucket bytes among CPU devices only
    and among devices with a GPU (Strategy.bucket_bytes_among), is_cpu [D] which devices are CPUs."""
    p = placed
    coll = np.nonzero(p.task_kind == TASK_COLLECTIVE)[0]
    if len(coll) < 2 or max(sizes) <= 1:
        return []
    # who reads each collective's outputs: every reader must be an update op's instance
    read_task = np.repeat(np.arange(p.num_tasks), np.diff(p.in_ptr))
    producer = p.buf_task[p.in_buf]
    from_coll = p.task_kind[producer] == TASK_COLLECTIVE
    reader = read_task[from_coll]
    ok_read = (p.task_kind[reader] == TASK_COMPUTE) & update_op[p.task_op[reader]]
    bad = np.zeros(p.num_tasks, dtype=bool)
    bad[producer[from_coll][~ok_read]] = True
    groups: Dict[Tuple, List[int]] = {}
    # a gradient made downstream of an update-side op might wait for another collective
    bad[coll[after_update[p.task_op[coll]]]] = True
    for t in coll.tolist():
        if bad[t]:
            continue
        parts = tuple(p.part_dev[p.part_ptr[t]:p.part_ptr[t + 1]].tolist())
        groups.setdefault((parts, tensor_dtype[int(p.task_tensor[t])]), []).append(t)
    buckets = []
    for (parts, _), members in groups.items():
        limit = sizes[0] if all(is_cpu[d] for d in parts) else sizes[1]
        if limit <= 1:
            continue
        members.sort(key=lambda t: (int(p.task_priority[t]), t))
        current, size = [], 0.0
        for t in members:
            nbytes = float(p.task_bytes[t])
            if current and size + nbytes > limit:
                buckets.append(current)
                current, size = [], 0.0
            current.append(t)
            size += nbytes
        buckets.append(current)
    return [b for b in buckets if len(b) >= 2]


def merge_collectives(placed: PlacedGraph, buckets: Sequence[Sequence[int]], links, memory_bandwidth: np.ndarray,
                      launch_s: float) -> PlacedGraph:
    """`placed` with each bucket's collectives merged into one COLLECTIVE task (the bucket's
    first task id keeps it): bytes added up; seconds the collective model's at those bytes
    (`links.collective_seconds`, LinkCosts), plus what the members carried beyond their own
    model time (aggregation-weight multiplies), plus packing: the concat and the split each read
    and write the bucket once on the slowest participant's memory (`memory_bandwidth` [D],
    bytes/s) after a launch (`launch_s`); the earliest priority; every input and output buffer
    and dependency of the members. Task ids after a removed one shift down; buffers and reads
    stay grouped by task (CSR)."""
    if not buckets:
        return placed
    p = placed
    m = p.num_tasks
    into = np.arange(m)
    for b in buckets:
        rep = min(b)
        into[list(b)] = rep
    keep = into == np.arange(m)
    new_id = np.cumsum(keep) - 1
    remap = new_id[into]

    seconds, nbytes, prio = p.task_seconds.copy(), p.task_bytes.copy(), p.task_priority.copy()
    for b in buckets:
        members = np.asarray(sorted(b), dtype=np.int64)
        rep = int(members[0])
        parts = tuple(p.part_dev[p.part_ptr[rep]:p.part_ptr[rep + 1]].tolist())
        cid = links.collective(parts)
        own = links.collective_seconds(np.full(len(members), cid), p.task_bytes[members])
        extra_s = float((p.task_seconds[members] - own).sum())
        nbytes[rep] = float(p.task_bytes[members].sum())
        prio[rep] = int(p.task_priority[members].min())
        pack_s = 2 * (launch_s + 2.0 * nbytes[rep] / float(np.min(memory_bandwidth[list(parts)])))
        seconds[rep] = float(links.collective_seconds(np.array([cid]), np.array([nbytes[rep]]))[0]) + extra_s + pack_s

    # buffers: re-owned by the kept task, then sorted by it (out_ptr is CSR over tasks)
    owner = remap[p.buf_task]
    border = np.argsort(owner, kind="stable")
    buf_new = np.empty(len(border), dtype=np.int64)
    buf_new[border] = np.arange(len(border))
    # reads: the task that reads, re-owned, sorted by it (in_ptr is CSR over tasks)
    readers = remap[np.repeat(np.arange(m), np.diff(p.in_ptr))]
    rorder = np.argsort(readers, kind="stable")
    n_new = int(keep.sum())

    def csr_keep(ptr, idx):
        counts = np.diff(ptr)[keep]
        starts = ptr[:-1][keep]
        take = np.repeat(starts, counts) + (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts))
        return np.concatenate([[0], np.cumsum(counts)]).astype(ptr.dtype), idx[take]

    link_ptr, link_idx = csr_keep(p.link_ptr, p.link_idx)
    part_ptr, part_dev = csr_keep(p.part_ptr, p.part_dev)
    dep_src, dep_dst = remap[p.dep_src], remap[p.dep_dst]
    loop = dep_src == dep_dst
    step_start = int(new_id[p.step_message_start]) if p.step_message_start >= 0 else -1
    per_task = {name: getattr(p, name)[keep] for name in (
        "task_kind", "task_device", "task_src_device", "task_op", "task_tensor", "task_samples", "task_lo",
        "task_hi", "task_weight")}
    return dataclasses.replace(
        p, **per_task, task_seconds=seconds[keep], task_bytes=nbytes[keep], task_priority=prio[keep],
        dep_src=dep_src[~loop].astype(np.int32), dep_dst=dep_dst[~loop].astype(np.int32),
        link_ptr=link_ptr, link_idx=link_idx, part_ptr=part_ptr, part_dev=part_dev,
        buf_task=owner[border].astype(np.int32), buf_device=p.buf_device[border], buf_bytes=p.buf_bytes[border],
        buf_tensor=p.buf_tensor[border],
        out_ptr=np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n_new))]).astype(p.out_ptr.dtype),
        in_ptr=np.concatenate([[0], np.cumsum(np.bincount(readers, minlength=n_new))]).astype(p.in_ptr.dtype),
        in_buf=buf_new[p.in_buf[rorder]].astype(np.int32), in_edge=p.in_edge[rorder],
        task_control=p.task_control[keep] if len(p.task_control) else p.task_control,
        task_hold_seconds=p.task_hold_seconds[keep] if len(p.task_hold_seconds) else p.task_hold_seconds,
        step_message_start=step_start)


def bucket_collectives(placed: PlacedGraph, links, update_op: np.ndarray, after_update: np.ndarray,
                       tensor_dtype: Sequence[str], sizes: Tuple[int, int], memory_bandwidth: np.ndarray,
                       launch_s: float) -> PlacedGraph:
    """plan_buckets (the CPU/GPU sizes split by links.is_cpu) + merge_collectives (see the module
    docstring)."""
    buckets = plan_buckets(placed, update_op, after_update, tensor_dtype, sizes, links.is_cpu)
    return merge_collectives(placed, buckets, links, memory_bandwidth, launch_s)
