"""Chrome trace-event JSON of a simulated iteration (loads in chrome://tracing and Perfetto).

Layout: {"traceEvents": [...], "displayTimeUnit": "ms"}; every event has ph, ts, dur, pid, tid
(ts and dur in microseconds). Complete ("X") events:
  pid 0 "devices"      tid = device index: ops, re-splits and sums, one lane per device
  pid 1 "links"        tid = link index: one event per link a transfer or collective holds
  pid 2 "collectives"  tid = device index: each collective on every participant's lane
Metadata ("M") events name the processes and lanes (with ts = dur = 0).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Union

import numpy as np

from tfplace.formats.jsonio import atomic_write
from tfplace.lowering.placed_graph import DEVICE_KINDS, TASK_COLLECTIVE, TASK_KIND_NAMES, PlacedGraph

PID_DEVICES, PID_LINKS, PID_COLLECTIVES = 0, 1, 2


def _meta(pid: int, tid: int, key: str, name: str) -> Dict[str, Any]:
    return {"ph": "M", "name": key, "pid": pid, "tid": tid, "ts": 0, "dur": 0, "args": {"name": name}}


def chrome_trace(placed: PlacedGraph, start: np.ndarray, finish: np.ndarray) -> Dict[str, Any]:
    """The trace object for one schedule (start/finish in seconds per task)."""
    events: List[Dict[str, Any]] = [_meta(PID_DEVICES, 0, "process_name", "devices"),
                                    _meta(PID_LINKS, 0, "process_name", "links"),
                                    _meta(PID_COLLECTIVES, 0, "process_name", "collectives")]
    for i, name in enumerate(placed.device_names):
        events.append(_meta(PID_DEVICES, i, "thread_name", name))
        events.append(_meta(PID_COLLECTIVES, i, "thread_name", name))
    for i, name in enumerate(placed.link_names):
        events.append(_meta(PID_LINKS, i, "thread_name", name))
    ts_all = np.round(np.asarray(start) * 1e6, 3).tolist()
    dur_all = np.round((np.asarray(finish) - np.asarray(start)) * 1e6, 3).tolist()
    kinds = placed.task_kind.tolist()
    devs = placed.task_device.tolist()
    for t in range(placed.num_tasks):
        kind = kinds[t]
        base = {"ph": "X", "name": placed.task_name(t), "cat": TASK_KIND_NAMES[kind], "ts": ts_all[t],
                "dur": dur_all[t], "args": {"task": t, "bytes": float(placed.task_bytes[t])}}
        if kind in DEVICE_KINDS:
            events.append(dict(base, pid=PID_DEVICES, tid=devs[t]))
            continue
        for k in range(placed.link_ptr[t], placed.link_ptr[t + 1]):
            events.append(dict(base, pid=PID_LINKS, tid=int(placed.link_idx[k])))
        if kind == TASK_COLLECTIVE:
            for k in range(placed.part_ptr[t], placed.part_ptr[t + 1]):
                events.append(dict(base, pid=PID_COLLECTIVES, tid=int(placed.part_dev[k])))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(trace: Dict[str, Any], path: Union[str, os.PathLike]) -> None:
    """Writes the trace as one closed JSON document (atomically: tfplace.formats.jsonio.atomic_write;
    a file system that refuses it raises InputError naming `path`)."""
    atomic_write(path, lambda f: json.dump(trace, f))
