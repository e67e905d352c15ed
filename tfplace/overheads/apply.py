"""The runtime-overhead pass: `apply(placed, cluster, overheads) -> PlacedGraph`.

What a CPU runtime adds to a step beyond its kernels and links (a RuntimeOverheads, measured on
the cluster by `python -m tfplace.cli.overheads`), put on the lowering's PlacedGraph for the
simulator: per-op and per-message time, the step's dispatch and feed, the message CPU as HANDLER
tasks on the lanes (one inter-op thread) or in the transfer (more), the CPU that collectives and
message bytes cost as HANDLER tasks on CPU lanes, each further task's wait for its RunGraph, the
link hold of a burst, and the step's CPU demand (device_cpu_seconds, the simulator's CPU bound).

Without overheads (a GPU cluster) there is nothing to add and the lowering's PlacedGraph is
simulated as it is; nothing of this package is imported on that path. The rewrite never sees
the result: it emits the lowering's own PlacedGraph. Pure functions of arrays; no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

import numpy as np

from tfplace.formats.cluster import Cluster, is_cpu_kind
from tfplace.lowering.costs import LinkCosts
from tfplace.lowering.placed_graph import (DEVICE_KINDS, TASK_COLLECTIVE, TASK_COMPUTE, TASK_HANDLER, TASK_TRANSFER,
                                           PlacedGraph)
from tfplace.overheads.cpu_demand import device_cpu_seconds, dispatch_cpu_seconds, side_cpu_entries
from tfplace.overheads.model import RuntimeOverheads, kinds_pair, pair_table_error


@dataclasses.dataclass(frozen=True)
class _Site:
    """What the pass reads of the cluster: [D] device kinds, [D, D] path latency (seconds),
    [D] which devices are CPUs."""
    cluster: Cluster
    kinds: tuple
    pair_lat: np.ndarray
    is_cpu: np.ndarray


def _site(cluster: Cluster) -> _Site:
    lat = LinkCosts(cluster, None, device_ports=False).pair_lat
    return _Site(cluster, tuple(d.kind for d in cluster.devices), lat,
                 np.array([is_cpu_kind(d.kind) for d in cluster.devices], dtype=bool))


def apply(placed: PlacedGraph, cluster: Cluster, overheads: Optional[RuntimeOverheads]) -> PlacedGraph:
    """`placed` (the lowering's, for `cluster`) with `overheads` added; `placed` itself when
    `overheads` is None. Raises InputError (naming the overheads file) when a per-pair or
    per-group table lacks an entry this cluster needs."""
    if overheads is None:
        return placed
    if placed.has_runtime_overheads:
        raise ValueError("apply: the PlacedGraph already went through the runtime-overhead pass")
    if tuple(placed.device_names) != tuple(cluster.device_names):
        raise ValueError("apply: pass the cluster the PlacedGraph was lowered for")
    site = _site(cluster)
    over = overheads
    m0 = len(placed.task_kind)
    seconds = placed.task_seconds.copy()
    kind, device, src_dev = placed.task_kind, placed.task_device, placed.task_src_device
    dep_src, dep_dst = placed.dep_src, placed.dep_dst
    dispatch = _dispatch(over, placed)  # the lanes' wall charge and the demand's CPU
    hold, charge, off_lane, send_cpu = _runtime_overheads(seconds, kind, device, src_dev, dep_src, dep_dst, site, over,
                                                          dispatch, len(placed.input_ops), np.diff(placed.part_ptr),
                                                          placed.feed_bytes)
    t = {"kind": kind, "device": device, "src_dev": src_dev, "op": placed.task_op, "prio": placed.task_priority,
         "seconds": seconds, "charge": charge, "hold": hold, "bytes": placed.task_bytes, "tensor": placed.task_tensor,
         "samples": placed.task_samples, "lo": placed.task_lo, "hi": placed.task_hi,
         "control": placed.task_control if len(placed.task_control) else np.zeros(m0, bool),
         "link_ptr": placed.link_ptr, "part_ptr": placed.part_ptr}
    if send_cpu is not None:
        dep_src, dep_dst = _append_handlers(t, send_cpu, dep_src, dep_dst)
    # the CPU collectives and message bytes cost, per (task, device): counted once in the
    # demand, and put on the CPU devices' lanes after it
    side = side_cpu_entries(over, t["kind"] == TASK_TRANSFER, t["kind"] == TASK_COLLECTIVE, t["device"],
                            t["src_dev"], t["bytes"], t["part_ptr"], placed.part_dev, site.kinds)
    fraction = placed.device_cpu_fraction if len(placed.device_cpu_fraction) else np.ones(len(site.kinds))
    cpu_s = _cpu_demand(site, over, fraction, t["seconds"], t["charge"], off_lane, t["kind"], t["device"],
                        t["src_dev"], side, dispatch)
    if len(cpu_s):
        dep_src, dep_dst = _append_side_cpu(t, side, fraction, site, dep_src, dep_dst)
    dep_src, dep_dst = _append_worker_dispatch(t, dispatch, dep_src, dep_dst)
    added = len(t["kind"]) - m0
    return dataclasses.replace(
        placed, task_kind=t["kind"], task_device=t["device"].astype(np.int32),
        task_src_device=t["src_dev"].astype(np.int32), task_op=t["op"].astype(np.int32),
        task_tensor=t["tensor"].astype(np.int32), task_samples=t["samples"].astype(np.int32),
        task_lo=t["lo"].astype(np.int32), task_hi=t["hi"].astype(np.int32), task_seconds=t["seconds"],
        task_bytes=t["bytes"], task_priority=t["prio"], task_weight=np.concatenate([placed.task_weight,
                                                                                     np.zeros(added)]),
        dep_src=dep_src, dep_dst=dep_dst, link_ptr=t["link_ptr"], part_ptr=t["part_ptr"],
        out_ptr=_extend_ptr(placed.out_ptr, added), in_ptr=_extend_ptr(placed.in_ptr, added),
        task_control=t["control"] if len(placed.task_control) or added else placed.task_control,
        task_hold_seconds=t["hold"], device_cpu_seconds=cpu_s,
        device_cpu_fraction=fraction if len(cpu_s) else placed.device_cpu_fraction)


def _extend_ptr(ptr: np.ndarray, added: int) -> np.ndarray:
    """A CSR pointer over tasks [M+1] extended by `added` tasks that own no entries."""
    return np.concatenate([ptr, np.full(added, ptr[-1], dtype=ptr.dtype)])


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


def _append_side_cpu(t, side, fraction, site: _Site, dep_src, dep_dst):
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
    keep = site.is_cpu[dev] & (cpu_s > 0)
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


def _cpu_demand(site: _Site, over: RuntimeOverheads, fraction, seconds, charge, off_lane, kind, device, src_dev,
                side, dispatch) -> np.ndarray:
    """device_cpu_seconds[D] of tfplace.overheads.cpu_demand; empty when the runtime overheads
    give no CPU beside the lanes: no collective, per-byte or off-lane message CPU (the bound could
    not pass the lanes then). fraction [D]: each device's share of a core; charge / off_lane: the
    message CPU on the lanes / beside them (_runtime_overheads); side: side_cpu_entries (task,
    device, cpu_s); dispatch: _dispatch's (task, wall seconds, devices used, further devices'
    wait), the dispatch's CPU in place of its wall on the first input's device
    (cpu_demand.dispatch_cpu_seconds)."""
    if not (over.collective_cpu_s or over.message_cpu_s_per_byte or off_lane is not None):
        return np.zeros(0)
    lane = np.isin(kind, DEVICE_KINDS)
    demand = device_cpu_seconds(lane, kind == TASK_TRANSFER, seconds,
                                charge if charge is not None else np.zeros(len(seconds)), device, src_dev,
                                side[1], side[2], fraction, message_cpu=off_lane)
    first, wall_s, used, _ = dispatch
    if first >= 0:
        demand = demand + dispatch_cpu_seconds(over, wall_s, int(device[first]), used, fraction, site.is_cpu)
    return demand


def _runtime_overheads(seconds, kind, device, src_dev, dep_src, dep_dst, site: _Site, over: RuntimeOverheads,
                       dispatch, num_inputs, group_size, feed_bytes=0.0):
    """Adds the measured costs of the cluster's runtime to `seconds` (in place)
    and returns (the link-hold time of every task (empty: links are held for the whole duration),
    the message CPU added to each lane task (None: none), the message CPU of each transfer task
    that runs beside the lanes, as (sending end[M], receiving end[M]) (None: none), the sending
    end's message CPU of each transfer task,
    to run as its HANDLER task (None: none); see inter_op_threads). `over`: the RuntimeOverheads;
    `dispatch`: _dispatch's (task, wall seconds, devices used, further devices' wait) for step_s;
    `num_inputs`: the graph's fed inputs; `group_size` [M]: each task's participants (collectives).

    They come from the RuntimeOverheads file, measured by `python -m tfplace.cli.overheads` from
    micro-benchmarks on the local cluster (tfplace.profiling.overheads_probe). Fields (seconds):
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
    handler_threads = over.inter_op_threads
    x = kind == TASK_TRANSFER
    latency = np.where(x, site.pair_lat[np.where(x, src_dev, 0), device], 0.0)
    seconds[kind == TASK_COMPUTE] += over.op_s
    transfer_s = _per_message(over, "transfer_s", site, x, src_dev, device)
    seconds[x] = np.maximum(seconds[x] + transfer_s[x], 0.0)  # transfer_s < 0: see the docstring
    c = kind == TASK_COLLECTIVE
    if over.collective_s is not None and c.any():
        seconds[c] = np.maximum(seconds[c] + _per_group(over, "collective_s", group_size, c), 0.0)
    first, dispatch_s, _, _ = dispatch
    if first >= 0:
        seconds[first] += dispatch_s + over.feed_input_s * (num_inputs - 1) + over.feed_s_per_byte * feed_bytes
    message_cpu = _per_message(over, "message_cpu_s", site, x, src_dev, device)
    charge = off_lane = send_cpu = None
    # the link hold of a burst's message: its measured gap already holds what the message's CPU
    # adds to a burst, on one handler thread or on the lanes alike
    hold = seconds - latency - transfer_s + (over.transfer_gap_s or 0.0)
    if (message_cpu > 0).any():
        ends = _message_ends(over, site, x, src_dev, device, message_cpu)  # (send, receive)
        if handler_threads >= 2:
            off_lane = ends
            seconds += message_cpu
        else:
            send_cpu, recv_cpu = ends
            charge = _charge_received_cpu(seconds, kind, device, dep_src, dep_dst, recv_cpu)
    if over.transfer_gap_s is None:
        return np.zeros(0), charge, off_lane, send_cpu
    return np.where(x, np.clip(hold, 0.0, seconds), seconds), charge, off_lane, send_cpu


