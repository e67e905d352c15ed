"""Vectorised assembly of a PlacedGraph from op layouts and per-tensor edge patterns.

Every array is built with numpy gathers over "expand by counts" indices, in an order that needs
no sorting: task ids are op instances first (op-major), then each tensor's template tasks
(tensor-major), then the PS send-backs, then the control messages; buffers are each instance's
outputs (task order, port order) followed by the template buffers (task order); reads are listed
task by task. The only Python loops are over variables of PS groups (the send-back of updated
values) and over layouts (which share a device sequence).
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from tfplace.lowering.graph_index import LK_UPD, GraphIndex
from tfplace.lowering.layouts import SYNC_PS
from tfplace.lowering.placed_graph import (exclusive_cumsum, weighted_reads, TASK_COLLECTIVE, TASK_COMPUTE,
                                           TASK_RESPLIT, TASK_SUM, TASK_TRANSFER, PlacedGraph)


def expand(counts: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(owner, pos): owner[k] = i repeated counts[i] times, pos = 0..counts[i]-1 within each."""
    counts = np.asarray(counts, dtype=np.int64)
    owner = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    return owner, np.arange(len(owner)) - starts[owner]


def assemble(ix: GraphIndex, ctx, lay_of: np.ndarray, sync: np.ndarray, prio: np.ndarray,
             sig_pat: np.ndarray, batch: int) -> PlacedGraph:
    """Builds the PlacedGraph. `ctx` is the Lowerer (costs, links, memory bandwidth, tables)."""
    lay_ptr, lay_size, lay_dev, lay_samp, lay_lo, lay_hi = ctx.layouts(batch).arrays()
    A, P = ctx.patterns(batch).arrays()
    graph, n = ix.graph, ix.num_ops
    group = ix.op_group
    op_lay = lay_of[group, ix.lkind]
    cnt = lay_size[op_lay]
    op_ptr = exclusive_cumsum(cnt)
    m0 = int(op_ptr[-1])

    # ---- compute instances -------------------------------------------------------------------
    inst_op, pos = expand(cnt)
    ent = lay_ptr[op_lay[inst_op]] + pos
    inst_dev, inst_samp = lay_dev[ent], lay_samp[ent]
    eff_batch = np.where(inst_samp > 0, inst_samp, batch)
    cols, stack = ctx.entry_columns(batch)
    inst_sec = stack[cols[ent], inst_op]
    ctx.compute.check(inst_sec, inst_op, inst_dev)
    inst_bytes = ix.op_out_ps_bytes[inst_op] * eff_batch + ix.op_out_full_bytes[inst_op]
    inst_mb = _micro_batch_index(lay_ptr, lay_size, lay_dev, lay_samp)[ent]
    n_mb = int(inst_mb.max()) + 1 if len(inst_mb) else 1
    prio_grp = prio[group].astype(np.int64)

    # ---- instance output buffers: per instance, its op's outputs in port order ----------------
    n_out = (ix.op_out_ptr[1:] - ix.op_out_ptr[:-1])[inst_op]
    ib_base = exclusive_cumsum(n_out)
    ib_task, ib_pos = expand(n_out)
    ib_t = ix.op_out_tensors[ix.op_out_ptr[inst_op[ib_task]] + ib_pos]
    ib_bytes = (ix.tensor_ps_bytes[ib_t] * eff_batch[ib_task] + ix.tensor_full_bytes[ib_t]) * ix.tensor_mem_scale[ib_t]
    n_ib = int(ib_base[-1])
    t_prod = graph.tensor_op.astype(np.int64)
    tpat = sig_pat[ix.tensor_sig]

    # ---- template tasks and buffers -----------------------------------------------------------
    pt, pb, pi, po, ps = P["task"], P["tb"], P["in"], P["out"], P["slot"]
    ntt = pt[tpat + 1] - pt[tpat]
    tt_base = m0 + exclusive_cumsum(ntt)
    tt_t, tt_pos = expand(ntt)
    row = pt[tpat[tt_t]] + tt_pos
    tt_kind, tt_dev, tt_src, tt_coll = A["kind"][row], A["dev"][row], A["src"][row], A["coll"][row]
    tt_bytes = A["nsamp"][row] * ix.tensor_ps_bytes[tt_t] + A["full"][row] * ix.tensor_full_bytes[tt_t]
    tt_sec = _template_seconds(ctx, tt_kind, tt_dev, tt_src, tt_coll, tt_bytes, A["traffic"][row])
    ntb = pb[tpat + 1] - pb[tpat]
    tb_base = n_ib + exclusive_cumsum(ntb)
    tb_t, tb_pos = expand(ntb)
    brow = pb[tpat[tb_t]] + tb_pos
    tb_task = tt_base[tb_t] + A["tb_task"][brow]
    tb_bytes = A["tb_nsamp"][brow] * ix.tensor_ps_bytes[tb_t] + A["tb_full"][brow] * ix.tensor_full_bytes[tb_t]

    def resolve(t, ref):
        """Buffer id of a pattern ref of tensor t (instance output or template buffer)."""
        kp = -ref - 1
        inst_buf = ib_base[op_ptr[t_prod[t]] + np.maximum(kp, 0)] + ix.tensor_rank[t]
        return np.where(ref < 0, inst_buf, tb_base[t] + ref)

    # ---- reads, task by task: compute inputs (port order), then template task inputs ----------
    n_in = (ix.op_in_ptr[1:] - ix.op_in_ptr[:-1])[inst_op]
    r2_task, r2_pos = expand(n_in)
    r2_op = inst_op[r2_task]
    r2_edge = ix.op_in_edges[ix.op_in_ptr[r2_op] + r2_pos]
    r2_kc = r2_task - op_ptr[r2_op]
    et = graph.edge_tensor[r2_edge].astype(np.int64)
    epat = tpat[et]
    r2_buf = resolve(et, A["out_ref"][po[epat] + A["slot_off"][ps[epat] + ix.edge_slot[r2_edge]] + r2_kc])
    nin = pi[tpat + 1] - pi[tpat]
    in_t, in_pos = expand(nin)
    irow = pi[tpat[in_t]] + in_pos
    r1_task = tt_base[in_t] + A["in_task"][irow]
    r1_buf = resolve(in_t, A["in_ref"][irow])

    # ---- PS send-back of updated variables ------------------------------------------------------
    m1 = m0 + int(ntt.sum())
    sb = _send_back(ix, lay_of, sync, cnt, op_ptr, lay_ptr, lay_dev, op_lay, m1)
    sb_src, sb_dst, sb_bytes, sb_op, sb_dep_src, sb_dep_dst = sb
    nx = len(sb_src)
    m2 = m1 + nx
    links = ctx.links

    # ---- control edges: per replica pairs; one empty message per (source, other device) -----
    c_src, c_dst = _control_pairs(ix, _same_devices_layout(lay_ptr, lay_size, lay_dev)[op_lay], cnt, op_ptr)
    cm_src, cm_dev, c_src, c_dst = _control_messages(c_src, c_dst, inst_dev, links.num_devices, m2)
    nc = len(cm_src)
    m = m2 + nc
    cm_sec = links.pair_lat[inst_dev[cm_src], cm_dev] if nc else np.zeros(0)

    # ---- tasks ---------------------------------------------------------------------------------
    kind = np.concatenate([np.full(m0, TASK_COMPUTE), tt_kind, np.full(nx + nc, TASK_TRANSFER)]).astype(np.int8)
    device = np.concatenate([inst_dev, tt_dev, sb_dst, cm_dev]).astype(np.int32)
    src_dev = np.concatenate([np.full(m0, -1), tt_src, sb_src, inst_dev[cm_src]]).astype(np.int32)
    sb_sec = links.pair_lat[sb_src, sb_dst] + sb_bytes / links.pair_bw[sb_src, sb_dst] if nx else np.zeros(0)
    buf_task = np.concatenate([ib_task, tb_task])
    read_task = np.concatenate([r2_task, r1_task])
    read_buf = np.concatenate([r2_buf, r1_buf])
    task_op = np.concatenate([inst_op, t_prod[tt_t], sb_op, inst_op[cm_src]]).astype(np.int64)
    task_mb = _propagate_micro_batch(inst_mb, m, r1_task, buf_task[r1_buf])
    task_mb[m2:] = inst_mb[cm_src]

    # ---- the step's own messages: feed slices out of the feed device, one "done" per device ---
    dep_src = np.concatenate([buf_task[read_buf], c_src, sb_dep_src]).astype(np.int64)
    dep_dst = np.concatenate([read_task, c_dst, sb_dep_dst]).astype(np.int64)
    fed = np.asarray(graph.inputs, dtype=np.int64)
    fed_bytes = ix.op_out_ps_bytes[fed] * batch + ix.op_out_full_bytes[fed]  # [I] each input's global batch
    st = _step_messages(graph, op_ptr, (inst_op, inst_dev, inst_bytes, inst_samp, lay_lo[ent], lay_hi[ent]),
                        kind, device, dep_src, dep_dst, links, batch, fed_bytes)
    ns = len(st["src"])
    if ns:
        kind = np.concatenate([kind, np.full(ns, TASK_TRANSFER, np.int8)])
        device = np.concatenate([device, st["dst"]]).astype(np.int32)
        src_dev = np.concatenate([src_dev, st["src"]]).astype(np.int32)
        task_op = np.concatenate([task_op, st["op"]])
        task_mb = np.concatenate([task_mb, np.zeros(ns, task_mb.dtype)])
        dep_src = np.concatenate([dep_src, st["dep_src"]])
        dep_dst = np.concatenate([dep_dst, st["dep_dst"]])
    coll_all = np.concatenate([np.full(m0, -1), tt_coll, np.full(nx + nc + ns, -1)])
    link_ptr, link_idx, part_ptr, part_dev = _links_and_parts(ctx, kind, device, src_dev, coll_all)
    # priority key (group priority, micro-batch index on its device, run rank): micro-batch
    # 0 of every op of a stage runs before micro-batch 1, so a pipeline stage hands its first
    # micro-batch on early and stages overlap (the rewrite's priority chains follow it too)
    task_prio = (prio_grp[task_op] * n_mb + task_mb) * (n + 1) + ctx.op_rank[task_op]

    # ---- static memory: every copy of a variable (weights on holders, slots where updated) ----
    v_idx, v_pos = expand(cnt[ix.var_op])
    v_dev = inst_dev[op_ptr[ix.var_op[v_idx]] + v_pos]
    static = np.bincount(v_dev, weights=ix.var_bytes[v_idx], minlength=links.num_devices)

    seconds = np.concatenate([inst_sec, tt_sec, sb_sec, cm_sec, st["seconds"]])
    samples = np.concatenate([inst_samp, A["nsamp"][row], np.zeros(nx + nc, np.int64), st["samples"]])
    buf_tensor = np.concatenate([ib_t, tb_t])
    buf_device = np.concatenate([inst_dev[ib_task], A["tb_dev"][brow]])
    buf_bytes = np.concatenate([ib_bytes, tb_bytes])
    w_buf, w_dev, _, w_task = weighted_reads(kind, device, samples, read_task, read_buf, buf_task, buf_tensor,
                                             buf_device, graph.tensor_batch_axis, ix.tensor_weight_mean, batch)
    # the rewrite's aggregation-weight multiply (tfplace.rewrite.nodes.scaled): reads and writes the partial
    seconds += np.bincount(w_task, weights=ctx.options.aux_launch_s + 2.0 * buf_bytes[w_buf] / ctx.mem_bw[w_dev],
                           minlength=len(seconds))
    task_bytes = np.concatenate([inst_bytes, tt_bytes, sb_bytes, np.zeros(nc), st["bytes"]])
    task_tensor = np.concatenate([np.full(m0, -1), tt_t, np.full(nx + nc + ns, -1)])
    task_lo = np.concatenate([lay_lo[ent], A["lo"][row], np.zeros(nx + nc, np.int64), st["lo"]])
    task_hi = np.concatenate([lay_hi[ent], A["hi"][row], np.full(nx + nc, batch), st["hi"]])
    m_all = len(kind)
    scratch = _scratch(kind, (np.arange(m1, m2), sb_dst, sb_bytes), (part_ptr, part_dev, task_bytes), links.is_cpu)
    return PlacedGraph(
        device_names=ctx.cluster.device_names, global_batch_size=batch, num_compute=m0, op_task_ptr=op_ptr,
        task_kind=kind, task_device=device.astype(np.int32), task_src_device=src_dev.astype(np.int32),
        task_op=task_op.astype(np.int32), task_tensor=task_tensor.astype(np.int32),
        task_samples=samples.astype(np.int32), task_lo=task_lo.astype(np.int32), task_hi=task_hi.astype(np.int32),
        task_seconds=seconds, task_bytes=task_bytes, task_priority=task_prio,
        task_weight=np.concatenate([inst_samp / batch, np.zeros(m_all - m0)]),
        dep_src=dep_src.astype(np.int32), dep_dst=dep_dst.astype(np.int32),
        link_ptr=link_ptr, link_idx=link_idx, link_names=links.link_names,
        link_bandwidth_bytes_per_s=links.link_bw, part_ptr=part_ptr, part_dev=part_dev,
        buf_task=buf_task.astype(np.int32), buf_device=buf_device.astype(np.int32),
        buf_bytes=buf_bytes, buf_tensor=buf_tensor.astype(np.int32),
        out_ptr=exclusive_cumsum(np.bincount(buf_task, minlength=m_all)),
        in_ptr=exclusive_cumsum(np.bincount(read_task, minlength=m_all)), in_buf=read_buf.astype(np.int32),
        in_edge=np.concatenate([r2_edge, np.full(len(r1_task), -1)]).astype(np.int32), static_bytes=static,
        tensor_weight_mean=ix.tensor_weight_mean, op_names=graph.names,
        tensor_mean_scaled=ix.tensor_mean_scaled, tensor_batch_rows=ix.tensor_batch_rows,
        task_control=np.concatenate([np.arange(m) >= m2, st["control"]]), step_message_start=m if ns else -1,
        device_cpu_fraction=ctx.cpu_fraction, input_ops=fed.astype(np.int32), feed_bytes=float(np.sum(fed_bytes)),
        **scratch)


