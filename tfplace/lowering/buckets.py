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
from typing import Dict, List, Sequence, Tuple

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
    # a gradient made downstream of an update-side op might wait for another collective
    bad[coll[after_update[p.task_op[coll]]]] = True
    tasks = coll[~bad[coll]]
    keys: Dict[Tuple, int] = {}
    group, limit = [], []
    for t in tasks.tolist():
        parts = tuple(p.part_dev[p.part_ptr[t]:p.part_ptr[t + 1]].tolist())
        group.append(keys.setdefault((parts, tensor_dtype[int(p.task_tensor[t])]), len(keys)))
        limit.append(sizes[0] if all(is_cpu[d] for d in parts) else sizes[1])
    return _cut(p, tasks, np.array(group, dtype=np.int64), np.array(limit, dtype=np.float64))


def _cut(p: PlacedGraph, tasks: np.ndarray, group: np.ndarray, limit: np.ndarray) -> List[List[int]]:
    """Buckets of two or more tasks: `tasks` [K] grouped by `group` [K], each group's tasks in
    backward order (priority, then id) cut into runs of at most `limit` [K] bytes (a larger task
    alone); a limit <= 1 packs nothing."""
    keep = limit > 1
    tasks, group, limit = tasks[keep], group[keep], limit[keep]
    order = np.lexsort((tasks, p.task_priority[tasks], group))
    buckets: List[List[int]] = []
    current: List[int] = []
    size, current_group = 0.0, -1
    for t, g, nbytes, lim in zip(tasks[order].tolist(), group[order].tolist(), p.task_bytes[tasks[order]].tolist(),
                                 limit[order].tolist()):
        if current and (g != current_group or size + nbytes > lim):
            buckets.append(current)
            current, size = [], 0.0
        current.append(t)
        size += nbytes
        current_group = g
    if current:
        buckets.append(current)
    return [b for b in buckets if len(b) >= 2]


def _readers(p: PlacedGraph) -> Tuple[np.ndarray, np.ndarray]:
    """(reading task[R], producing task[R]) of every data read."""
    return np.repeat(np.arange(p.num_tasks), np.diff(p.in_ptr)), p.buf_task[p.in_buf]


def plan_transfer_buckets(placed: PlacedGraph, update_op: np.ndarray, after_update: np.ndarray,
                          tensor_code: np.ndarray, handle_code: np.ndarray, sizes: Tuple[int, int],
                          is_cpu: Sequence[bool]) -> List[List[int]]:
    """The buckets of two or more TRANSFERs (task ids, in backward order) between one pair of
    devices, of two sorts:
      gradients (to a PS, or to an update device outside an all-reduce): each moves a whole
        tensor (no samples) that may be packed (`tensor_code` [T] >= 0: its dtype's code, for
        tensors of a static shape), is no control or step message, is not made by or downstream
        of an update-side op (a tensor that passes through update-side Identities may come back
        as another member's input), and every reader of its output is an update instance or a
        SUM whose readers all are;
      PS send-backs of updated variables (no output buffer; task_op the variable's handle op,
        `handle_code` [N] >= 0: its dtype's code, for variables of a static shape).
    Members share sender, receiver, sort and dtype. The size limit is sizes[0] when both ends are
    CPU devices, else sizes[1] (as plan_buckets)."""
    p = placed
    m = p.num_tasks
    x = p.task_kind == TASK_TRANSFER
    if int(x.sum()) < 2 or max(sizes) <= 1:
        return []
    if len(p.task_control):
        x &= ~p.task_control.astype(bool)
    if p.step_message_start >= 0:
        x[p.step_message_start:] = False
    reader, producer = _readers(p)
    upd_read = (p.task_kind[reader] == TASK_COMPUTE) & update_op[p.task_op[reader]]
    # SUM tasks whose every reader updates
    sum_ok = p.task_kind == TASK_SUM
    sum_ok[producer[~upd_read]] = False
    ok_read = upd_read | sum_ok[reader]
    bad = np.zeros(m, dtype=bool)
    bad[producer[~ok_read]] = True
    has_out = np.diff(p.out_ptr) > 0
    op = p.task_op.astype(np.int64)
    code = np.where(has_out, tensor_code[np.maximum(p.task_tensor, 0)], handle_code[op])
    grad = has_out & ~bad & (p.task_samples == 0) & ~update_op[op] & ~after_update[op]
    tasks = np.nonzero(x & (code >= 0) & (grad | ~has_out))[0]
    src, dst = p.task_src_device[tasks].astype(np.int64), p.task_device[tasks].astype(np.int64)
    cpu = np.asarray(is_cpu, dtype=bool)
    limit = np.where(cpu[src] & cpu[dst], sizes[0], sizes[1]).astype(np.float64)
    d, c = len(cpu), int(code.max(initial=0)) + 1
    group = ((src * d + dst) * 2 + has_out[tasks]) * c + code[tasks]  # (sender, receiver, sort, dtype)
    return _cut(p, tasks, group.astype(np.int64), limit)