def _dispatch(over: RuntimeOverheads, placed: PlacedGraph) -> tuple:
    """(the task the step's dispatch is charged to: the first input's first instance, -1 for a
    graph without inputs; its wall seconds: step_s; the devices that run a partition of the
    step [U], the master's RunGraph goes to each; each further device's wait for it)."""
    kind, device = placed.task_kind, placed.task_device
    used = np.unique(device[kind == TASK_COMPUTE])
    if not len(placed.input_ops):
        return -1, 0.0, used, 0.0
    further = max(len(used) - 1, 0)
    return int(placed.op_task_ptr[int(placed.input_ops[0])]), over.step_s, used, over.worker_s * further


def _append_worker_dispatch(t, dispatch, dep_src, dep_dst):
    """A further device's partition starts when the master's RunGraph has reached it: one
    HANDLER task first on each device of the step but the first input's, lasting the dispatch's
    wait, before every lane task there. The master sends every RunGraph at once, so each
    further device waits what the micro-benchmark measured for all of them together
    (worker_s per further task, tfplace.profiling.overheads_probe). `t` as
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


def _kind_index(site: _Site) -> tuple:
    """(the cluster's device kinds, sorted; [D] each device's index into them): the rows and
    columns of the per-pair-of-kinds tables (_per_message, _message_ends)."""
    kinds = sorted(set(site.kinds))
    return kinds, np.array([kinds.index(k) for k in site.kinds])


def _per_message(over: RuntimeOverheads, key: str, site: _Site, x, src_dev, device) -> np.ndarray:
    """Per task, the overhead `key` of a message (TRANSFER tasks; 0 elsewhere): one number for
    every message, or one per pair of device kinds {"CPU|CPU_half": ...} (the two kinds sorted,
    joined by "|"), since a message costs the CPU of both its ends."""
    value = getattr(over, key)
    out = np.zeros(len(x))
    if not isinstance(value, Mapping):
        out[x] = float(value)
        return out
    kinds, of_device = _kind_index(site)
    pairs = [[kinds_pair(a, b) for b in kinds] for a in kinds]
    table = np.array([[float(value.get(p, np.nan)) for p in row] for row in pairs])
    t = np.nonzero(x)[0]
    a, b = of_device[src_dev[t]], of_device[device[t]]
    out[t] = table[a, b]
    missing = np.isnan(out[t])
    if missing.any():
        pair = pairs[int(a[missing][0])][int(b[missing][0])]
        raise pair_table_error(over, key, f"the device kinds {pair!r}", tuple(value))
    return out


def _message_ends(over: RuntimeOverheads, site: _Site, x, src_dev, device, message_cpu) -> tuple:
    """(send_cpu[M], recv_cpu[M]): each transfer's message CPU (message_cpu[M], both ends
    together) split between its sending and its receiving device. The end of kind k of a pair of
    different kinds pays message_cpu_share[pair][k] of it (the measured share: on the emulated
    heterogeneous cluster the unthrottled task paid 38-47% of a hop's CPU, the throttled one the
    rest); ends of one kind, and every message without message_cpu_share, pay half each."""
    recv = np.where(x, 0.5, 0.0)
    if over.message_cpu_share is not None:
        table = over.message_cpu_share
        kinds, of_device = _kind_index(site)
        share = np.full((len(kinds), len(kinds)), 0.5)  # [sending kind, receiving kind] -> receiver's share
        t = np.nonzero(x)[0]
        used = {(int(a), int(b)) for a, b in zip(of_device[src_dev[t]], of_device[device[t]]) if a != b}
        for a, b in used:
            share[a, b] = _end_share(over, table, kinds[a], kinds[b])
        recv[t] = share[of_device[src_dev[t]], of_device[device[t]]]
    recv_cpu = recv * message_cpu
    return message_cpu - recv_cpu, recv_cpu


def _end_share(over: RuntimeOverheads, table, sender: str, receiver: str) -> float:
    """The receiving end's share of a message between two kinds, from message_cpu_share (each
    pair's ends were checked when the file was read: both given, in [0, 1], adding up to 1)."""
    ends = table.get(kinds_pair(sender, receiver))
    if ends is None:
        raise pair_table_error(over, "message_cpu_share", f"the device kinds {kinds_pair(sender, receiver)!r}",
                               tuple(table))
    return float(ends[receiver])


def _per_group(over: RuntimeOverheads, key: str, group_size, c) -> np.ndarray:
    """Per collective task (c[M] selects them), the overhead `key`: one number for every
    collective, or one per group size {"2": ..., "3": ...} (group_size[M]: its participants)."""
    value = getattr(over, key)
    if not isinstance(value, Mapping):
        return np.full(int(c.sum()), float(value))
    sizes = np.asarray(group_size)[c]
    out = np.empty(len(sizes))
    for size in np.unique(sizes):
        if str(int(size)) not in value:
            raise pair_table_error(over, key, f"a group of {int(size)}", tuple(value))
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