def _scratch(kind, send_backs, collectives, is_cpu) -> dict:
    """PlacedGraph.scratch_*: what the rewritten step's nodes hold beyond the PlacedGraph's buffers
    (the exact live bytes of the rewritten step, reconstructed from TF FULL_TRACE allocation
    records: without these the simulated DP-PS workers were 0.72-0.85 of the real
    peak, and a plan said to fit ran out of memory):
      * a PS send-back's received value on the worker (the Recv output the rewrite assigns to
        the mirror), at the transfer;
      * a CPU all-reduce's exchange (tfplace.ir.node_defs): each participant holds the n-1 shards
        of 1/n of the tensor it receives, then the n-1 sums it gathers, (n-1)/n of the tensor at
        a time (measured: 2 x 22 MB shards next to the 66 MB bucket on 3 CPU devices).
    An aggregation-weight Mul's output (tfplace/weighted_*) adds none: the Mul is its raw
    partial's one reader in the rewritten step, so TensorFlow frees the partial once weighted,
    while the simulator keeps the partial until the SUM, update or collective that reads the
    Mul ends; counting both put the transformer's DP-PS server at 1.49 of its real peak.
    send_backs: (task, destination device, bytes)[K]; collectives: (part_ptr, part_dev,
    task_bytes) of every task; is_cpu [D]."""
    sb_task, sb_dev, sb_bytes = send_backs
    part_ptr, part_dev, task_bytes = collectives
    nparts = np.diff(part_ptr)
    cpu = np.asarray(is_cpu, dtype=bool)
    c_task = np.repeat(np.arange(len(kind)), nparts)
    all_cpu = np.ones(len(kind), dtype=bool)
    np.logical_and.at(all_cpu, c_task, cpu[part_dev])
    ex = all_cpu[c_task] & (kind[c_task] == TASK_COLLECTIVE)
    n = nparts[c_task[ex]]
    tasks = np.concatenate([sb_task, c_task[ex]]).astype(np.int32)
    return {"scratch_task": tasks,
            "scratch_device": np.concatenate([sb_dev, part_dev[ex]]).astype(np.int32),
            "scratch_bytes": np.concatenate([sb_bytes, (n - 1) / n * task_bytes[c_task[ex]]]).astype(np.float64),
            "scratch_free_task": tasks}


