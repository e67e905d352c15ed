"""The compiled event loop (numba): same semantics and the same floating-point operations, in
the same order, as loop_reference.run_reference, so both return identical results.

Heaps are arrays: the event heap orders (finish time, task id); each device's ready heap holds
ranks in its own slice of one array (slice sizes = number of compute-lane tasks per device).
Compiled on first use and cached on disk (numba `cache=True`).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _ev_less(et, ek, i, j):
    return et[i] < et[j] or (et[i] == et[j] and ek[i] < ek[j])


@njit(cache=True)
def _ev_push(et, ek, n, time, task):
    i = n
    et[i] = time
    ek[i] = task
    while i > 0:
        p = (i - 1) >> 1
        if not _ev_less(et, ek, i, p):
            break
        et[i], et[p] = et[p], et[i]
        ek[i], ek[p] = ek[p], ek[i]
        i = p
    return n + 1


@njit(cache=True)
def _ev_pop(et, ek, n):
    """Removes the root (the caller read it first); returns the new size."""
    n -= 1
    et[0] = et[n]
    ek[0] = ek[n]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        c = left
        if left + 1 < n and _ev_less(et, ek, left + 1, left):
            c = left + 1
        if not _ev_less(et, ek, c, i):
            break
        et[i], et[c] = et[c], et[i]
        ek[i], ek[c] = ek[c], ek[i]
        i = c
    return n


@njit(cache=True)
def _rh_push(h, base, n, key):
    i = n
    h[base + i] = key
    while i > 0:
        p = (i - 1) >> 1
        if h[base + p] <= h[base + i]:
            break
        h[base + i], h[base + p] = h[base + p], h[base + i]
        i = p


@njit(cache=True)
def _rh_pop(h, base, n):
    top = h[base]
    n -= 1
    h[base] = h[base + n]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        c = left
        if left + 1 < n and h[base + left + 1] < h[base + left]:
            c = left + 1
        if h[base + c] >= h[base + i]:
            break
        h[base + i], h[base + c] = h[base + c], h[base + i]
        i = c
    return top


@njit(cache=True)
def run_fast(lane_dev, seconds, rank, order, succ_ptr, succ_idx, indegree, link_ptr, link_idx, num_links,
             out_ptr, buf_dev, buf_bytes, buf_reads, in_ptr, in_buf, static_bytes, factor, hold, slot_group,
             group_slots):
    m = seconds.shape[0]
    nd = static_bytes.shape[0]
    indeg = indegree.copy()
    free_slots = group_slots.copy()
    reads = buf_reads.copy()
    unread = buf_reads == 0
    start = np.full(m, np.nan)
    finish = np.full(m, np.nan)
    usage = static_bytes.astype(np.float64).copy()
    peak = usage.copy()
    link_free = np.zeros(num_links)
    lane_count = np.zeros(nd, dtype=np.int64)
    for t in range(m):
        if lane_dev[t] >= 0:
            lane_count[lane_dev[t]] += 1
    rbase = np.zeros(nd, dtype=np.int64)
    for d in range(1, nd):
        rbase[d] = rbase[d - 1] + lane_count[d - 1]
    rheap = np.zeros(max(m, 1), dtype=np.int64)
    rsize = np.zeros(nd, dtype=np.int64)
    idle = np.ones(nd, dtype=np.bool_)
    et = np.zeros(max(m, 1))
    ek = np.zeros(max(m, 1), dtype=np.int64)
    ne = 0
    now = 0.0
    # initial ready set
    for t in range(m):
        if indeg[t] == 0:
            ne = _make_ready(t, now, lane_dev, rank, seconds, hold, link_ptr, link_idx, link_free, start, finish,
                             rheap, rbase, rsize, et, ek, ne)
    ne = _dispatch(now, nd, idle, rsize, rheap, rbase, order, seconds, factor, start, finish, out_ptr, buf_dev,
                   buf_bytes, usage, peak, et, ek, ne, slot_group, free_slots)
    done = 0
    while ne > 0:
        now = et[0]
        t = ek[0]
        ne = _ev_pop(et, ek, ne)
        ne = _complete(t, now, lane_dev, idle, out_ptr, buf_dev, buf_bytes, usage, peak, in_ptr, in_buf, reads,
                       unread, succ_ptr, succ_idx, indeg, rank, seconds, hold, link_ptr, link_idx, link_free, start,
                       finish, rheap, rbase, rsize, et, ek, ne, slot_group, free_slots)
        done += 1
        while ne > 0 and et[0] == now:
            t = ek[0]
            ne = _ev_pop(et, ek, ne)
            ne = _complete(t, now, lane_dev, idle, out_ptr, buf_dev, buf_bytes, usage, peak, in_ptr, in_buf, reads,
                           unread, succ_ptr, succ_idx, indeg, rank, seconds, hold, link_ptr, link_idx, link_free,
                           start, finish, rheap, rbase, rsize, et, ek, ne, slot_group, free_slots)
            done += 1
        ne = _dispatch(now, nd, idle, rsize, rheap, rbase, order, seconds, factor, start, finish, out_ptr, buf_dev,
                       buf_bytes, usage, peak, et, ek, ne, slot_group, free_slots)
    return start, finish, peak, done, now


@njit(cache=True)
def _allocate(t, out_ptr, buf_dev, buf_bytes, usage, peak):
    for b in range(out_ptr[t], out_ptr[t + 1]):
        d = buf_dev[b]
        usage[d] += buf_bytes[b]
        if usage[d] > peak[d]:
            peak[d] = usage[d]


@njit(cache=True)
def _make_ready(t, now, lane_dev, rank, seconds, hold, link_ptr, link_idx, link_free, start, finish, rheap, rbase,
                rsize, et, ek, ne):
    d = lane_dev[t]
    if d >= 0:
        _rh_push(rheap, rbase[d], rsize[d], rank[t])
        rsize[d] += 1
        return ne
    s = now
    for k in range(link_ptr[t], link_ptr[t + 1]):
        if link_free[link_idx[k]] > s:
            s = link_free[link_idx[k]]
    f = s + seconds[t]
    h = s + hold[t]
    for k in range(link_ptr[t], link_ptr[t + 1]):
        link_free[link_idx[k]] = h
    start[t] = s
    finish[t] = f
    return _ev_push(et, ek, ne, f, t)


@njit(cache=True)
def _dispatch(now, nd, idle, rsize, rheap, rbase, order, seconds, factor, start, finish, out_ptr, buf_dev, buf_bytes,
              usage, peak, et, ek, ne, slot_group, free_slots):
    for d in range(nd):
        if idle[d] and rsize[d] > 0:
            g = slot_group[d]
            if g >= 0:
                if free_slots[g] == 0:
                    continue
                free_slots[g] -= 1
            t = order[_rh_pop(rheap, rbase[d], rsize[d])]
            rsize[d] -= 1
            idle[d] = False
            f = now + seconds[t] * factor[d]
            start[t] = now
            finish[t] = f
            _allocate(t, out_ptr, buf_dev, buf_bytes, usage, peak)
            ne = _ev_push(et, ek, ne, f, t)
    return ne


@njit(cache=True)
def _complete(t, now, lane_dev, idle, out_ptr, buf_dev, buf_bytes, usage, peak, in_ptr, in_buf, reads, unread, succ_ptr,
              succ_idx, indeg, rank, seconds, hold, link_ptr, link_idx, link_free, start, finish, rheap, rbase, rsize,
              et, ek, ne, slot_group, free_slots):
    d = lane_dev[t]
    if d >= 0:
        idle[d] = True
        if slot_group[d] >= 0:
            free_slots[slot_group[d]] += 1
    else:
        _allocate(t, out_ptr, buf_dev, buf_bytes, usage, peak)
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
        indeg[s] -= 1
        if indeg[s] == 0:
            ne = _make_ready(s, now, lane_dev, rank, seconds, hold, link_ptr, link_idx, link_free, start, finish,
                             rheap, rbase, rsize, et, ek, ne)
    return ne


@njit(cache=True)
def csr_by_key(keys, values, n):
    """Counting sort: (ptr[n+1], values grouped by key, stable)."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    for k in keys:
        ptr[k + 1] += 1
    for i in range(n):
        ptr[i + 1] += ptr[i]
    fill = ptr[:-1].copy()
    out = np.empty(values.shape[0], dtype=values.dtype)
    for i in range(keys.shape[0]):
        k = keys[i]
        out[fill[k]] = values[i]
        fill[k] += 1
    return ptr, out
