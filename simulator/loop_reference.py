"""Plain-Python event loop: the reference the compiled loop (loop_fast) must match exactly.

Semantics (shared by both loops):
  * A task is ready when all its dependencies finished.
  * Compute-lane tasks (lane_dev >= 0) queue on their device; a free device starts its ready
    task with the smallest rank (rank = position in (priority, task id) order). One task at a
    time per device; duration = seconds * factor[device] (straggler noise).
  * Link tasks (lane_dev < 0: transfers, collectives) are served FIFO per link in the order they
    become ready: start = max(now, free time of every link they occupy); they hold all their
    links for hold[t] seconds from their start (hold = seconds: serialisation, no bandwidth
    sharing; hold < seconds: the part of the duration that is latency overlaps the next task
    on the link, as in the LogGP model) and finish at start + seconds.
  * Host cores: a device d with slot_group[d] >= 0 needs one of the group_slots[g] cores of its
    group (the CPU devices of one host) to start a task; it holds the core until the task ends.
    Devices are offered free cores in index order. slot_group[d] = -1: no limit.
  * Events at the same time are all processed (by (time, task id)) before idle devices pick new
    work, so frees at time t happen before allocations at time t.
  * Memory: a compute-lane task allocates its output buffers when it starts, a link task when it
    finishes (the data has arrived); a buffer is freed when its last reader finishes (a buffer
    nobody reads, when its producer finishes). Usage starts at the static bytes; the peak is
    tracked per device.

Returns (start[M], finish[M], peak[D], tasks finished, makespan).
"""

from __future__ import annotations

import heapq

import numpy as np


def run_reference(lane_dev, seconds, rank, order, succ_ptr, succ_idx, indegree, link_ptr, link_idx,
                  num_links, out_ptr, buf_dev, buf_bytes, buf_reads, in_ptr, in_buf, static_bytes, factor,
                  hold, slot_group, group_slots):
    m, d_count = len(seconds), len(static_bytes)
    lane_dev, seconds, rank, order = lane_dev.tolist(), seconds.tolist(), rank.tolist(), order.tolist()
    succ_ptr, succ_idx, link_ptr, link_idx = succ_ptr.tolist(), succ_idx.tolist(), link_ptr.tolist(), link_idx.tolist()
    out_ptr, buf_dev, buf_bytes = out_ptr.tolist(), buf_dev.tolist(), buf_bytes.tolist()
    in_ptr, in_buf, factor = in_ptr.tolist(), in_buf.tolist(), factor.tolist()
    hold, slot_group, free_slots = hold.tolist(), slot_group.tolist(), group_slots.tolist()
    indegree, reads = indegree.tolist(), buf_reads.tolist()
    unread = [r == 0 for r in reads]
    start, finish = [np.nan] * m, [np.nan] * m
    usage, peak = [float(x) for x in static_bytes], [float(x) for x in static_bytes]
    link_free = [0.0] * num_links
    ready = [[] for _ in range(d_count)]
    idle = [True] * d_count
    events = []

    def allocate(t):
        for b in range(out_ptr[t], out_ptr[t + 1]):
            d = buf_dev[b]
            usage[d] += buf_bytes[b]
            if usage[d] > peak[d]:
                peak[d] = usage[d]

    def make_ready(t, now):
        if lane_dev[t] >= 0:
            heapq.heappush(ready[lane_dev[t]], rank[t])
            return
        s = now
        for k in range(link_ptr[t], link_ptr[t + 1]):
            if link_free[link_idx[k]] > s:
                s = link_free[link_idx[k]]
        f = s + seconds[t]
        h = s + hold[t]
        for k in range(link_ptr[t], link_ptr[t + 1]):
            link_free[link_idx[k]] = h
        start[t], finish[t] = s, f
        heapq.heappush(events, (f, t))

    def dispatch(now):
        for d in range(d_count):
            if idle[d] and ready[d]:
                g = slot_group[d]
                if g >= 0:
                    if free_slots[g] == 0:
                        continue
                    free_slots[g] -= 1
                t = order[heapq.heappop(ready[d])]
                idle[d] = False
                f = now + seconds[t] * factor[d]
                start[t], finish[t] = now, f
                allocate(t)
                heapq.heappush(events, (f, t))

    def complete(t, now):
        if lane_dev[t] >= 0:
            idle[lane_dev[t]] = True
            if slot_group[lane_dev[t]] >= 0:
                free_slots[slot_group[lane_dev[t]]] += 1
        else:
            allocate(t)
        for b in range(out_ptr[t], out_ptr[t + 1]):
            if unread[b]:
                usage[buf_dev[b]] -= buf_bytes[b]
        for k in range(in_ptr[t], in_ptr[t + 1]):
            b = in_buf[k]
            reads[b] -= 1
            if reads[b] == 0:
                usage[buf_dev[b]] -= buf_bytes[b]
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            s = succ_idx[k]
            indegree[s] -= 1
            if indegree[s] == 0:
                make_ready(s, now)

    for t in range(m):
        if indegree[t] == 0:
            make_ready(t, 0.0)
    dispatch(0.0)
    done, now = 0, 0.0
    while events:
        now, t = heapq.heappop(events)
        complete(t, now)
        done += 1
        while events and events[0][0] == now:
            _, t = heapq.heappop(events)
            complete(t, now)
            done += 1
        dispatch(now)
    return np.array(start), np.array(finish), np.array(peak), done, now