def _micro_batch_index(lay_ptr, lay_size, lay_dev, lay_samp) -> np.ndarray:
    """Per layout entry: its micro-batch index among the entries of its layout on the same device
    (0 for the first micro-batch a device runs; mirrors, samples 0, are 0)."""
    owner, pos = expand(lay_size)
    order = np.lexsort((pos, lay_dev[:len(owner)], owner))
    key = owner[order] * (int(lay_dev.max(initial=0)) + 1) + lay_dev[order]
    start = np.ones(len(order), dtype=bool)
    start[1:] = key[1:] != key[:-1]
    run_start = np.maximum.accumulate(np.where(start, np.arange(len(order)), 0))
    mb = np.zeros(len(owner), dtype=np.int64)
    mb[order] = np.arange(len(order)) - run_start
    return np.where(lay_samp[:len(owner)] > 0, mb, 0)


def _propagate_micro_batch(inst_mb, m, read_task, read_src) -> np.ndarray:
    """Micro-batch index per task: compute instances from their layout entry; a template task
    (transfer, re-split, sum, collective) takes the smallest index among the tasks it reads
    (templates of one tensor read each other in chains of at most a few hops); send-backs 0."""
    m0 = len(inst_mb)
    big = np.iinfo(np.int64).max
    mb = np.concatenate([inst_mb, np.full(m - m0, big, dtype=np.int64)])
    for _ in range(4):
        new = mb.copy()
        np.minimum.at(new, read_task, mb[read_src])
        new[:m0] = inst_mb
        if np.array_equal(new, mb):
            break
        mb = new
    return np.where(mb == big, 0, mb)


