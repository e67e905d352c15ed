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

from tfplace.overheads.cpu_demand import cpu_fractions, device_cpu_seconds, dispatch_cpu_seconds, side_cpu_entries
from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import FieldReader
from tfplace.lowering.graph_index import LK_UPD, GraphIndex
from tfplace.lowering.layouts import SYNC_PS
from tfplace.lowering.placed_graph import (DEVICE_KINDS, TASK_COLLECTIVE, TASK_COMPUTE, TASK_HANDLER, TASK_RESPLIT, TASK_SUM,
                                  TASK_TRANSFER, PlacedGraph)


def expand(counts: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(owner, pos): owner[k] = i repeated counts[i] times, pos = 0..counts[i]-1 within each."""
    counts = np.asarray(counts, dtype=np.int64)
    owner = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    return owner, np.arange(len(owner)) - starts[owner]


def exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.zeros(len(x) + 1, dtype=np.int64)
    np.cumsum(x, out=out[1:])
    return out


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
    # the rewrite's aggregation-weight multiply (rewrite_nodes.scaled): reads and writes the partial
    seconds += np.bincount(w_task, weights=ctx.options.aux_launch_s + 2.0 * buf_bytes[w_buf] / ctx.mem_bw[w_dev],
                           minlength=len(seconds))
    task_bytes = np.concatenate([inst_bytes, tt_bytes, sb_bytes, np.zeros(nc), st["bytes"]])
    dep_src, dep_dst = dep_src.astype(np.int32), dep_dst.astype(np.int32)
    feed_bytes = float(np.sum(fed_bytes))
    over = _overheads(ctx)
    dispatch = _dispatch(over, kind, device, op_ptr, graph)  # the lanes' wall charge and the demand's CPU
    hold, charge, off_lane, send_cpu = _runtime_overheads(seconds, kind, device, src_dev, dep_src, dep_dst, ctx, over,
                                                          dispatch, len(graph.inputs), np.diff(part_ptr), feed_bytes)
    t = {"kind": kind, "device": device, "src_dev": src_dev, "op": task_op, "prio": task_prio,
         "seconds": seconds, "charge": charge, "hold": hold, "bytes": task_bytes,
         "tensor": np.concatenate([np.full(m0, -1), tt_t, np.full(nx + nc + ns, -1)]),
         "samples": samples,
         "lo": np.concatenate([lay_lo[ent], A["lo"][row], np.zeros(nx + nc, np.int64), st["lo"]]),
         "hi": np.concatenate([lay_hi[ent], A["hi"][row], np.full(nx + nc, batch), st["hi"]]),
         "control": np.concatenate([np.arange(m) >= m2, st["control"]]), "link_ptr": link_ptr, "part_ptr": part_ptr}
    if send_cpu is not None:
        dep_src, dep_dst = _append_handlers(t, send_cpu, dep_src, dep_dst)
    # the CPU collectives and message bytes cost, per (task, device): counted once in the
    # demand, and put on the CPU devices' lanes after it
    side = side_cpu_entries(over, t["kind"] == TASK_TRANSFER, t["kind"] == TASK_COLLECTIVE, t["device"],
                            t["src_dev"], t["bytes"], t["part_ptr"], part_dev,
                            [d.kind for d in ctx.cluster.devices])
    cpu_s, fraction = _cpu_demand(ctx, over, t["seconds"], t["charge"], off_lane, t["kind"], t["device"], t["src_dev"],
                                  side, dispatch)
    if len(fraction):
        dep_src, dep_dst = _append_side_cpu(t, side, fraction, ctx, dep_src, dep_dst)
    dep_src, dep_dst = _append_worker_dispatch(t, dispatch, dep_src, dep_dst)
    m_all = len(t["kind"])

    return PlacedGraph(
        device_names=ctx.cluster.device_names, global_batch_size=batch, num_compute=m0, op_task_ptr=op_ptr,
        task_kind=t["kind"], task_device=t["device"].astype(np.int32), task_src_device=t["src_dev"].astype(np.int32),
        task_op=t["op"].astype(np.int32), task_tensor=t["tensor"].astype(np.int32),
        task_samples=t["samples"].astype(np.int32), task_lo=t["lo"].astype(np.int32), task_hi=t["hi"].astype(np.int32),
        task_seconds=t["seconds"], task_bytes=t["bytes"], task_priority=t["prio"],
        task_weight=np.concatenate([inst_samp / batch, np.zeros(m_all - m0)]),
        dep_src=dep_src, dep_dst=dep_dst,
        link_ptr=t["link_ptr"], link_idx=link_idx, link_names=links.link_names,
        link_bandwidth_bytes_per_s=links.link_bw, part_ptr=t["part_ptr"], part_dev=part_dev,
        buf_task=buf_task.astype(np.int32), buf_device=buf_device.astype(np.int32),
        buf_bytes=buf_bytes, buf_tensor=buf_tensor.astype(np.int32),
        out_ptr=exclusive_cumsum(np.bincount(buf_task, minlength=m_all)),
        in_ptr=exclusive_cumsum(np.bincount(read_task, minlength=m_all)), in_buf=read_buf.astype(np.int32),
        in_edge=np.concatenate([r2_edge, np.full(len(r1_task), -1)]).astype(np.int32), static_bytes=static,
        tensor_weight_mean=ix.tensor_weight_mean, op_names=graph.names,
        tensor_mean_scaled=ix.tensor_mean_scaled, tensor_batch_rows=ix.tensor_batch_rows,
        task_control=t["control"], task_hold_seconds=t["hold"],
        step_message_start=m if ns else -1, device_cpu_seconds=cpu_s, device_cpu_fraction=fraction)


def weighted_reads(kind, device, samples, read_task, read_buf, buf_task, buf_tensor, buf_device, tensor_batch_axis,
                   tensor_weight_mean, batch: int) -> tuple:
    """Where the rewrite multiplies a replica's partial value by its aggregation weight
    (tfplace.rewrite.graph_rewrite, "weights"): (buffer[W], device[W], weight[W], charged task[W]), one entry
    per (buffer, device) as the rewrite emits one Mul per pair.

    A read is weighted when its task aggregates (a SUM, a COLLECTIVE, or an update instance: a
    COMPUTE with no samples) and the buffer, followed back through TRANSFERs to its origin, is a
    raw partial: made by a COMPUTE instance with samples, of a tensor without a batch axis that
    is mean-weighted (tensor_weight_mean), with weight samples / batch != 1. The Mul runs on the
    aggregating device (a COLLECTIVE's: the participant whose buffer it is). Its cost is charged
    to the task that made the buffer when that is a COMPUTE on the same device (the gradient
    op, before a collective), else to the aggregating task.

    kind, device, samples [M]: the tasks; read_task, read_buf [R]: every data read; buf_task,
    buf_tensor, buf_device [B]: the buffers; tensor_batch_axis, tensor_weight_mean [T]."""
    m = len(kind)
    first_in = np.full(m, -1, dtype=np.int64)  # a transfer's input buffer (its first read)
    x = kind[read_task] == TASK_TRANSFER
    first_in[read_task[x][::-1]] = read_buf[x][::-1]
    origin = np.asarray(read_buf, dtype=np.int64).copy()
    for _ in range(m):
        up = buf_task[origin]
        step = (kind[up] == TASK_TRANSFER) & (first_in[up] >= 0)
        if not step.any():
            break
        origin[step] = first_in[up[step]]
    src, tensor = buf_task[origin], buf_tensor[origin]
    weight = np.where(kind[src] == TASK_COMPUTE, samples[src] / batch, 1.0)
    raw = (kind[src] == TASK_COMPUTE) & (samples[src] > 0) & (tensor_batch_axis[tensor] < 0) & tensor_weight_mean[tensor]
    ck = kind[read_task]
    aggregates = (ck == TASK_SUM) | (ck == TASK_COLLECTIVE) | ((ck == TASK_COMPUTE) & (samples[read_task] == 0))
    sel = np.nonzero(aggregates & raw & (weight != 1.0))[0]
    dev = np.where(ck[sel] == TASK_COLLECTIVE, buf_device[read_buf[sel]], device[read_task[sel]]).astype(np.int64)
    _, first = np.unique(read_buf[sel].astype(np.int64) * (int(device.max(initial=0)) + 1) + dev, return_index=True)
    sel, dev = sel[first], dev[first]
    buf = read_buf[sel].astype(np.int64)
    maker = buf_task[buf]
    charged = np.where((kind[maker] == TASK_COMPUTE) & (device[maker] == dev), maker, read_task[sel])
    return buf, dev, weight[sel], charged.astype(np.int64)


def placed_weighted_reads(placed, tensor_batch_axis) -> tuple:
    """weighted_reads of a PlacedGraph lowered from a graph with `tensor_batch_axis` [T] (the
    lowered graph's, metadata clones included): what the rewrite multiplies, and where."""
    p = placed
    read_task = np.repeat(np.arange(p.num_tasks), np.diff(p.in_ptr))
    return weighted_reads(p.task_kind, p.task_device, p.task_samples, read_task, p.in_buf.astype(np.int64),
                          p.buf_task.astype(np.int64), p.buf_tensor.astype(np.int64), p.buf_device,
                          tensor_batch_axis, p.tensor_weight_mean, p.global_batch_size)


def _append_handlers(t, send_cpu, dep_src, dep_dst):
    """Appends the HANDLER tasks of _handlers to the per-task arrays `t` (name -> [M] array, the
    CSR pointers link_ptr and part_ptr [M+1]; changed in place) and returns the dependencies
    (src, dst) with theirs."""
    hx, h_dev, h_sec, h_src, h_dst = _handlers(t["kind"], t["device"], t["src_dev"], send_cpu, dep_src, dep_dst)
    last = np.full(len(hx), int(t["prio"].max(initial=0)) + 1)  # after every other task on its lane
    _extend_with_handlers(t, hx, h_dev, h_sec, last)
    return np.concatenate([dep_src, h_src]).astype(np.int32), np.concatenate([dep_dst, h_dst]).astype(np.int32)


def _extend_with_handlers(t, owner, device, seconds, prio) -> None:
    """Appends one HANDLER task per entry to `t` (in place): on `device`, lasting `seconds`, with
    priority `prio`, naming the op and tensor of its `owner` task; no bytes, links or
    participants. "charge" (when present) gets the seconds: a handler's time is all runtime CPU;
    "hold" only when it is not empty (empty: links are held for the whole duration)."""
    nh = len(owner)
    new = {"kind": np.full(nh, TASK_HANDLER, np.int8), "device": device, "src_dev": np.full(nh, -1), "prio": prio,
           "seconds": seconds, "charge": seconds, "hold": seconds, "bytes": np.zeros(nh),
           "samples": np.zeros(nh, np.int64), "control": np.zeros(nh, bool),
           **{key: t[key][owner] for key in ("op", "tensor", "lo", "hi")},
           **{key: np.full(nh, t[key][-1]) for key in ("link_ptr", "part_ptr")}}
    for key, values in new.items():
        if t[key] is not None and (key != "hold" or len(t[key])):
            t[key] = np.concatenate([t[key], values])


def _append_side_cpu(t, side, fraction, ctx, dep_src, dep_dst):
    """Puts the CPU that collectives and message bytes cost their CPU devices (`side`:
    tfplace.overheads.cpu_demand.side_cpu_entries of `t`) on those devices' lanes as HANDLER tasks, one per
    (collective or transfer, CPU device): cpu_s / f_d seconds (the device's CPU fraction
    `fraction` [D] stretches them like its kernels), ready with their collective or transfer
    (after every task it depends on) and with its priority, and gating nothing. The collective
    or transfer keeps its own time: measured alone, it held that CPU already. What they add is
    that the lane cannot run kernels meanwhile: a pipeline stage whose weights are all-reduced
    between two throttled tasks computes more slowly for it (ResNet-50's second stage, on the
    emulated heterogeneous cluster: the step was the three tasks' CPU summed, while the lanes
    alone let them overlap; benchmarks/fidelity_bench_hetero.md), where a data-parallel chain
    of all-reduces, whose lanes wait idle, is as long as before. GPUs run no such CPU on their
    lanes. Returns the dependencies (src, dst) with the new ones."""
    owner, dev, cpu_s = side
    keep = _cpu_devices(ctx)[dev] & (cpu_s > 0)
    owner, dev, cpu_s = owner[keep], dev[keep], cpu_s[keep]
    if not len(owner):
        return dep_src, dep_dst
    m = len(t["kind"])
    count = np.bincount(owner, minlength=m)  # handlers per owner, numbered m + ... in owner order
    first = m + np.cumsum(count) - count
    into = count[dep_dst] > 0  # every task an owner waits for, each of its handlers waits for
    k = count[dep_dst[into]]
    new_src = np.repeat(dep_src[into], k)
    new_dst = np.repeat(first[dep_dst[into]], k) + np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
    _extend_with_handlers(t, owner, dev, cpu_s / fraction[dev], t["prio"][owner])
    return np.concatenate([dep_src, new_src]).astype(np.int32), np.concatenate([dep_dst, new_dst]).astype(np.int32)


def _handlers(kind, device, src_dev, send_cpu, dep_src, dep_dst):
    """HANDLER tasks (placed_graph) for each transfer x with message CPU at its sending end
    (send_cpu[M] > 0): the sender's handler on x's source lane, lasting send_cpu[x], after every
    task x waits for and before x; and the receiver's hand-back on x's destination lane, lasting
    0 s, after x and before every task that waits for x (the response arrives on a network
    thread, which queues the waiting ops behind the ones the executor made ready itself).

    Returns (hx[2H]: the transfer of each handler, handler k being task M + k; h_dev[2H];
    h_seconds[2H]; the new dependencies (src, dst)). Every existing dependency stays (the
    rewrite reads them)."""
    m = len(kind)
    x = np.nonzero((kind == TASK_TRANSFER) & (send_cpu > 0))[0]
    h = len(x)
    sender = np.full(m, -1, np.int64)
    sender[x] = m + np.arange(h)
    receiver = np.full(m, -1, np.int64)
    receiver[x] = m + h + np.arange(h)
    into, out_of = sender[dep_dst] >= 0, receiver[dep_src] >= 0
    new_src = np.concatenate([dep_src[into], sender[x], x, receiver[dep_src[out_of]]])
    new_dst = np.concatenate([sender[dep_dst[into]], x, receiver[x], dep_dst[out_of]])
    return (np.concatenate([x, x]), np.concatenate([src_dev[x], device[x]]),
            np.concatenate([send_cpu[x], np.zeros(h)]), new_src.astype(np.int64), new_dst.astype(np.int64))


def _overheads(ctx) -> dict:
    """The profile conditions' `runtime_overheads` ({} without them)."""
    prof = getattr(ctx, "profile", None)
    return ((getattr(prof, "conditions", None) or {}).get("runtime_overheads") or {}) if prof is not None else {}


def _cpu_demand(ctx, over, seconds, charge, off_lane, kind, device, src_dev, side, dispatch):
    """(device_cpu_seconds[D], device_cpu_fraction[D]) of tfplace.overheads.cpu_demand; both empty when the
    runtime overheads give no CPU beside the lanes: no collective, per-byte or off-lane message
    CPU (the bound could not pass the lanes then). over: _overheads(ctx); charge / off_lane: the message CPU on the
    lanes / beside them (_runtime_overheads); side: side_cpu_entries (task, device, cpu_s);
    dispatch: _dispatch's (task, wall seconds, devices used, further devices' wait), the
    dispatch's CPU in place of its wall on the first input's device (cpu_demand.dispatch_cpu_seconds)."""
    if not (over.get("collective_cpu_s") or over.get("message_cpu_s_per_byte") or off_lane is not None):
        return np.zeros(0), np.zeros(0)
    fraction = cpu_fractions(ctx.profile, [d.kind for d in ctx.cluster.devices])
    lane = np.isin(kind, DEVICE_KINDS)
    demand = device_cpu_seconds(lane, kind == TASK_TRANSFER, seconds,
                                charge if charge is not None else np.zeros(len(seconds)), device, src_dev,
                                side[1], side[2], fraction, message_cpu=off_lane)
    first, wall_s, used, _ = dispatch
    if first >= 0:
        demand = demand + dispatch_cpu_seconds(over, wall_s, int(device[first]), used, fraction, _cpu_devices(ctx))
    return demand, fraction


def _cpu_devices(ctx) -> np.ndarray:
    """[D] bool: which of the cluster's devices are CPUs (LinkCosts.is_cpu)."""
    return np.asarray(ctx.links.is_cpu, dtype=bool)


def _runtime_overheads(seconds, kind, device, src_dev, dep_src, dep_dst, ctx, over, dispatch, num_inputs,
                       group_size, feed_bytes=0.0):
    """Adds the measured costs of the runtime the profile was taken for to `seconds` (in place)
    and returns (the link-hold time of every task (empty: links are held for the whole duration),
    the message CPU added to each lane task (None: none), the message CPU of each transfer task
    that runs beside the lanes, as (sending end[M], receiving end[M]) (None: none), the sending
    end's message CPU of each transfer task,
    to run as its HANDLER task (None: none); see inter_op_threads). `over`: _overheads(ctx);
    `dispatch`: _dispatch's (task, wall seconds, devices used, further devices' wait) for step_s;
    `num_inputs`: the graph's fed inputs; `group_size` [M]: each task's participants (collectives).

    They come from the profile conditions `runtime_overheads`, written by
    benchmarks/fidelity_bench.py from micro-benchmarks on the local cluster; absent, nothing is
    added. Keys (seconds):
      step_s         once per step (client -> master -> workers dispatch and the fetch), charged
                     to the first input's first instance: nothing starts before the feed arrives;
      feed_input_s, feed_s_per_byte   the feed, charged there too: per fed input beyond the
                     first and per byte of all inputs at the global batch (`feed_bytes`);
      worker_s       per further task running part of the step (the master's RunGraph to it):
                     not charged here; each further device's lane waits worker_s times the
                     further tasks before it starts (_append_worker_dispatch: the master sends
                     them all at once, and the micro-benchmark timed them together). As CPU
                     (step_cpu_s, master_worker_cpu_s, worker_cpu_s) the dispatch is
                     tfplace.overheads.cpu_demand.dispatch_cpu_seconds's, in the demand;
      op_s           per compute task (executor dispatch around each kernel the profile timed);
      transfer_s, collective_s   per transfer / collective on top of its link time (the
                     cluster's pair latency + bytes / bandwidth) or all-reduce fit (a message in
                     a step costs more than the best case); transfer_s and message_cpu_s may be
                     given per pair of device kinds (_per_message); transfer_s is what a message
                     takes beyond its link time *and* its message_cpu_s (on the lanes, or in the
                     transfer: inter_op_threads), and may be negative (that CPU already holds
                     part of the link's latency); a transfer never lasts less than 0 before the
                     message CPU is added to it; collective_s may be given per group size
                     {"3": ...} (_per_group) and may be negative too: the fit comes from single
                     traced all-reduces, and one in a chain of untraced ones, as a step runs
                     them, takes less (3 tasks on the emulated heterogeneous cluster: 0.52-0.61
                     ms at 16 bytes against the fit's 1.02-1.28 ms); a collective never lasts
                     less than 0;
      message_cpu_s  CPU time one gRPC message costs its two processes together (serialising,
                     the RPC, the rendezvous), taken from the executors of those processes: the
                     sending end's part on the sending device's lane (a HANDLER task, see
                     inter_op_threads), the receiving end's on the receiving device's lane
                     (added to the first task it feeds there). With `cpu_cores` on the host,
                     this is CPU the devices compete for;
      message_cpu_share  per pair of different device kinds, the share of message_cpu_s each
                     end's kind pays ({"CPU|CPU_half": {"CPU": 0.42, "CPU_half": 0.58}};
                     _message_ends); half each without it;
      transfer_gap_s per-message gap of a burst (LogGP's g): a transfer holds its links for
                     gap + bytes / bandwidth, so the latency of back-to-back messages overlaps;
      inter_op_threads  the inter-op threads of each server task the overheads were measured
                     with (1 when absent). A TF server runs its RPC handlers (RecvTensor among
                     them) on its inter-op pool: with one thread a task busy with ops serves no
                     tensor, so a message's CPU is charged to the lanes as above, the sending half
                     as a HANDLER task after every other ready task there, and a 0 s hand-back
                     HANDLER on the receiving lane before what waits for the message (the
                     executor queues the ops it makes ready ahead of a handler or callback the
                     network brings in; ResNet-50's parameter server waited 220 ms for
                     batch-norm statistics its workers had made, until they ran out of ops,
                     benchmarks/fidelity_bench_hetero.md; _handlers). With 2 or more
                     the handlers run beside the ops: the message's CPU is added to the transfer
                     instead (the hop lasts as long as measured, the lanes stay free) and counted
                     only in the CPU bound (tfplace.overheads.cpu_demand), half at each end.
    A collective keeps its links (and its fitted time) whole: on this runtime a CPU collective
    blocks its participants' executors, so a step's all-reduces run one after another.
    collective_cpu_s and message_cpu_s_per_byte (the CPU that collectives and message bytes cost)
    are not charged here: tfplace.overheads.cpu_demand turns them into the step's CPU bound, and
    _append_side_cpu puts them on the CPU devices' lanes beside the collectives and transfers."""
    if not over:
        return np.zeros(0), None, None, None
    handler_threads = _inter_op_threads(over)
    x = kind == TASK_TRANSFER
    latency = np.where(x, ctx.links.pair_lat[np.where(x, src_dev, 0), device], 0.0)
    seconds[kind == TASK_COMPUTE] += float(over.get("op_s", 0.0))
    transfer_s = _per_message(over, "transfer_s", ctx.cluster, x, src_dev, device)
    seconds[x] = np.maximum(seconds[x] + transfer_s[x], 0.0)  # transfer_s < 0: see the docstring
    c = kind == TASK_COLLECTIVE
    if "collective_s" in over and c.any():
        seconds[c] = np.maximum(seconds[c] + _per_group(over, "collective_s", group_size, c), 0.0)
    first, dispatch_s, _, _ = dispatch
    if first >= 0:
        seconds[first] += dispatch_s + float(over.get("feed_input_s", 0.0)) * (num_inputs - 1) + \
            float(over.get("feed_s_per_byte", 0.0)) * feed_bytes
    message_cpu = _per_message(over, "message_cpu_s", ctx.cluster, x, src_dev, device)
    charge = off_lane = send_cpu = None
    # the link hold of a burst's message: its measured gap already holds what the message's CPU
    # adds to a burst, on one handler thread or on the lanes alike
    hold = seconds - latency - transfer_s + float(over.get("transfer_gap_s", 0.0))
    if (message_cpu > 0).any():
        ends = _message_ends(over, ctx.cluster, x, src_dev, device, message_cpu)  # (send, receive)
        if handler_threads >= 2:
            off_lane = ends
            seconds += message_cpu
        else:
            send_cpu, recv_cpu = ends
            charge = _charge_received_cpu(seconds, kind, device, dep_src, dep_dst, recv_cpu)
    if "transfer_gap_s" not in over:
        return np.zeros(0), charge, off_lane, send_cpu
    return np.where(x, np.clip(hold, 0.0, seconds), seconds), charge, off_lane, send_cpu


def _dispatch(over, kind, device, op_ptr, graph) -> tuple:
    """(the task the step's dispatch is charged to: the first input's first instance, -1 for a
    graph without inputs; its wall seconds: step_s; the devices that run a partition of the
    step [U], the master's RunGraph goes to each; each further device's wait for it)."""
    used = np.unique(device[kind == TASK_COMPUTE])
    if not graph.inputs:
        return -1, 0.0, used, 0.0
    further = max(len(used) - 1, 0)
    return int(op_ptr[graph.inputs[0]]), float(over.get("step_s", 0.0)), used, \
        float(over.get("worker_s", 0.0)) * further


def _append_worker_dispatch(t, dispatch, dep_src, dep_dst):
    """A further device's partition starts when the master's RunGraph has reached it: one
    HANDLER task first on each device of the step but the first input's, lasting the dispatch's
    wait, before every lane task there. The master sends every RunGraph at once, so each
    further device waits what the micro-benchmark measured for all of them together
    (worker_s per further task, benchmarks/fidelity_bench.py measure_overheads). `t` as
    _append_handlers's (changed in place); returns the dependencies with the new ones."""
    first, _, used, wait_s = dispatch
    if first < 0 or wait_s <= 0:
        return dep_src, dep_dst
    home = int(t["device"][first])
    devs = np.array([d for d in np.asarray(used).tolist() if d != home], dtype=np.int64)
    if not len(devs):
        return dep_src, dep_dst
    m = len(t["kind"])
    lane = np.nonzero(np.isin(t["kind"], DEVICE_KINDS))[0]
    owner = np.array([lane[t["device"][lane] == d][0] for d in devs], dtype=np.int64)
    _extend_with_handlers(t, owner, devs.astype(t["device"].dtype), np.full(len(devs), wait_s),
                          np.full(len(devs), int(t["prio"].min(initial=0)) - 1))
    gate = np.full(int(t["device"].max()) + 1, -1, np.int64)  # device -> its dispatch task
    gate[devs] = m + np.arange(len(devs))
    on = lane[gate[t["device"][lane]] >= 0]
    return (np.concatenate([dep_src, gate[t["device"][on]]]).astype(np.int32),
            np.concatenate([dep_dst, on]).astype(np.int32))


def _inter_op_threads(over) -> int:
    """runtime_overheads.inter_op_threads (1 when absent), checked: an integer >= 1."""
    if "inter_op_threads" not in over:
        return 1
    return FieldReader(over, "profile conditions", "runtime_overheads").get(
        "inter_op_threads", int, check=lambda v: v >= 1, must="be >= 1 (the inter-op threads of each server task)",
        fix="measure the overheads again (benchmarks/fidelity_bench.py --inter-threads N)")


def _kind_index(cluster) -> tuple:
    """(the cluster's device kinds, sorted; [D] each device's index into them): the rows and
    columns of the per-pair-of-kinds tables (_per_message, _message_ends)."""
    kinds = sorted({d.kind for d in cluster.devices})
    return kinds, np.array([kinds.index(d.kind) for d in cluster.devices])


def _per_message(over, key: str, cluster, x, src_dev, device) -> np.ndarray:
    """Per task, the overhead `key` of a message (TRANSFER tasks; 0 elsewhere): one number for
    every message, or one per pair of device kinds {"CPU|CPU_half": ...} (the two kinds sorted,
    joined by "|"), since a message costs the CPU of both its ends."""
    value = over.get(key, 0.0)
    out = np.zeros(len(x))
    if not isinstance(value, dict):
        out[x] = float(value)
        return out
    kinds, of_device = _kind_index(cluster)
    pairs = [["|".join(sorted((a, b))) for b in kinds] for a in kinds]
    table = np.array([[float(value.get(p, np.nan)) for p in row] for row in pairs])
    t = np.nonzero(x)[0]
    a, b = of_device[src_dev[t]], of_device[device[t]]
    out[t] = table[a, b]
    missing = np.isnan(out[t])
    if missing.any():
        pair = pairs[int(a[missing][0])][int(b[missing][0])]
        raise InputError("profile conditions", f"runtime_overheads.{key}",
                         f"has no entry for the device kinds {pair!r} (has {sorted(value)})",
                         "measure the overheads on a cluster with these kinds (benchmarks/fidelity_bench.py)")
    return out


def _message_ends(over, cluster, x, src_dev, device, message_cpu) -> tuple:
    """(send_cpu[M], recv_cpu[M]): each transfer's message CPU (message_cpu[M], both ends
    together) split between its sending and its receiving device. The end of kind k of a pair of
    different kinds pays runtime_overheads.message_cpu_share[pair][k] of it (the measured share:
    on the emulated heterogeneous cluster the unthrottled task paid 38-47% of a hop's CPU, the
    throttled one the rest); ends of one kind, and every message without message_cpu_share,
    pay half each."""
    recv = np.where(x, 0.5, 0.0)
    if over.get("message_cpu_share") is not None:
        table = FieldReader(over, "profile conditions", "runtime_overheads").get("message_cpu_share", dict)
        kinds, of_device = _kind_index(cluster)
        share = np.full((len(kinds), len(kinds)), 0.5)  # [sending kind, receiving kind] -> receiver's share
        t = np.nonzero(x)[0]
        used = {(int(a), int(b)) for a, b in zip(of_device[src_dev[t]], of_device[device[t]]) if a != b}
        for a, b in used:
            share[a, b] = _end_share(table, kinds[a], kinds[b])
        recv[t] = share[of_device[src_dev[t]], of_device[device[t]]]
    recv_cpu = recv * message_cpu
    return message_cpu - recv_cpu, recv_cpu


def _end_share(table, sender: str, receiver: str) -> float:
    """The receiving end's share of a message between two kinds, from message_cpu_share
    (checked: both ends given, each in [0, 1], adding up to 1)."""
    pair = "|".join(sorted((sender, receiver)))
    ends = table.get(pair)
    field = f"runtime_overheads.message_cpu_share.{pair}"
    fix = "measure the overheads again (benchmarks/fidelity_bench.py measure_overheads)"
    if not isinstance(ends, dict) or set(ends) != {sender, receiver}:
        raise InputError("profile conditions", field,
                         f"is {ends!r}: needs the share of each end, {sender!r} and {receiver!r}", fix)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0 for v in ends.values()) \
            or abs(float(ends[sender]) + float(ends[receiver]) - 1.0) > 1e-6:
        raise InputError("profile conditions", field, f"is {ends!r}: shares must lie in [0, 1] and add up to 1", fix)
    return float(ends[receiver])


def _per_group(over, key: str, group_size, c) -> np.ndarray:
    """Per collective task (c[M] selects them), the overhead `key`: one number for every
    collective, or one per group size {"2": ..., "3": ...} (group_size[M]: its participants)."""
    value = over[key]
    if not isinstance(value, dict):
        return np.full(int(c.sum()), float(value))
    sizes = np.asarray(group_size)[c]
    out = np.empty(len(sizes))
    for size in np.unique(sizes):
        if str(int(size)) not in value:
            raise InputError("profile conditions", f"runtime_overheads.{key}",
                             f"has no entry for a group of {int(size)} (has {sorted(value)})",
                             "measure the overheads on a cluster with that many tasks (benchmarks/fidelity_bench.py)")
        out[sizes == size] = float(value[str(int(size))])
    return out


def _charge_received_cpu(seconds, kind, device, dep_src, dep_dst, recv_cpu) -> np.ndarray:
    """Adds the receiving end's part of each transfer's gRPC message CPU (recv_cpu[M], per task:
    _message_ends) to the transfer's first successor on the destination's lane (none: no charge
    there); returns what it added [M]. The sending end's part is the transfer's HANDLER task."""
    m = len(kind)
    lane = np.isin(kind, DEVICE_KINDS)
    src, dst = dep_src.astype(np.int64), dep_dst.astype(np.int64)
    none = np.iinfo(np.int64).max
    first_after = np.full(m, none)
    sel = (kind[src] == TASK_TRANSFER) & lane[dst] & (device[dst] == device[src])
    np.minimum.at(first_after, src[sel], dst[sel])
    charge = np.zeros(m)
    after = first_after != none
    np.add.at(charge, first_after[after], recv_cpu[after])
    seconds += charge
    return charge


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