def merge_buckets(placed: PlacedGraph, buckets: Sequence[Sequence[int]], links, memory_bandwidth: np.ndarray,
                  launch_s: float) -> PlacedGraph:
    """`placed` with each bucket's tasks (all COLLECTIVEs, or all TRANSFERs between one pair of
    devices) merged into one task (the bucket's first task id keeps it): bytes added up;
    seconds the link model's at those bytes (a collective's `links.collective_seconds`, a
    transfer's path latency + bytes / bottleneck bandwidth; LinkCosts), plus what the members
    carried beyond their own model time (aggregation-weight multiplies), plus packing: the concat
    reads and writes the bucket once on the slowest memory taking part (`memory_bandwidth` [D],
    bytes/s), and it and the split each cost a launch (`launch_s`; the split hands out views, and
    the CPU exchange slices its sums out of the shards: tfplace.ir.node_defs); the earliest
    priority; every input and output buffer and dependency of the members. Task ids after a
    removed one shift down; buffers and reads stay grouped by task (CSR)."""
    if not buckets:
        return placed
    p = placed
    m = p.num_tasks
    mem = np.concatenate([np.asarray(b, dtype=np.int64) for b in buckets])          # [K] members
    mem_b = np.repeat(np.arange(len(buckets)), [len(b) for b in buckets])            # [K] their bucket
    rep = np.full(len(buckets), m, dtype=np.int64)
    np.minimum.at(rep, mem_b, mem)                                                   # [U] the kept task
    into = np.arange(m)
    into[mem] = rep[mem_b]
    keep = into == np.arange(m)
    new_id = np.cumsum(keep) - 1
    remap = new_id[into]

    # per member: its own link-model seconds; per bucket: the model's at the total bytes and
    # the slowest memory taking part
    mem_bytes = p.task_bytes[mem]
    total = np.bincount(mem_b, weights=mem_bytes, minlength=len(buckets))
    own = np.zeros(len(mem))
    model_s = np.zeros(len(buckets))
    slowest_bw = np.zeros(len(buckets))
    is_coll = p.task_kind[rep] == TASK_COLLECTIVE
    for u in np.nonzero(is_coll)[0].tolist():
        r = int(rep[u])
        ends = p.part_dev[p.part_ptr[r]:p.part_ptr[r + 1]].tolist()
        cid = links.collective(tuple(ends))
        sel = mem_b == u
        own[sel] = links.collective_seconds(np.full(int(sel.sum()), cid), mem_bytes[sel])
        model_s[u] = links.collective_seconds(np.array([cid]), total[u:u + 1])[0]
        slowest_bw[u] = float(np.min(memory_bandwidth[ends]))
    xu = ~is_coll
    src, dst = p.task_src_device[rep[xu]], p.task_device[rep[xu]]
    lat, bw = links.pair_lat[src, dst], links.pair_bw[src, dst]
    model_s[xu] = lat + total[xu] / bw
    slowest_bw[xu] = np.minimum(memory_bandwidth[src], memory_bandwidth[dst])
    xm = xu[mem_b]
    m_src, m_dst = p.task_src_device[mem[xm]], p.task_device[mem[xm]]
    own[xm] = links.pair_lat[m_src, m_dst] + mem_bytes[xm] / links.pair_bw[m_src, m_dst]
    # what the members carried beyond their own model time (aggregation-weight multiplies)
    extra_s = np.bincount(mem_b, weights=p.task_seconds[mem] - own, minlength=len(buckets))
    pack_s = 2 * launch_s + 2.0 * total / slowest_bw
    seconds, nbytes, prio = p.task_seconds.copy(), p.task_bytes.copy(), p.task_priority.copy()
    seconds[rep] = model_s + extra_s + pack_s
    nbytes[rep] = total
    first_prio = np.full(len(buckets), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_prio, mem_b, p.task_priority[mem].astype(np.int64))
    prio[rep] = first_prio
    # PS send-backs (TRANSFERs without output buffers): their variables, by handle op
    sb = xm.copy()
    sb[xm] = p.out_ptr[mem[xm]] == p.out_ptr[mem[xm] + 1]
    sb_task = np.concatenate([remap[p.send_back_task], new_id[rep[mem_b[sb]]]])
    sb_op = np.concatenate([p.send_back_op, p.task_op[mem[sb]]])

    sc_task, sc_dev, sc_bytes, sc_free = _pack_scratch(p, rep, total, is_coll, remap)

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
        step_message_start=step_start, send_back_task=sb_task.astype(np.int32), send_back_op=sb_op.astype(np.int32),
        scratch_task=sc_task, scratch_device=sc_dev, scratch_bytes=sc_bytes, scratch_free_task=sc_free)