def _template_seconds(ctx, kind, dev, src, coll, nbytes, traffic) -> np.ndarray:
    """Transfers: path latency + bytes / bottleneck; re-split and sum: launch + traffic * bytes /
    memory bandwidth; collectives: the ring (or fitted) model."""
    links = ctx.links
    sec = np.zeros(len(kind))
    x = kind == TASK_TRANSFER
    sec[x] = links.pair_lat[src[x], dev[x]] + nbytes[x] / links.pair_bw[src[x], dev[x]]
    aux = (kind == TASK_RESPLIT) | (kind == TASK_SUM)
    sec[aux] = ctx.options.aux_launch_s + traffic[aux] * nbytes[aux] / ctx.mem_bw[dev[aux]]
    c = kind == TASK_COLLECTIVE
    if c.any():
        sec[c] = links.collective_seconds(coll[c], nbytes[c])
    return sec


def _links_and_parts(ctx, kind, device, src_dev, coll):
    """CSR of the links each transfer / collective holds, and of collective participants."""
    links = ctx.links
    x = kind == TASK_TRANSFER
    pair = np.where(x, src_dev.astype(np.int64) * links.num_devices + device, 0)
    c_link_ptr, c_link_idx, c_part_ptr, c_part_idx = ctx.collective_arrays()
    is_c = kind == TASK_COLLECTIVE
    cc = np.where(is_c, coll, 0)
    n_links = np.where(x, links.pair_ptr[pair + 1] - links.pair_ptr[pair], 0)
    n_parts = np.zeros(len(kind), dtype=np.int64)
    if is_c.any():
        n_links[is_c] = c_link_ptr[cc[is_c] + 1] - c_link_ptr[cc[is_c]]
        n_parts[is_c] = c_part_ptr[cc[is_c] + 1] - c_part_ptr[cc[is_c]]
    l_task, l_pos = expand(n_links)
    link_idx = np.empty(len(l_task), dtype=np.int64)
    lx = x[l_task]
    link_idx[lx] = links.pair_idx[links.pair_ptr[pair[l_task[lx]]] + l_pos[lx]]
    link_idx[~lx] = c_link_idx[c_link_ptr[cc[l_task[~lx]]] + l_pos[~lx]]
    p_task, p_pos = expand(n_parts)
    part_dev = c_part_idx[c_part_ptr[cc[p_task]] + p_pos] if len(p_task) else np.zeros(0, np.int64)
    return exclusive_cumsum(n_links), link_idx.astype(np.int32), exclusive_cumsum(n_parts), part_dev.astype(np.int32)


