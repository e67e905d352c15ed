"""RuntimeOverheads: what a CPU runtime adds to a step beyond its kernels and its links.

A frozen, validated value with its own file (format `tfplace.runtime_overheads`, version 1),
measured on a cluster by `python -m tfplace.cli.overheads` and read by every tool that simulates
(`--overheads FILE`, or the `overheads` key of a train / activate config). GPU clusters need
none: without it the lowering's PlacedGraph is simulated as it is. Example (seconds):

    {"format": "tfplace.runtime_overheads", "version": 1,
     "step_s": 9.2e-4, "feed_input_s": 2.1e-5, "feed_s_per_byte": 4.0e-10, "worker_s": 2.6e-4,
     "step_cpu_s": 1.6e-4, "master_worker_cpu_s": 4.0e-5, "worker_cpu_s": 2.8e-4, "op_s": 3.0e-6,
     "transfer_s": {"CPU|CPU": -1.0e-5}, "transfer_gap_s": 6.0e-5,
     "message_cpu_s": {"CPU|CPU": 1.4e-4}, "collective_s": {"3": -5.6e-4},
     "collective_cpu_s": {"3": {"bytes": [16, 1048576], "seconds": [2.4e-4, 1.9e-3]}},
     "message_cpu_s_per_byte": 1.1e-9, "inter_op_threads": 1}

Fields (every one optional; absent = adds nothing):
  step_s                once per step: the client -> master -> workers dispatch and the fetch,
                        charged to the first fed input's first instance (nothing starts before it)
  feed_input_s          per fed input beyond the first, charged there too
  feed_s_per_byte       per byte of every fed input at the global batch, charged there too
  worker_s              per further task running part of the step: each further device's lane
                        waits worker_s x the further tasks (the master's RunGraphs go out at once)
  step_cpu_s            the master's CPU for a one-task step; with it, the dispatch leaves the CPU
                        demand as wall and enters as CPU (the overheads' cpu_demand)
  master_worker_cpu_s   the master's CPU per further task (with step_cpu_s)
  worker_cpu_s          each further task's own CPU for its part of the step
  op_s                  per compute task: the executor's dispatch around each profiled kernel
  transfer_s            per message, beyond its link time and its message CPU; one number or one
                        per pair of device kinds ("CPU|CPU_half", the kinds sorted); may be < 0
  transfer_gap_s        a burst's per-message gap (LogGP's g): a transfer holds its links for
                        gap + bytes / bandwidth, so back-to-back messages overlap their latency
  collective_s          per all-reduce, beyond the profile's fit; one number or one per group size
                        ({"3": ...}); may be < 0 (a chained all-reduce takes less than a traced one)
  message_cpu_s         CPU one gRPC message costs its two processes together; one number or one
                        per pair of device kinds
  message_cpu_share     per pair of different kinds, the share each end's kind pays
                        ({"CPU|CPU_half": {"CPU": 0.42, "CPU_half": 0.58}}); half each without it
  inter_op_threads      the inter-op threads of each server task it was measured with (1): with
                        one, a message's CPU runs on the lanes as HANDLER tasks; with more, beside them
  collective_cpu_s      per group size, one participant's CPU per all-reduce as a curve over bytes
                        {"bytes": [...], "seconds": [...], "seconds_by_kind": {kind: [...]}}
  message_cpu_s_per_byte  CPU per message byte, both ends together
  machine_probe_s       the machine it was measured on: the quiet seconds of one repetition of
                        tfplace's machine-speed probe (tfplace.runtime.machine_speed), median over
                        the cores the cluster uses. The figures above are CPU time and scale with
                        the machine; a run that finds its cores far from this speed says so
  how, raw              how it was measured and the raw measurements (kept, not used by the model)

The pass that applies it is `tfplace.overheads.apply`. Pure: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
from typing import Any, Mapping, Optional, Tuple, Union

import numpy as np

from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import FieldReader, write_json

FORMAT = "tfplace.runtime_overheads"
FIX = "measure the overheads again with `python -m tfplace.cli.overheads --cluster C --out FILE`"

PerMessage = Union[float, Mapping[str, float]]  # one number, or one per "kindA|kindB" pair
PerGroup = Union[float, Mapping[str, float]]  # one number, or one per group size ("3")


def _frozen(value: Any) -> Any:
    """A read-only copy of nested mappings (lists become tuples)."""
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _thawed(value: Any) -> Any:
    """The JSON form of a _frozen value."""
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class RuntimeOverheads:
    """See the module docstring. Build it with `overheads_from_json` or `load_overheads` (which
    validate); `source` names the file in error messages."""
    step_s: float = 0.0
    feed_input_s: float = 0.0
    feed_s_per_byte: float = 0.0
    worker_s: float = 0.0
    step_cpu_s: Optional[float] = None
    master_worker_cpu_s: float = 0.0
    worker_cpu_s: float = 0.0
    op_s: float = 0.0
    transfer_s: PerMessage = 0.0
    transfer_gap_s: Optional[float] = None
    collective_s: Optional[PerGroup] = None
    message_cpu_s: PerMessage = 0.0
    message_cpu_share: Optional[Mapping[str, Mapping[str, float]]] = None
    inter_op_threads: int = 1
    collective_cpu_s: Mapping[str, Mapping[str, Any]] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}))
    message_cpu_s_per_byte: float = 0.0
    machine_probe_s: Optional[float] = None
    how: str = ""
    raw: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    source: str = "runtime overheads"

    def to_json(self) -> dict:
        out = {"format": FORMAT, "version": 1}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "source" or value is None or (f.name in ("how", "raw", "collective_cpu_s") and not value):
                continue
            out[f.name] = _thawed(value)
        return out


_SECONDS = ("step_s", "feed_input_s", "feed_s_per_byte", "worker_s", "master_worker_cpu_s", "worker_cpu_s", "op_s",
            "message_cpu_s_per_byte")


def _number(r: FieldReader, key: str, nonnegative: bool, default: Any) -> Any:
    must = "be a finite number >= 0" if nonnegative else "be a finite number"
    return r.get(key, float, default=default, must=must, fix=FIX,
                 check=lambda v: math.isfinite(v) and (v >= 0 or not nonnegative))


def _number_or_table(r: FieldReader, key: str, nonnegative: bool, default: Any, keys_are: str) -> Any:
    """A number, or an object of numbers keyed by `keys_are` (device-kind pairs or group sizes)."""
    if not r.has(key) or not isinstance(r.data[key], dict):
        return _number(r, key, nonnegative, default)
    table = r.child(key)
    for name in table.data:
        if keys_are == "group" and not (name.isdigit() and int(name) >= 2):
            raise table.error(name, "is not a group size", "key each entry by the all-reduce's device count, "
                              "e.g. \"3\"")
        if keys_are == "pair" and len(name.split("|")) != 2:
            raise table.error(name, "is not a pair of device kinds", "key each entry \"kindA|kindB\" (sorted)")
        _number(table, name, nonnegative, None)
    return _frozen(dict(table.data))


def check_curve(curve: Any, source: str, field: str) -> tuple:
    """(bytes[K], seconds[K]) of one measured curve {"bytes": [...], "seconds": [...]}: K >= 1
    points, bytes strictly increasing, seconds >= 0."""
    fix = FIX
    if not isinstance(curve, Mapping) or "bytes" not in curve or "seconds" not in curve:
        raise InputError(source, field, "must be {\"bytes\": [...], \"seconds\": [...]}", fix)
    try:
        b = np.asarray(curve["bytes"], dtype=np.float64)
        s = np.asarray(curve["seconds"], dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(source, field, "bytes and seconds must be lists of numbers", fix) from None
    if b.ndim != 1 or b.shape != s.shape or len(b) == 0:
        raise InputError(source, field, "needs as many seconds as bytes, at least one point", fix)
    if (np.diff(b) <= 0).any() or (s < 0).any() or not np.isfinite(s).all():
        raise InputError(source, field, "needs strictly increasing bytes and finite seconds >= 0", fix)
    return b, s


def _curve(r: FieldReader) -> Mapping[str, Any]:
    """One collective_cpu_s curve (check_curve), and its seconds_by_kind, per device kind, the same."""
    r.expect_keys(["bytes", "seconds", "seconds_by_kind"], also_allowed=())
    check_curve(r.data, r.source, r.path)
    by_kind = r.data.get("seconds_by_kind")
    if by_kind is not None:
        if not isinstance(by_kind, Mapping):
            raise r.error("seconds_by_kind", f"must map device kinds to seconds, got {type(by_kind).__name__}", FIX)
        for kind, seconds in by_kind.items():
            check_curve({"bytes": r.data["bytes"], "seconds": seconds}, r.source, f"{r.path}.seconds_by_kind.{kind}")
    return _frozen(dict(r.data))


def _shares(r: FieldReader) -> Optional[Mapping[str, Mapping[str, float]]]:
    if not r.has("message_cpu_share") or r.data["message_cpu_share"] is None:
        r.get("message_cpu_share", dict, default=None)
        return None
    table = r.child("message_cpu_share")
    for pair, ends in table.entries():
        kinds = pair.split("|")
        if len(kinds) != 2 or kinds[0] == kinds[1]:
            raise table.error(pair, "is not a pair of two different device kinds",
                              "key each entry \"kindA|kindB\" (ends of one kind pay half each)")
        if set(ends.data) != set(kinds):
            raise table.error(pair, f"is {dict(ends.data)!r}: needs the share of each end, {' and '.join(kinds)}",
                              FIX)
        values = [ends.get(k, float, check=lambda v: 0.0 <= v <= 1.0, must="lie in [0, 1]", fix=FIX)
                  for k in ends.data]
        if abs(sum(values) - 1.0) > 1e-6:
            raise table.error(pair, f"shares {values} must add up to 1", FIX)
    return _frozen(dict(table.data))


def overheads_from_reader(r: FieldReader) -> RuntimeOverheads:
    """Validates one overheads object (already past its format check)."""
    known = [f.name for f in dataclasses.fields(RuntimeOverheads) if f.name != "source"]
    r.expect_keys(known)
    values = {key: _number(r, key, True, 0.0) for key in _SECONDS}
    values["step_cpu_s"] = _number(r, "step_cpu_s", True, None)
    values["transfer_gap_s"] = _number(r, "transfer_gap_s", True, None)
    values["transfer_s"] = _number_or_table(r, "transfer_s", False, 0.0, "pair")
    values["message_cpu_s"] = _number_or_table(r, "message_cpu_s", True, 0.0, "pair")
    values["collective_s"] = _number_or_table(r, "collective_s", False, None, "group")
    values["message_cpu_share"] = _shares(r)
    values["inter_op_threads"] = r.get("inter_op_threads", int, default=1, check=lambda v: v >= 1,
                                       must="be >= 1 (the inter-op threads of each server task)", fix=FIX)
    curves = r.child("collective_cpu_s", default_empty=True)
    for size in curves.data:
        if not (size.isdigit() and int(size) >= 2):
            raise curves.error(size, "is not a group size", "key each curve by the all-reduce's device count")
    values["collective_cpu_s"] = _frozen({size: _curve(c) for size, c in curves.entries()})
    values["machine_probe_s"] = r.get("machine_probe_s", float, default=None,
                                      check=lambda v: math.isfinite(v) and v > 0, must="be a number of seconds > 0",
                                      fix=FIX)
    values["how"] = r.get("how", str, default="")
    values["raw"] = _frozen(r.get("raw", dict, default={}))
    return RuntimeOverheads(**values, source=r.source)


def overheads_from_json(data: Mapping[str, Any], source: str = "runtime overheads") -> RuntimeOverheads:
    """From a parsed JSON object; `format` / `version` may be absent (a record's embedded copy)."""
    return overheads_from_reader(FieldReader.from_data(dict(data), source, expected_format=FORMAT))


def load_overheads(path: Union[str, os.PathLike]) -> RuntimeOverheads:
    return overheads_from_reader(FieldReader.from_file(path, expected_format=FORMAT))


def save_overheads(overheads: RuntimeOverheads, path: Union[str, os.PathLike]) -> None:
    write_json(path, overheads.to_json())


def kinds_pair(a: str, b: str) -> str:
    """The key of a pair of device kinds in the per-pair tables: the two kinds sorted, joined by |."""
    return "|".join(sorted((a, b)))


def check_cpu_cluster(cluster, source: str, field: str, fix: str) -> None:
    """Raises InputError naming `source` and `field` when runtime overheads are given for a cluster
    (tfplace.formats.cluster.Cluster) with devices other than CPUs: they model what the runtime of a
    CPU-emulated cluster adds to each step; a GPU cluster's step is what its profile and links say."""
    from tfplace.formats.cluster import is_cpu_kind
    other = sorted({d.kind for d in cluster.devices if not is_cpu_kind(d.kind)})
    if other:
        raise InputError(source, field, f"gives runtime overheads, which model a CPU-emulated cluster, but the "
                         f"cluster has {', '.join(other)} devices", fix)


def pair_table_error(overheads: RuntimeOverheads, field: str, pair: str, has: Tuple[str, ...]) -> InputError:
    """The one error for a per-pair / per-group table that lacks an entry the cluster needs."""
    return InputError(overheads.source, field, f"has no entry for {pair} (has {sorted(has)})",
                      "measure the overheads on a cluster with these device kinds and task count "
                      "(`python -m tfplace.cli.overheads`)")
