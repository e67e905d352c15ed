"""The CPU a step asks of each device, and the shortest step that CPU allows.

On CPU devices the work of the runtime itself competes with the kernels for the same CPU: a gRPC
message is serialised, copied and parsed by the processes at its two ends, and a CPU all-reduce
(CollectiveReduceV2) is run by its participants. Under a CPU quota (tfplace.emulation.cpu_quota, the
emulated heterogeneous cluster) or on shared cores, that work stretches the step. The event
simulation times a collective by the all-reduce fit on its links and charges each message's
fixed CPU (`RuntimeOverheads.message_cpu_s`) to the lanes; this module adds what neither holds,
as a throughput bound on the step:

  demand_d = f_d * lane_d + message_charge_d + bytes_charge_d + collective_d + dispatch_d
                                                                              (CPU seconds)
  bound    = max( max_d demand_d / f_d,  max_host sum_{d on host} demand_d / cpu_cores )

  f_d                the share of a core device d may use: the CPU quota of its kind's profile
                     (profile conditions by_kind[kind].emulation, as `python -m tfplace.profile
                     --cpu-fraction` writes it): effective_cpu_fraction, one CPU second per
                     measured wall second of the slowdown (the quota the kernel really
                     enforces), else cpu_fraction; 1 without one
  lane_d             seconds of d's compute-lane tasks without the message charges: a quota
                     kind's kernel times are wall seconds under its quota, f_d of which are CPU
  message_charge_d   the message CPU the lanes carry (already CPU seconds)
  bytes_charge_d     message_cpu_s_per_byte (both ends together) times the
                     bytes of every message d sends or receives, half to each end; with
                     inter_op_threads >= 2 also each message's fixed CPU
                     (message_cpu_s), which then runs beside the lanes instead of on them
  collective_d       per all-reduce d takes part in, collective_cpu_s
                     [group size] at its bytes (its seconds_by_kind[d's kind] where measured):
                     CPU seconds of one participant, piecewise linear in the bytes between the
                     measured sizes, the last slope beyond them
  dispatch_d         the step's dispatch as CPU in place of the wall the lanes carry for it
                     (dispatch_cpu_seconds: the master's CPU, and each further task's RunGraph)
  cpu_cores          Host.cpu_cores (hosts without it give no host bound)

The collectives' and the message bytes' CPU (collective_d, bytes_charge_d; side_cpu_entries)
also runs on the lanes of CPU devices, as HANDLER tasks that gate nothing
(tfplace.overheads.apply._append_side_cpu): the bound sees the step's total, the events see a
lane that cannot run kernels while its task spends CPU on an all-reduce.

Measured on the emulated heterogeneous cluster (benchmarks/fidelity_bench_hetero.md): a 3-task
all-reduce chained like the rewrite's priority chains costs each task 0.24-0.40 ms of CPU at 16
bytes and 1.5-2.4 ms at 1 MiB; a half-speed task that runs 320 of them per step (ResNet-50,
data parallel) needs 420-465 ms of CPU, so its 0.5 quota makes the step last at least 0.9 s
while the links alone say 0.6 s.

Pure functions of arrays; no TensorFlow.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np

from tfplace.formats.errors import InputError
from tfplace.overheads.model import FIX, RuntimeOverheads, check_curve, pair_table_error

def participant_curve(curve: Any, source: str, field: str, kind: str) -> tuple:
    """(bytes[K], seconds[K]) one participant of device kind `kind` spends per all-reduce: the
    curve's "seconds_by_kind"[kind] at its bytes where it has one for that kind, else its
    "seconds" (the mean participant's; a kind the measuring group did not hold).

    Measured on the emulated heterogeneous cluster (benchmarks/fidelity_bench_hetero.md): a task
    under a 0.5 CPU quota that shares its core spends 5-33% more CPU per all-reduce than the
    unthrottled task of the same chain (16 bytes to 16 MiB, the larger share at the smaller
    sizes), so one curve per group size, the participants' mean, under-charges the throttled
    ones, and those set the step's CPU bound."""
    b, s = check_curve(curve, source, field)
    by_kind = curve.get("seconds_by_kind")
    if by_kind is None:
        return b, s
    if not isinstance(by_kind, Mapping):
        raise InputError(source, f"{field}.seconds_by_kind", f"must map device kinds to seconds, got "
                         f"{type(by_kind).__name__}", FIX)
    if kind not in by_kind:
        return b, s
    return check_curve({"bytes": curve["bytes"], "seconds": by_kind[kind]}, source, f"{field}.seconds_by_kind.{kind}")


def curve_seconds(nbytes: np.ndarray, points_bytes: np.ndarray, points_s: np.ndarray) -> np.ndarray:
    """Piecewise-linear interpolation at `nbytes` [N] of a cost curve measured at points_bytes [K]
    (points_s [K] seconds): the first point's value below it, the last segment's slope beyond it
    (never below 0)."""
    x = np.asarray(nbytes, dtype=np.float64)
    out = np.interp(x, points_bytes, points_s)
    if len(points_bytes) >= 2:
        slope = (points_s[-1] - points_s[-2]) / (points_bytes[-1] - points_bytes[-2])
        beyond = x > points_bytes[-1]
        out[beyond] = np.maximum(points_s[-1] + slope * (x[beyond] - points_bytes[-1]), 0.0)
    return out


def side_cpu_entries(over: RuntimeOverheads, transfer: np.ndarray, collective: np.ndarray,
                     task_device: np.ndarray, task_src_device: np.ndarray, task_bytes: np.ndarray,
                     part_ptr: np.ndarray, part_dev: np.ndarray, device_kinds: Sequence[str]) -> tuple:
    """The CPU the runtime spends beside the kernels, entry by entry: (task[H], device[H],
    cpu_s[H]), sorted by task. Per collective c and participant d, collective_cpu_s at c's bytes
    (collective_d): the curve of d's kind where the group's curve has one ("seconds_by_kind",
    see participant_curve), else the group's; per transfer x, half of message_cpu_s_per_byte
    times x's bytes at its source and half at its destination (bytes_charge_d). CPU seconds, not
    stretched by any quota.

    transfer, collective: [M] masks of the task kinds; part_ptr [M+1], part_dev: the
    collectives' participants (CSR over tasks; only collectives have any); device_kinds: the
    kind of each device [D]."""
    tasks, devices, seconds = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
    curves = over.collective_cpu_s
    coll = np.nonzero(collective)[0]
    if len(coll) and curves:
        size = part_ptr[coll + 1] - part_ptr[coll]
        # part_dev lists the collectives' participants in task order: each pays its collective's cost
        within = np.arange(int(size.sum())) - np.repeat(np.cumsum(size) - size, size)
        entry_task = np.repeat(coll, size)
        entry_device = part_dev[np.repeat(part_ptr[coll], size) + within].astype(np.int64)
        entry_size = np.repeat(size, size)
        entry_kind = np.asarray(device_kinds, dtype=object)[entry_device]
        cost = np.zeros(len(entry_task))  # one participant's CPU, per (collective, participant)
        for group in np.unique(size).tolist():
            key = str(group)
            if key not in curves:
                raise pair_table_error(over, "collective_cpu_s", f"all-reduces of {group} devices", tuple(curves))
            here = entry_size == group
            for kind in sorted(set(entry_kind[here].tolist())):
                mine = here & (entry_kind == kind)
                cb, cs = participant_curve(curves[key], over.source, f"collective_cpu_s.{key}", kind)
                cost[mine] = curve_seconds(task_bytes[entry_task[mine]], cb, cs)
        tasks.append(entry_task)
        devices.append(entry_device)
        seconds.append(cost)
    per_byte = over.message_cpu_s_per_byte
    x = np.nonzero(transfer & (task_bytes > 0))[0] if per_byte else np.zeros(0, np.int64)
    for end in (task_src_device[x], task_device[x]):  # half at each end
        tasks.append(x)
        devices.append(end.astype(np.int64))
        seconds.append(0.5 * per_byte * task_bytes[x])
    task, device, cpu_s = np.concatenate(tasks), np.concatenate(devices), np.concatenate(seconds)
    order = np.argsort(task, kind="stable")
    return task[order], device[order], cpu_s[order]


def dispatch_cpu_seconds(over: RuntimeOverheads, wall_s: float, wall_device: int, used: np.ndarray,
                         fraction: np.ndarray, cpu_device: np.ndarray) -> np.ndarray:
    """What the step's dispatch changes in the demand [D] (CPU seconds, added to demand_d).

    The lanes carry the dispatch as wall seconds: step_s on the device of the first input
    (`wall_device`, `wall_s`, see tfplace.overheads.apply._runtime_overheads), and each further
    device's wait for its RunGraph (tfplace.overheads.apply._append_worker_dispatch, not in the
    demand): nothing starts before them. As CPU it is smaller and
    spread over the tasks (benchmarks/task_cpu_probe.py: the master spends 0.15-0.18 ms for a
    step on three tasks, each further task 0.25-0.31 ms on its RunGraph, where the wall charge
    is 0.9-1.0 ms):
      step_cpu_s           the master's CPU for a one-task step: with it, the wall charge leaves
                           the demand and the master (device 0's task) gets this
      master_worker_cpu_s  the master's CPU per further task (with step_cpu_s)
      worker_cpu_s         each further task's own CPU for its part of the step, on every CPU
                           device in `used` [U] (the devices that run a partition) but device 0
    Absent keys change nothing (older profiles). cpu_device [D]: which devices are CPUs (a GPU's
    demand is its kernels, not its host's RunGraph or master work)."""
    out = np.zeros(len(fraction))
    further = [int(d) for d in np.asarray(used).tolist() if d != 0]
    if over.step_cpu_s is not None:
        out[wall_device] -= fraction[wall_device] * wall_s
        if cpu_device[0]:
            out[0] += over.step_cpu_s + over.master_worker_cpu_s * len(further)
    for d in further:
        if cpu_device[d]:
            out[d] += over.worker_cpu_s
    return out


def device_cpu_seconds(lane: np.ndarray, transfer: np.ndarray, task_seconds: np.ndarray,
                       message_charge: np.ndarray, task_device: np.ndarray, task_src_device: np.ndarray,
                       side_device: np.ndarray, side_cpu_s: np.ndarray, fraction: np.ndarray,
                       message_cpu: Optional[tuple] = None) -> np.ndarray:
    """demand_d of the module docstring, CPU seconds per step [D].

    lane, transfer: [M] masks of the task kinds; task_seconds [M] with the message charges in
    it, message_charge [M] those charges; side_device, side_cpu_s [H]: side_cpu_entries'
    devices and CPU seconds (collective_d and bytes_charge_d); fraction [D]: f_d; message_cpu
    (None: none): (send_cpu[M], recv_cpu[M]), the fixed CPU of each transfer's message at its
    sending and at its receiving end (tfplace.overheads.apply._message_ends) when the runtime
    runs it beside the lanes (inter_op_threads >= 2). The lanes' tasks are
    the lowering's before it adds the side entries as HANDLER tasks (those are counted here
    once, through side_cpu_s)."""
    d = len(fraction)
    on = np.nonzero(lane)[0]
    kernels = task_seconds[on] - message_charge[on]
    demand = fraction * np.bincount(task_device[on], weights=kernels, minlength=d)
    demand += np.bincount(task_device[on], weights=message_charge[on], minlength=d)
    if message_cpu is not None:
        x = np.nonzero(transfer)[0]
        send_cpu, recv_cpu = message_cpu
        demand += np.bincount(task_device[x], weights=recv_cpu[x], minlength=d)
        demand += np.bincount(task_src_device[x], weights=send_cpu[x], minlength=d)
    return demand + np.bincount(side_device, weights=side_cpu_s, minlength=d)