def _same_devices_layout(lay_ptr, lay_size, lay_dev) -> np.ndarray:
    """int64[L]: for each layout, the smallest layout id with the same device sequence (layouts
    that differ only in what their instances hold, e.g. a batch slice and a gradient partial,
    place instance k on the same device)."""
    first: dict = {}
    out = np.empty(len(lay_size), np.int64)
    for lay in range(len(lay_size)):
        key = tuple(lay_dev[lay_ptr[lay]:lay_ptr[lay] + lay_size[lay]].tolist())
        out[lay] = first.setdefault(key, lay)
    return out


def _control_pairs(ix: GraphIndex, op_lay, cnt, op_ptr):
    """Control edges per replica: instance k -> instance k when both ops' layouts put instance k
    on the same device for every k (`op_lay` holds `_same_devices_layout` ids), else every source
    instance -> every destination instance. Per replica keeps each replica's own order without
    making replicas wait on each other (which would cost a cross-task message per pair)."""
    s, d = ix.control_src, ix.control_dst
    if len(s) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    same = op_lay[s] == op_lay[d]
    num = np.where(same, cnt[s], cnt[s] * cnt[d])
    e, pos = expand(num)
    cd = cnt[d[e]]
    ks = np.where(same[e], pos, pos // np.maximum(cd, 1))
    kd = np.where(same[e], pos, pos % np.maximum(cd, 1))
    return op_ptr[s[e]] + ks, op_ptr[d[e]] + kd


def _step_messages(graph, op_ptr, instances, kind, device, dep_src, dep_dst, links, batch: int,
                   fed_bytes: np.ndarray) -> dict:
    """The messages of the step itself, which the runtime sends besides the graph's own tensors.

    The global batch is fed on the *feed device* (the first input's first instance), where each
    replica's slice is cut (the rewrite's "inputs"): an input instance on another device receives
    its slice as a message of its bytes, after the feed has arrived (the first input's first
    instance, which carries the step's dispatch cost) and before it runs. The session's master
    is task 0, and TensorFlow delivers every feed to the master's CPU: where the feed device is
    on another task, each input first travels whole (`fed_bytes[i]`, the global batch) from task
    0's first device to the feed device, before that input's instances there and its slices
    leave. The step ends when the train op on the feed device has run after every task: every
    other device that ends with tasks nothing else waits for sends it one empty "done" message,
    after all of them (the rewrite gathers them under one NoOp there, the message's source).

    instances: (op, device, bytes, samples, lo, hi) per COMPUTE instance; kind/device and the
    dependencies of the M tasks so far. Returns per new task (feed hops, feed slices, then "done"
    messages, task ids M, M+1, ...): src, dst, op, bytes, seconds, samples, lo, hi, control, and
    their dependencies dep_src/dep_dst. Empty when the graph has no input."""
    inst_op, inst_dev, inst_bytes, inst_samp, inst_lo, inst_hi = instances
    m = len(kind)
    empty = {k: np.zeros(0, np.int64) for k in ("src", "dst", "op", "samples", "lo", "hi", "dep_src", "dep_dst")}
    empty.update(bytes=np.zeros(0), seconds=np.zeros(0), control=np.zeros(0, bool))
    if not graph.inputs:
        return empty
    inputs = np.asarray(graph.inputs, dtype=np.int64)
    first = int(op_ptr[inputs[0]])
    feed = int(inst_dev[first])
    task = np.asarray(links.task)
    master = int(np.nonzero(task == 0)[0][0])
    nh = len(inputs) if task[feed] != 0 else 0
    is_input = np.isin(inst_op, inputs)
    fx = np.nonzero(is_input & (inst_dev != feed))[0]
    nf = len(fx)
    has_succ = np.zeros(m, bool)
    has_succ[dep_src] = True
    leaves = np.nonzero(~has_succ & (device >= 0) & (device != feed))[0]
    done_dev, leaf_done = np.unique(device[leaves], return_inverse=True)
    nd = len(done_dev)
    src = np.concatenate([np.full(nh, master), np.full(nf, feed), done_dev]).astype(np.int64)
    dst = np.concatenate([np.full(nh, feed), inst_dev[fx], np.full(nd, feed)]).astype(np.int64)
    nbytes = np.concatenate([np.asarray(fed_bytes, dtype=np.float64)[:nh], inst_bytes[fx], np.zeros(nd)])
    hop_ids = m + np.arange(nh)
    feed_ids, done_ids = m + nh + np.arange(nf), m + nh + nf + np.arange(nd)
    # an input's hop precedes its instances on the feed device and its slices to the others
    hop_src = hop_dst = np.zeros(0, np.int64)
    if nh:
        hop_of = {int(op): int(h) for op, h in zip(inputs, hop_ids)}
        waits = np.concatenate([np.nonzero(is_input & (inst_dev == feed))[0], fx])
        hop_src = np.array([hop_of[int(op)] for op in inst_op[waits]], dtype=np.int64)
        hop_dst = np.concatenate([waits[:len(waits) - nf], feed_ids]).astype(np.int64)
    return {"src": src, "dst": dst,
            "op": np.concatenate([inputs[:nh], inst_op[fx], np.full(nd, graph.sink)]).astype(np.int64),
            "bytes": nbytes, "seconds": links.pair_lat[src, dst] + nbytes / links.pair_bw[src, dst],
            "samples": np.concatenate([np.full(nh, batch), inst_samp[fx], np.zeros(nd, np.int64)]),
            "lo": np.concatenate([np.zeros(nh, np.int64), inst_lo[fx], np.zeros(nd, np.int64)]),
            "hi": np.concatenate([np.full(nh, batch), inst_hi[fx], np.full(nd, batch)]),
            "control": np.concatenate([np.zeros(nh + nf, bool), np.ones(nd, bool)]),
            "dep_src": np.concatenate([hop_src, np.full(nf, first), feed_ids, leaves]).astype(np.int64),
            "dep_dst": np.concatenate([hop_dst, feed_ids, fx, done_ids[leaf_done]]).astype(np.int64)}


def _control_messages(c_src, c_dst, inst_dev, num_devices: int, first_task: int):
    """Control pairs between instances on different devices go through an empty message, one per
    (source instance, destination device) as TensorFlow's partitioner sends it.

    Returns (msg_src[C'] source instance, msg_dev[C'] destination device, dep_src, dep_dst): the
    dependencies replacing the pairs (same-device pairs kept, source -> message -> destination
    for the others); message i is task first_task + i."""
    cross = inst_dev[c_src] != inst_dev[c_dst]
    key = c_src[cross] * num_devices + inst_dev[c_dst[cross]]
    uniq, which = np.unique(key, return_inverse=True)
    msg_src, msg_dev = uniq // num_devices, uniq % num_devices
    msg = first_task + np.arange(len(uniq), dtype=np.int64)
    dep_src = np.concatenate([c_src[~cross], msg_src, msg[which]])
    dep_dst = np.concatenate([c_dst[~cross], msg, c_dst[cross]])
    return msg_src.astype(np.int64), msg_dev.astype(np.int64), dep_src, dep_dst


def _send_back(ix: GraphIndex, lay_of, sync, cnt, op_ptr, lay_ptr, lay_dev, op_lay, first_task):
    """PS groups: after a variable's updates on the PS, its new value goes to every other
    device holding a copy (a TRANSFER of the variable's bytes, depending on every update).
    Returns (src, dst, bytes, op, dep_src, dep_dst) arrays."""
    src, dst, nbytes, ops, dep_src, dep_dst = [], [], [], [], [], []
    if (sync == SYNC_PS).any():
        task = first_task
        for v in range(len(ix.var_op)):
            h = int(ix.var_op[v])
            grp = int(ix.op_group[h])
            ups = ix.var_upd[ix.var_upd_ptr[v]:ix.var_upd_ptr[v + 1]]
            if sync[grp] != SYNC_PS or len(ups) == 0:
                continue
            server = int(lay_dev[lay_ptr[lay_of[grp, LK_UPD]]])
            holders = lay_dev[lay_ptr[op_lay[h]]:lay_ptr[op_lay[h]] + cnt[h]].tolist()
            upd_tasks = [t for u in ups.tolist() for t in range(int(op_ptr[u]), int(op_ptr[u + 1]))]
            for d in holders:
                if d != server:
                    src.append(server), dst.append(d), nbytes.append(float(ix.var_bytes[v])), ops.append(h)
                    dep_src.extend(upd_tasks), dep_dst.extend([task] * len(upd_tasks))
                    task += 1
    ints = [np.array(x, dtype=np.int64) for x in (src, dst, ops, dep_src, dep_dst)]
    return ints[0], ints[1], np.array(nbytes, dtype=np.float64), ints[2], ints[3], ints[4]
