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

Parameter-server traffic is bucketed the same way, per (sender, receiver, dtype): the TRANSFERs
of whole gradients to the PS (static shapes), whose outputs only feed the PS's SUM or update,
become one TRANSFER per bucket that reads several buffers and writes one buffer per gradient;
the send-backs of updated variables from the PS to a worker become one TRANSFER per bucket that
depends on every member's updates (PlacedGraph.send_back_task/op list its variables). The
rewrite packs on the sender, sends one tensor and splits it on the receiver.

Pure: numpy only, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

from tfplace.lowering.placed_graph import TASK_COLLECTIVE, TASK_COMPUTE, TASK_SUM, TASK_TRANSFER, PlacedGraph


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
    read_task, producer = _readers(p)
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
    return _fill(p, {(parts, sizes[0] if all(is_cpu[d] for d in parts) else sizes[1]): members
                     for (parts, _), members in groups.items()})


def _fill(p: PlacedGraph, groups: Dict[Tuple, List[int]]) -> List[List[int]]:
    """Buckets of two or more tasks: per group, keyed (..., byte limit), its tasks in backward
    order (priority) cut into runs of at most the limit's bytes (a larger task alone)."""
    buckets = []
    for key, members in groups.items():
        limit = key[-1]
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


def _readers(p: PlacedGraph) -> Tuple[np.ndarray, np.ndarray]:
    """(reading task[R], producing task[R]) of every data read."""
    return np.repeat(np.arange(p.num_tasks), np.diff(p.in_ptr)), p.buf_task[p.in_buf]


def plan_transfer_buckets(placed: PlacedGraph, update_op: np.ndarray, after_update: np.ndarray,
                          tensor_dtype: Sequence[str], static_tensor: np.ndarray, handle_dtype: Mapping[int, str],
                          sizes: Tuple[int, int], is_cpu: Sequence[bool]) -> List[List[int]]:
    """The buckets of two or more TRANSFERs (task ids, in backward order) between one pair of
    devices, of two sorts:
      gradients (to a PS, or to an update device outside an all-reduce): each moves a whole
        tensor (no samples) of a static shape (`static_tensor` [T] bool), is no control or step
        message, is not made by or downstream of an update-side op (a tensor that passes through
        update-side Identities may come back as another member's input), and every reader of its
        output is an update instance or a SUM whose readers all are;
      PS send-backs of updated variables (no output buffer; task_op the variable's handle op,
        one of `handle_dtype`: handle op -> dtype, for variables of a static shape).
    The size limit is sizes[0] when both ends are CPU devices, else sizes[1] (as plan_buckets)."""
    p = placed
    xfer = np.nonzero(p.task_kind == TASK_TRANSFER)[0]
    if len(xfer) < 2 or max(sizes) <= 1:
        return []
    reader, producer = _readers(p)
    upd_read = (p.task_kind[reader] == TASK_COMPUTE) & update_op[p.task_op[reader]]
    # SUM tasks whose every reader updates
    sum_ok = p.task_kind == TASK_SUM
    sum_ok[producer[~upd_read]] = False
    ok_read = upd_read | sum_ok[reader]
    bad = np.zeros(p.num_tasks, dtype=bool)
    bad[producer[~ok_read]] = True
    has_out = np.diff(p.out_ptr) > 0
    groups: Dict[Tuple, List[int]] = {}
    for t in xfer.tolist():
        if p.is_control_message(t) or p.is_step_message(t):
            continue
        tensor, op = int(p.task_tensor[t]), int(p.task_op[t])
        if not has_out[t]:  # a send-back
            if op not in handle_dtype:
                continue
            sort = ("send_back", handle_dtype[op])
        elif (bad[t] or p.task_samples[t] != 0 or update_op[op] or after_update[op] or not static_tensor[tensor]
              or tensor_dtype[tensor] == "resource"):
            continue
        else:
            sort = ("gradient", tensor_dtype[tensor])
        src, dst = int(p.task_src_device[t]), int(p.task_device[t])
        limit = sizes[0] if is_cpu[src] and is_cpu[dst] else sizes[1]
        groups.setdefault((src, dst) + sort + (limit,), []).append(t)
    return _fill(p, groups)


def merge_buckets(placed: PlacedGraph, buckets: Sequence[Sequence[int]], links, memory_bandwidth: np.ndarray,
                  launch_s: float) -> PlacedGraph:
    """`placed` with each bucket's tasks (all COLLECTIVEs, or all TRANSFERs between one pair of
    devices) merged into one task (the bucket's first task id keeps it): bytes added up;
    seconds the link model's at those bytes (a collective's `links.collective_seconds`, a
    transfer's path latency + bytes / bottleneck bandwidth; LinkCosts), plus what the members
    carried beyond their own model time (aggregation-weight multiplies), plus packing: the concat
    and the split each read and write the bucket once on the slowest memory taking part
    (`memory_bandwidth` [D], bytes/s) after a launch (`launch_s`); the earliest priority; every
    input and output buffer and dependency of the members. Task ids after a removed one shift
    down; buffers and reads stay grouped by task (CSR)."""
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
    sb_task, sb_op = [remap[p.send_back_task]], [p.send_back_op]
    for b in buckets:
        members = np.asarray(sorted(b), dtype=np.int64)
        rep = int(members[0])
        total = float(p.task_bytes[members].sum())
        if p.task_kind[rep] == TASK_COLLECTIVE:
            ends = p.part_dev[p.part_ptr[rep]:p.part_ptr[rep + 1]].tolist()
            cid = np.full(len(members), links.collective(tuple(ends)))
            own = links.collective_seconds(cid, p.task_bytes[members])
            model_s = float(links.collective_seconds(cid[:1], np.array([total]))[0])
        else:
            src, dst = int(p.task_src_device[rep]), int(p.task_device[rep])
            ends = [src, dst]
            if p.out_ptr[rep] == p.out_ptr[rep + 1]:  # PS send-backs: their variables, by handle op
                sb_task.append(np.full(len(members), new_id[rep]))
                sb_op.append(p.task_op[members])
            lat, bw = float(links.pair_lat[src, dst]), float(links.pair_bw[src, dst])
            own = lat + p.task_bytes[members] / bw
            model_s = lat + total / bw
        extra_s = float((p.task_seconds[members] - own).sum())
        nbytes[rep] = total
        prio[rep] = int(p.task_priority[members].min())
        pack_s = 2 * (launch_s + 2.0 * total / float(np.min(memory_bandwidth[ends])))
        seconds[rep] = model_s + extra_s + pack_s

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
        step_message_start=step_start, send_back_task=np.concatenate(sb_task).astype(np.int32),
        send_back_op=np.concatenate(sb_op).astype(np.int32))


def bucket_gradients(placed: PlacedGraph, links, update_op: np.ndarray, after_update: np.ndarray,
                     tensor_dtype: Sequence[str], static_tensor: np.ndarray, handle_dtype: Mapping[int, str],
                     sizes: Tuple[int, int], memory_bandwidth: np.ndarray, launch_s: float) -> PlacedGraph:
    """plan_buckets + plan_transfer_buckets (the CPU/GPU sizes split by links.is_cpu), merged in
    one pass by merge_buckets (see the module docstring)."""
    buckets = (plan_buckets(placed, update_op, after_update, tensor_dtype, sizes, links.is_cpu)
               + plan_transfer_buckets(placed, update_op, after_update, tensor_dtype, static_tensor, handle_dtype,
                                       sizes, links.is_cpu))
    return merge_buckets(placed, buckets, links, memory_bandwidth, launch_s)
