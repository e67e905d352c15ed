"""Strategy: what every op group does — on which devices, with how many samples each, how its
gradients are aggregated, and in which order it runs.

File format `strategy.json` (a person can read and edit it):

    {"format": "tfplace.strategy", "version": 1,
     "graph": "vgg19", "global_batch_size": 64, "max_groups": 200,
     "default": {"shares": {"v100_0": 24, "p100_0": 20, "k80_0": [10, 10]}, "sync": "allreduce"},
     "groups": {
        "block5_conv4/kernel": {"shares": {"v100_0": 64}, "sync": "ps", "ps_device": "v100_0",
                                "priority": 3}}}

Semantics (DESIGN §4): `shares` maps a device to its samples of the global batch, or to a list
of micro-batch sizes run one after another on that device. Shares always sum to the global batch.
Batch-split ops of the group run on every listed device with that many samples; non-batch ops
(variables, optimizer updates) are mirrored on every listed device, and the gradients of a
mirrored variable are aggregated by all-reduce among the holders (`"sync": "allreduce"`) or by
the `ps_device`, which reduces, updates and sends back (`"sync": "ps"`). `priority` (lower runs
first) orders the group's ops on each device. Groups not listed take `default`.

Groups are named by the grouping (`tfplace.grouping`) of the graph at `max_groups`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

from tfplace.errors import InputError
from tfplace.jsonio import FieldReader, write_json

FORMAT = "tfplace.strategy"
SYNC_METHODS = ("allreduce", "ps")


@dataclasses.dataclass(frozen=True)
class GroupDecision:
    """The decision for one group.

    Attributes:
      shares: ((device name, (micro-batch sizes...)), ...) in device order of the file; every
        micro-batch size is > 0.
      sync: "allreduce" or "ps".
      ps_device: the PS device name when sync == "ps", else None.
      priority: execution priority on each device (lower first), or None.
    """
    shares: Tuple[Tuple[str, Tuple[int, ...]], ...]
    sync: str = "allreduce"
    ps_device: Optional[str] = None
    priority: Optional[int] = None

    @property
    def devices(self) -> Tuple[str, ...]:
        return tuple(d for d, _ in self.shares)

    @property
    def total_samples(self) -> int:
        return sum(sum(mb) for _, mb in self.shares)

    def samples_on(self, device: str) -> int:
        return sum(sum(mb) for d, mb in self.shares if d == device)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"shares": {d: (mb[0] if len(mb) == 1 else list(mb)) for d, mb in self.shares},
                               "sync": self.sync}
        if self.ps_device is not None:
            out["ps_device"] = self.ps_device
        if self.priority is not None:
            out["priority"] = self.priority
        return out


def decision(shares: Mapping[str, Union[int, Sequence[int]]], sync: str = "allreduce",
             ps_device: Optional[str] = None, priority: Optional[int] = None) -> GroupDecision:
    """Convenience constructor: `decision({"gpu0": 32, "gpu1": [16, 16]}, "ps", "gpu0")`."""
    norm = tuple((d, (int(v),) if isinstance(v, int) else tuple(int(x) for x in v)) for d, v in shares.items())
    return GroupDecision(norm, sync, ps_device, priority)


@dataclasses.dataclass(frozen=True)
class Strategy:
    """A complete strategy for one graph at one global batch size.

    Attributes:
      global_batch_size: samples per training step.
      max_groups: the coarsening level K the group names refer to.
      default: decision for groups not in `groups` (None: every group must be listed).
      groups: group name -> decision.
      graph: model/graph name it was made for (informational).
      source: file it came from (for messages).
    """
    global_batch_size: int
    max_groups: int
    default: Optional[GroupDecision]
    groups: Mapping[str, GroupDecision]
    graph: str = ""
    source: str = ""

    def decision_for(self, group_name: str) -> GroupDecision:
        d = self.groups.get(group_name, self.default)
        if d is None:
            raise InputError(self.source or "strategy", f"groups.{group_name}", "no decision and no default",
                             'add the group or a "default" decision')
        return d

    def all_devices(self) -> Tuple[str, ...]:
        seen: Dict[str, None] = {}
        for d in ([self.default] if self.default else []) + list(self.groups.values()):
            for name in d.devices:
                seen[name] = None
            if d.ps_device:
                seen[d.ps_device] = None
        return tuple(seen)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"format": FORMAT, "version": 1, "graph": self.graph,
                               "global_batch_size": self.global_batch_size, "max_groups": self.max_groups}
        if self.default is not None:
            out["default"] = self.default.to_json()
        out["groups"] = {name: d.to_json() for name, d in self.groups.items()}
        return out


def _decision_from_reader(r: FieldReader, global_batch_size: int) -> GroupDecision:
    shares_r = r.child("shares")
    shares = []
    for device, value in shares_r.data.items():
        field = shares_r.field_path(device)
        sizes = value if isinstance(value, list) else [value]
        if not sizes or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in sizes):
            raise InputError(r.source, field, f"must be a positive integer or a list of them, got {value!r}",
                             "give the samples this device processes (or its micro-batch sizes)")
        shares.append((device, tuple(sizes)))
    if not shares:
        raise r.error("shares", "is empty", "give at least one device with samples")
    total = sum(sum(mb) for _, mb in shares)
    if total != global_batch_size:
        raise r.error("shares", f"samples sum to {total}, but the global batch size is {global_batch_size}",
                      f"make the shares add up to {global_batch_size}")
    sync = r.get("sync", str, default="allreduce", check=lambda v: v in SYNC_METHODS,
                 must=f"be one of {list(SYNC_METHODS)}")
    ps_device = r.get("ps_device", str, default=None)
    if sync == "ps" and ps_device is None:
        raise r.error("ps_device", 'missing while "sync" is "ps"', "name the device that aggregates the gradients")
    if sync == "allreduce" and ps_device is not None:
        raise r.error("ps_device", 'given while "sync" is "allreduce"', 'remove it or set "sync": "ps"')
    priority = r.get("priority", int, default=None)
    r.reject_unknown(also_allowed=("comment",))
    return GroupDecision(tuple(shares), sync, ps_device, priority)


def strategy_from_reader(r: FieldReader) -> Strategy:
    batch = r.get("global_batch_size", int, check=lambda v: v > 0, must="be > 0")
    max_groups = r.get("max_groups", int, check=lambda v: v > 0, must="be > 0")
    graph = r.get("graph", str, default="")
    default = _decision_from_reader(r.child("default"), batch) if r.has("default") else None
    groups = {name: _decision_from_reader(g, batch) for name, g in r.child("groups", default_empty=True).entries()}
    if default is None and not groups:
        raise r.error("groups", "no decisions at all", 'add a "default" decision or per-group decisions')
    r.reject_unknown()
    return Strategy(batch, max_groups, default, groups, graph, r.source)


def load_strategy(path: Union[str, os.PathLike]) -> Strategy:
    """Reads a strategy.json file and checks it on its own (see `validate_strategy` for the
    checks against a graph and a cluster)."""
    return strategy_from_reader(FieldReader.from_file(path, expected_format=FORMAT))


def save_strategy(strategy: Strategy, path: Union[str, os.PathLike]) -> None:
    write_json(path, strategy.to_json())


def validate_strategy(strategy: Strategy, group_names: Sequence[str], device_names: Sequence[str],
                      global_batch_size: Optional[int] = None) -> None:
    """Checks a strategy against a grouping and a cluster; raises InputError naming the field."""
    src = strategy.source or "strategy"
    known_groups = set(group_names)
    known_devices = list(device_names)
    if global_batch_size is not None and strategy.global_batch_size != global_batch_size:
        raise InputError(src, "global_batch_size",
                         f"is {strategy.global_batch_size}, the graph is set up for {global_batch_size}",
                         "make a strategy for this batch size or change the batch size")
    for name in strategy.groups:
        if name not in known_groups:
            raise InputError(src, f"groups.{name}", "no such group in the graph at this max_groups",
                             "use group names from `python -m tfplace.groups` for the same max_groups")
    items = ([("default", strategy.default)] if strategy.default else []) + \
        [(f"groups.{n}", d) for n, d in strategy.groups.items()]
    for field, d in items:
        for device, _ in d.shares:
            if device not in known_devices:
                raise InputError(src, f"{field}.shares.{device}", f"unknown device {device!r}",
                                 f"use one of the cluster's devices {known_devices}")
        if d.ps_device is not None and d.ps_device not in known_devices:
            raise InputError(src, f"{field}.ps_device", f"unknown device {d.ps_device!r}",
                             f"use one of the cluster's devices {known_devices}")
    if strategy.default is None:
        missing = [g for g in group_names if g not in strategy.groups]
        if missing:
            raise InputError(src, "groups", f"{len(missing)} groups have no decision, e.g. {missing[0]!r}",
                             'add a "default" decision')
