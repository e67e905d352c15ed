"""Profile: measured (or derived) seconds per op, device kind and per-device batch size, plus the
communication cost fits.

File format `profile.json`:

    {"format": "tfplace.profile", "version": 1, "graph": "resnet50",
     "conditions": {"tf_version": "2.15.1", "repeats": 5, "statistic": "median", "host": "..."},
     "ops": {"conv1/Conv2D": {"CPU": {"8": 0.0123, "16": 0.0240}, "V100": {"8": 0.0004}}},
     "missing_ops": ["..."],
     "derived": {"V100": "CPU"},
     "run_order": ["conv1/Conv2D", "..."],
     "comm": {"p2p": {"latency_s": 5e-05, "bandwidth_bytes_per_s": 1.1e9},
              "allreduce": {"2": {"latency_s": 1e-4, "bandwidth_bytes_per_s": 9e8}}}}

Units: seconds per execution of the op on one device; batch keys are per-device sample counts.
Per-device batch keys are strings of decimal digits in JSON (JSON object keys), integers in
memory. Seconds for a batch that was not measured come from `seconds()`: piecewise-linear
interpolation between the measured batch sizes (exact at measured points), linear extrapolation
beyond them from the two nearest points (clipped at zero); with a single point, time is
proportional to the batch size.

`missing_ops` lists ops that the measurement did not see (never silently costed 0); `derived`
maps a kind to the measured kind it was scaled from by the device model. `run_order` (optional)
lists the step's ops in the order TensorFlow's executor started them in one traced step: the
lowering breaks priority ties in that order (`tfplace.lowering.graph_index.run_order_rank`), so the
order the rewrite chains a device's ops in is the order the profile timed them in.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np

from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import FieldReader, write_json

FORMAT = "tfplace.profile"
_BATCH_STEM_RE = re.compile(r"_b\d+(?=_|$)")  # <model>_b<batch>_...: per-device batches are a profile's keys
_IMPORT_HASH_RE = re.compile(r"_[0-9a-f]{12}$")  # a bare step's cached bundle: <step>_<hash> (graph_defs.user_step)


def graph_name(graph_source: str) -> str:
    """The name a profile gives the graph of the bundle at `graph_source` (Profile.graph): its stem
    without the batch part, and a bare step's by its own name, without the hash of the cache it is
    imported into. Every profile maker (profiler, device model, kernel replay) names graphs so."""
    stem = os.path.splitext(os.path.basename(graph_source))[0]
    return _IMPORT_HASH_RE.sub("", _BATCH_STEM_RE.sub("", stem, count=1))


@dataclasses.dataclass(frozen=True)
class LinearCost:
    """time_s = latency_s + bytes / bandwidth_bytes_per_s."""
    latency_s: float
    bandwidth_bytes_per_s: float

    def seconds(self, num_bytes: float) -> float:
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


@dataclasses.dataclass(frozen=True)
class CommModel:
    """Fitted communication costs. `allreduce` is keyed by group size (number of devices)."""
    p2p: Optional[LinearCost] = None
    allreduce: Mapping[int, LinearCost] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Profile:
    """op name -> device kind -> ((batch sizes ascending), (seconds)).

    Attributes:
      ops: the table; batch sizes are per-device sample counts.
      graph: graph name it was measured on.
      conditions: how it was measured (free-form JSON object).
      missing_ops: ops of the graph that did not appear in the trace (listed, never silently 0).
      derived: kind -> measured kind it was derived from by the device model (empty if measured).
      comm: communication fits, or None.
      run_order: op names in the order one traced step started them (ops fused into another
        kernel just before it); empty if unknown.
    """
    ops: Mapping[str, Mapping[str, Tuple[Tuple[int, ...], Tuple[float, ...]]]]
    graph: str = ""
    conditions: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    missing_ops: Tuple[str, ...] = ()
    derived: Mapping[str, str] = dataclasses.field(default_factory=dict)
    comm: Optional[CommModel] = None
    source: str = ""
    run_order: Tuple[str, ...] = ()

    @property
    def kinds(self) -> Tuple[str, ...]:
        seen: Dict[str, None] = {}
        for per_kind in self.ops.values():
            for kind in per_kind:
                seen[kind] = None
        return tuple(seen)

    def has(self, op_name: str, kind: str) -> bool:
        return kind in self.ops.get(op_name, {})

    def seconds(self, op_name: str, kind: str, batch_size: float) -> float:
        """Time of `op_name` on one device of `kind` processing `batch_size` samples."""
        try:
            batches, secs = self.ops[op_name][kind]
        except KeyError:
            raise self.missing_op_error(op_name, kind) from None
        return interpolate_seconds(batches, secs, batch_size)

    def missing_op_error(self, op_name: str, kind: str) -> InputError:
        """The error of an op this profile has no time for on `kind`, naming its file, the op and the
        fixes (what seconds() and the lowering's costs, tfplace.lowering.costs, both raise)."""
        measured = f" (measured on graph {self.graph!r})" if self.graph else ""
        return InputError(self.source or "profile", f"ops.{op_name}.{kind}",
                          f"op {op_name!r} on {kind} is not in the profile{measured}",
                          f"profile this graph on a {kind} device (python -m tfplace.profile --graph G --out P; "
                          f"--derive {kind} derives it from a measured kind), or give no profile to use the device "
                          "model's times")

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"format": FORMAT, "version": 1, "graph": self.graph,
                               "conditions": dict(self.conditions),
                               "ops": {op: {k: {str(b): s for b, s in zip(*pts)} for k, pts in per.items()}
                                       for op, per in self.ops.items()},
                               "missing_ops": list(self.missing_ops), "derived": dict(self.derived)}
        if self.comm is not None:
            comm: Dict[str, Any] = {}
            if self.comm.p2p is not None:
                comm["p2p"] = dataclasses.asdict(self.comm.p2p)
            comm["allreduce"] = {str(n): dataclasses.asdict(c) for n, c in self.comm.allreduce.items()}
            out["comm"] = comm
        if self.run_order:
            out["run_order"] = list(self.run_order)
        return out


