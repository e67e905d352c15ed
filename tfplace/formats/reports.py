"""Reports of one training iteration: simulated (SimReport) and measured (RunReport).

Fields that mean the same thing carry the same name in both, so one table can hold a simulated
and a measured row side by side (`report_row`):

  iteration_time_s     seconds per training step (simulated makespan / mean of measured steps)
  device_names         device order of every per-device tuple
  peak_memory_bytes    per device, peak bytes in use during the step
  oom, oom_devices     whether (and where) the peak exceeds the device's memory

SimReport adds what only a simulator knows exactly: busy and compute seconds per device,
bytes on the wire, capacities, and an optional Chrome trace. RunReport adds the measured step
times and the path of the timeline the runtime wrote.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple


# Share of a device's memory above which a simulated peak that fits is flagged ("near"): the peak
# counts live tensors, 0.94-1.21x the live bytes measured on the local cluster
# (benchmarks/memory_bench.md), not the allocator's rounding and pools, which a CPU BFC allocator's
# peak showed at 1.1-1.9x the live bytes.
NEAR_MEMORY_FRACTION = 0.9


def rank_time_s(time_s: float) -> float:
    """A simulated time (s) as strategies are ranked by it (a planner's pool, activate's pick): to
    12 significant digits, so that two strategies whose simulated times differ only by rounding
    (1e-16 relative) tie, and the one found first stays ahead (a stable sort) instead of a later
    one taking its place and its credit."""
    return float(f"{time_s:.12g}")


def same_time(a_s: float, b_s: float) -> bool:
    """Whether two simulated times (s) tie in the order strategies are ranked by (rank_time_s)."""
    return rank_time_s(a_s) == rank_time_s(b_s)


@dataclasses.dataclass(frozen=True)
class SimReport:
    """One simulated iteration.

    Attributes:
      iteration_time_s: the step's seconds: the makespan of its events, or its CPU bound where
        that is longer.
      device_names: device order of the per-device tuples.
      peak_memory_bytes: per device: resident variables + peak of live tensors, bytes.
      memory_capacity_bytes: per device: `Device.memory_bytes`.
      oom: True if any device's peak exceeds its capacity (a result, not an exception).
      oom_devices: names of those devices.
      comm_bytes: bytes sent over links: transfers plus, per ring all-reduce of S bytes over n
        devices, 2(n-1)·S (every participant sends 2(n-1)/n·S).
      busy_s: per device, seconds its compute lane was busy (ops + split/concat/sum tasks).
      compute_s: per device, seconds of op compute tasks only.
      num_tasks: tasks simulated.
      seed: seed of the straggler noise.
      straggler_cases: schedules the step averages (simulator.core: 1 unless a device that has
        work may straggle); iteration_time_s, makespan_s, busy_s and compute_s are their
        probability-weighted means, peak_memory_bytes their maximum.
      trace: Chrome trace-event object ({"traceEvents": [...]}) when asked for, else None.
      makespan_s: when the last task of the events finishes (None: not given, = iteration_time_s).
      cpu_bound_s: the shortest step the devices' CPU demand allows (tfplace.overheads.cpu_demand; 0: none
        given).
    """
    iteration_time_s: float
    device_names: Tuple[str, ...]
    peak_memory_bytes: Tuple[int, ...]
    memory_capacity_bytes: Tuple[int, ...]
    oom: bool
    oom_devices: Tuple[str, ...]
    comm_bytes: float
    busy_s: Tuple[float, ...]
    compute_s: Tuple[float, ...]
    num_tasks: int = 0
    seed: int = 0
    trace: Optional[Dict[str, Any]] = dataclasses.field(default=None, repr=False, compare=False)
    makespan_s: Optional[float] = None
    cpu_bound_s: float = 0.0
    straggler_cases: int = 1

    def __post_init__(self):
        n = len(self.device_names)
        for name in ("peak_memory_bytes", "memory_capacity_bytes", "busy_s", "compute_s"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"SimReport.{name}: needs one entry per device ({n})")
        if not (self.iteration_time_s >= 0 and math.isfinite(self.iteration_time_s)):
            raise ValueError(f"SimReport.iteration_time_s: must be finite and >= 0, got {self.iteration_time_s}")

    @property
    def over_memory(self) -> Dict[str, Tuple[int, int]]:
        """{device: (peak bytes, capacity bytes)} of every device whose peak exceeds its memory."""
        return {d: (int(p), int(c)) for d, p, c in zip(self.device_names, self.peak_memory_bytes,
                                                       self.memory_capacity_bytes) if p > c}

    @staticmethod
    def over_memory_text(over: Mapping[str, Tuple[int, int]]) -> str:
        """`over` ({device: (peak bytes, capacity bytes)}, as over_memory gives it) in words:
        "v100_0 needs 1846591764 of 200000000 bytes, ..."."""
        return ", ".join(f"{d} needs {peak} of {capacity} bytes" for d, (peak, capacity) in over.items())

    @property
    def near_memory(self) -> Dict[str, float]:
        """{device: peak / capacity} of every device whose peak fits with less than
        1 - NEAR_MEMORY_FRACTION of its memory left."""
        return {d: p / c for d, p, c in zip(self.device_names, self.peak_memory_bytes, self.memory_capacity_bytes)
                if NEAR_MEMORY_FRACTION * c < p <= c}

    def near_memory_note(self) -> Optional[str]:
        """A line naming the devices of `near_memory`, or None: the simulated peak counts live
        tensors, and what the allocator rounds up or keeps in its pools can tip such a plan over."""
        near = self.near_memory
        if not near:
            return None
        devices = ", ".join(f"{d} ({fill:.0%})" for d, fill in near.items())
        return (f"note: the simulated peak fills more than {NEAR_MEMORY_FRACTION:.0%} of the memory of {devices}; it "
                "counts live tensors, not what the allocator rounds up or pools, so this may run out of memory for "
                "real: lower the device's memory_bytes in the cluster file to plan with a margin")

    @property
    def utilisation(self) -> Tuple[float, ...]:
        """Busy fraction of each device's compute lane over the iteration."""
        t = self.iteration_time_s
        return tuple((b / t if t > 0 else 0.0) for b in self.busy_s)

    def summary(self) -> str:
        """A small human-readable table (iteration time, memory vs capacity, utilisation)."""
        oom = "yes " + ", ".join(self.oom_devices) if self.oom else "no"
        cases = f"   (expected over {self.straggler_cases} straggler cases)" if self.straggler_cases > 1 else ""
        # GB, or MB when every capacity is under 1 GB (a 0.2 GB device's peaks read 0.000 in GB)
        scale, unit = (1e9, "GB") if max(self.memory_capacity_bytes, default=0) >= 1e9 else (1e6, "MB")
        lines = [f"iteration time: {self.iteration_time_s * 1e3:.3f} ms   tasks: {self.num_tasks}   "
                 f"comm: {self.comm_bytes / 1e6:.2f} MB   OOM: {oom}{cases}",
                 f"{'device':<16}{'peak ' + unit:>10}{'cap ' + unit:>10}{'busy ms':>10}{'compute ms':>12}{'util':>7}"]
        for i, name in enumerate(self.device_names):
            flag = "  OOM" if name in self.oom_devices else ("  near" if name in self.near_memory else "")
            lines.append(f"{name:<16}{self.peak_memory_bytes[i] / scale:>10.3f}"
                         f"{self.memory_capacity_bytes[i] / scale:>10.3f}"
                         f"{self.busy_s[i] * 1e3:>10.3f}{self.compute_s[i] * 1e3:>12.3f}{self.utilisation[i]:>7.0%}{flag}")
        return "\n".join(lines)

    def to_json(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("trace")
        out["utilisation"] = list(self.utilisation)
        return out


@dataclasses.dataclass(frozen=True)
class RunReport:
    """Measured iterations of a strategy on a real cluster.

    Attributes:
      step_times_s: wall time of every timed step, seconds (warm-up steps excluded).
      device_names: devices the run used.
      peak_memory_bytes: per device peak, when the runtime could read it, else None.
      oom: True if the run failed for lack of memory.
      oom_devices: devices that ran out of memory, when known.
      timeline_path: Chrome trace the runtime wrote ("" if none).
    """
    step_times_s: Tuple[float, ...]
    device_names: Tuple[str, ...] = ()
    peak_memory_bytes: Optional[Tuple[int, ...]] = None
    oom: bool = False
    oom_devices: Tuple[str, ...] = ()
    timeline_path: str = ""

    def __post_init__(self):
        if not self.oom and not self.step_times_s:
            raise ValueError("RunReport.step_times_s: at least one timed step unless the run hit OOM")
        if any(not (t >= 0 and math.isfinite(t)) for t in self.step_times_s):
            raise ValueError("RunReport.step_times_s: every step time must be finite and >= 0")

    @property
    def mean_s(self) -> float:
        return sum(self.step_times_s) / len(self.step_times_s) if self.step_times_s else math.inf

    @property
    def std_s(self) -> float:
        n = len(self.step_times_s)
        if n < 2:
            return 0.0
        m = self.mean_s
        return math.sqrt(sum((t - m) ** 2 for t in self.step_times_s) / (n - 1))

    @property
    def iteration_time_s(self) -> float:
        """Same meaning as SimReport.iteration_time_s: the mean measured step."""
        return self.mean_s


SHARED_FIELDS = ("iteration_time_s", "device_names", "peak_memory_bytes", "oom", "oom_devices")


def report_row(report, label: str = "") -> Dict[str, Any]:
    """The fields both reports share (plus a label), for side-by-side tables."""
    row: Dict[str, Any] = {"label": label, "kind": "simulated" if isinstance(report, SimReport) else "measured"}
    for name in SHARED_FIELDS:
        row[name] = getattr(report, name)
    return row


def compare_rows(rows: Sequence[Dict[str, Any]]) -> str:
    """Text table of `report_row` rows: label, kind, ms per step, OOM."""
    lines = [f"{'label':<24}{'kind':<11}{'ms/step':>10}  OOM"]
    for r in rows:
        lines.append(f"{r['label']:<24}{r['kind']:<11}{r['iteration_time_s'] * 1e3:>10.3f}  {'yes' if r['oom'] else 'no'}")
    return "\n".join(lines)