def _pack_scratch(p: PlacedGraph, rep: np.ndarray, total: np.ndarray, is_coll: np.ndarray, remap: np.ndarray):
    """The scratch of the merged graph (PlacedGraph.scratch_*): the members' own, re-owned by
    the kept task (a bucket's exchange shards and received send-back values add up), plus the
    packed concat of each TRANSFER bucket on its sender: the rewrite concatenates the members
    there and sends that one tensor, which TensorFlow holds until the receiver has taken it
    (measured, exact live bytes from TF FULL_TRACE allocation records: at the ResNet-50 DP-PS worker's peak the 66 MB
    tfplace/transfer_*/packed is live next to 68 MB of member gradients; without it the
    simulated worker was 0.84 of the real peak). A COLLECTIVE bucket adds none: its members'
    buffers, which the simulator keeps until the collective ends, stand for its packed concat
    (the concat is their only reader, so TensorFlow frees them once packed)."""
    x = ~is_coll
    new_rep = remap[rep[x]]
    return (np.concatenate([remap[p.scratch_task], new_rep]).astype(np.int32),
            np.concatenate([p.scratch_device, p.task_src_device[rep[x]]]).astype(np.int32),
            np.concatenate([p.scratch_bytes, total[x]]).astype(np.float64),
            np.concatenate([remap[p.scratch_free_task], new_rep]).astype(np.int32))


def bucket_gradients(placed: PlacedGraph, links, update_op: np.ndarray, after_update: np.ndarray,
                     tensor_dtype: Sequence[str], tensor_code: np.ndarray, handle_code: np.ndarray,
                     sizes: Tuple[int, int], memory_bandwidth: np.ndarray, launch_s: float) -> PlacedGraph:
    """plan_buckets + plan_transfer_buckets (the CPU/GPU sizes split by links.is_cpu), merged in
    one pass by merge_buckets (see the module docstring)."""
    buckets = (plan_buckets(placed, update_op, after_update, tensor_dtype, sizes, links.is_cpu)
               + plan_transfer_buckets(placed, update_op, after_update, tensor_code, handle_code, sizes,
                                       links.is_cpu))
    return merge_buckets(placed, buckets, links, memory_bandwidth, launch_s)