def interpolate_seconds(batches: Tuple[int, ...], secs: Tuple[float, ...], batch_size: float) -> float:
    """Piecewise-linear in batch size through the measured points; exact at measured points.

    Outside the measured range the line through the two nearest points is extended, clipped at
    zero. With a single point, time is proportional to the batch size.
    """
    b = np.asarray(batches, dtype=float)
    s = np.asarray(secs, dtype=float)
    if len(b) == 1:
        return float(s[0] * batch_size / b[0])
    if b[0] <= batch_size <= b[-1]:
        return float(np.interp(batch_size, b, s))
    i, j = (0, 1) if batch_size < b[0] else (-2, -1)
    slope = (s[j] - s[i]) / (b[j] - b[i])
    return float(max(0.0, s[i] + slope * (batch_size - b[i])))


_BATCH_KEY = re.compile(r"[0-9]+")


def _linear(r: FieldReader) -> LinearCost:
    r.expect_keys(("latency_s", "bandwidth_bytes_per_s"), also_allowed=("comment",))
    return LinearCost(r.get("latency_s", float, check=lambda v: v >= 0, must="be >= 0"),
                      r.get("bandwidth_bytes_per_s", float, check=lambda v: v > 0, must="be > 0"))


def _points(r: FieldReader, points: FieldReader) -> Tuple[Tuple[int, ...], Tuple[float, ...]]:
    pts = []
    for key, value in points.data.items():
        field = points.field_path(key)
        if not _BATCH_KEY.fullmatch(key) or int(key) <= 0:
            raise InputError(r.source, field, f"batch size key {key!r} is not a positive integer",
                             'write the per-device batch size as a string of digits, e.g. "16"')
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise InputError(r.source, field, f"seconds must be a finite number >= 0, got {value!r}",
                             "give the measured time in seconds")
        pts.append((int(key), float(value)))
    if not pts:
        raise InputError(r.source, points.path, "no measurements", "remove the kind or add measurements")
    pts.sort()
    return tuple(b for b, _ in pts), tuple(s for _, s in pts)


def comm_from_json(obj: Mapping[str, Any], source: str) -> CommModel:
    """A CommModel from the JSON form of a profile's "comm" section (e.g. an overheads file's
    raw.comm); InputError naming `source` when it is malformed."""
    return _comm(FieldReader(json.loads(json.dumps(obj, default=dict)), source, "comm"))


def _comm(c: FieldReader) -> CommModel:
    c.expect_keys(("p2p", "allreduce"), also_allowed=("comment",))
    p2p = _linear(c.child("p2p")) if c.has("p2p") else None
    allreduce = {}
    for key, fit in c.child("allreduce", default_empty=True).entries():
        if not _BATCH_KEY.fullmatch(key) or int(key) < 2:
            raise InputError(c.source, fit.path, "group size keys must be integers >= 2",
                             'key the all-reduce fits by the number of devices, e.g. "4"')
        allreduce[int(key)] = _linear(fit)
    return CommModel(p2p, allreduce)


def profile_from_reader(r: FieldReader) -> Profile:
    r.expect_keys(("graph", "conditions", "ops", "missing_ops", "derived", "comm", "run_order"))
    ops = {op: {kind: _points(r, points) for kind, points in per_kind.entries()}
           for op, per_kind in r.child("ops").entries()}
    derived = r.get("derived", dict, default={})
    for kind, base in derived.items():
        if not isinstance(base, str) or not base:
            raise r.error(f"derived.{kind}", f"must be the name of a measured kind, got {base!r}",
                          'map the derived kind to the kind it was scaled from, e.g. {"V100": "CPU"}')
    run_order = tuple(r.strings("run_order", default=[]))
    seen = set()
    for op in run_order:
        if op in seen:
            raise r.error("run_order", f"lists {op!r} more than once",
                          "list each op once, in the order the traced step started them")
        seen.add(op)
    return Profile(
        ops=ops, graph=r.get("graph", str, default=""),
        conditions=r.get("conditions", dict, default={}),
        missing_ops=tuple(r.strings("missing_ops", default=[])),
        derived=derived, comm=_comm(r.child("comm")) if r.has("comm") else None, source=r.source,
        run_order=run_order)


def load_profile(path: Union[str, os.PathLike]) -> Profile:
    return profile_from_reader(FieldReader.from_file(path, expected_format=FORMAT))


def save_profile(profile: Profile, path: Union[str, os.PathLike]) -> None:
    write_json(path, profile.to_json())

