"""Strategy: what every op group does — on which devices, with how many samples each, how its
gradients are aggregated, and in which order it runs.

File format `strategy.json` (a person can read and edit it):

    {"format": "tfplace.strategy", "version": 1,
     "graph": "vgg19", "global_batch_size": 64, "max_groups": 200, "bucket_bytes": 4194304,
     "min_batch_per_replica": 2,
     "default": {"shares": {"v100_0": 24, "p100_0": 20, "k80_0": [10, 10]}, "sync": "allreduce"},
     "groups": {
        "block5_conv4/kernel": {"shares": {"v100_0": 64}, "sync": "ps", "ps_device": "v100_0",
                                "priority": 3}}}

Semantics: `shares` maps a device to its samples of the global batch, or to a list
of micro-batch sizes run one after another on that device. Shares always sum to the global batch.
Batch-split ops of the group run on every listed device with that many samples; non-batch ops
(variables, optimizer updates) are mirrored on every listed device, and the gradients of a
mirrored variable are aggregated by all-reduce among the holders (`"sync": "allreduce"`) or by
the `ps_device`, which reduces, updates and sends back (`"sync": "ps"`). `priority` (lower runs
first) orders the group's ops on each device. Groups not listed take `default`.
`bucket_bytes` (optional, > 0): all-reduced gradients with the same devices are packed into
buckets of at most this many bytes, one collective each, in the order the backward pass makes
them; a worker's gradients to a PS, and the PS's updated variables back to a worker, likewise
travel as one message per bucket (tfplace.lowering.buckets); absent: DEFAULT_BUCKET_BYTES_CPU
among CPU devices, DEFAULT_BUCKET_BYTES_GPU otherwise. 1 gives one collective or message per
gradient.
`min_batch_per_replica` (optional, >= 1): every micro-batch of a group that computes batch
statistics (training-mode batch norm) holds at least this many samples (or the whole global
batch, when that is smaller): batch norm over one sample normalises every activation to its
beta. Absent: DEFAULT_MIN_BATCH_PER_REPLICA. The lowering refuses a strategy below it, naming the
group and the device; planners, the policy and the search keep to it (`with_min_batch`).

Groups are named by the grouping (`tfplace.ir.grouping`) of the graph at `max_groups`.

Data-parallel helpers for the baselines: `proportional_shares` (largest-remainder rounding of a
batch over weights), `even_strategy` and `proportional_strategy` (one default decision).
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import FieldReader, integral, write_json

FORMAT = "tfplace.strategy"
SYNC_METHODS = ("allreduce", "ps")
#: Gradient bucket size when a strategy gives none (bytes), by the devices an all-reduce runs among.
#: Among CPU devices 64 MiB, measured: DP all-reduce on the 3-task local CPU cluster, ResNet-50
#: (32x32, batch 24), the exchange over Send/Recv: 352 ms per step with 4 MiB buckets, 334 ms with
#: 16 MiB, 322 ms with 64 MiB (Horovod even 306 ms; benchmarks/parity_bench.md); a CPU task gains
#: little from overlapping the all-reduce with the backward pass. Among GPUs 4 MiB, simulated (no
#: GPU measured here): DP-even batch 64 on clusters/heterog_testbed.json, ResNet-50 63.9 ms at 1 and
#: 4 MiB, 64.7 at 16, 66.3 at 25, 74.3 at 64 MiB (a bucket's all-reduce waits for its last
#: gradient, so large buckets overlap less); VGG-19 206.7 at 4 MiB, 205.2 at 64 MiB.
DEFAULT_BUCKET_BYTES_CPU = 64 << 20
DEFAULT_BUCKET_BYTES_GPU = 4 << 20
#: Samples a replica of a batch-statistics group needs at least when a strategy gives no
#: `min_batch_per_replica`: 2 is the least for which a batch variance exists (one sample makes
#: every normalised activation 0); 1 turns the check off.
DEFAULT_MIN_BATCH_PER_REPLICA = 2


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
    norm = tuple((d, (int(v),) if isinstance(v, numbers.Integral) else tuple(int(x) for x in v))
                 for d, v in shares.items())
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
      bucket_bytes: gradient bucket size in bytes (> 0), or None for the default by device kind
        (bucket_bytes_among).
      min_batch_per_replica: least samples per micro-batch of a batch-statistics group (>= 1), or
        None for DEFAULT_MIN_BATCH_PER_REPLICA.
    """
    global_batch_size: int
    max_groups: int
    default: Optional[GroupDecision]
    groups: Mapping[str, GroupDecision]
    graph: str = ""
    source: str = ""
    bucket_bytes: Optional[int] = None
    min_batch_per_replica: Optional[int] = None

    def __post_init__(self):
        src = self.source or "strategy"
        if not (isinstance(self.global_batch_size, numbers.Integral) and self.global_batch_size > 0):
            raise InputError(src, "global_batch_size", f"must be an integer > 0, got {self.global_batch_size!r}",
                             "give the samples per training step")
        if not (isinstance(self.max_groups, numbers.Integral) and self.max_groups > 0):
            raise InputError(src, "max_groups", f"must be an integer > 0, got {self.max_groups!r}",
                             "give the grouping level K the group names refer to")
        if self.bucket_bytes is not None and not (isinstance(self.bucket_bytes, numbers.Integral)
                                                  and not isinstance(self.bucket_bytes, bool) and self.bucket_bytes > 0):
            raise InputError(src, "bucket_bytes", f"must be an integer > 0, got {self.bucket_bytes!r}",
                             "give the gradient bucket size in bytes (1: one all-reduce per gradient)")
        if self.min_batch_per_replica is not None and not (
                isinstance(self.min_batch_per_replica, numbers.Integral)
                and not isinstance(self.min_batch_per_replica, bool) and self.min_batch_per_replica >= 1):
            raise InputError(src, "min_batch_per_replica", f"must be an integer >= 1, got {self.min_batch_per_replica!r}",
                             "give the least samples a batch-norm replica may normalise over (1: no limit)")
        if self.default is None and not self.groups:
            raise InputError(src, "groups", "no decisions at all", 'add a "default" decision or per-group decisions')
        checked = set()  # groups share decision objects (a search makes thousands of strategies)
        for field, d in self.decisions():
            try:
                if d in checked:
                    continue
                checked.add(d)
            except TypeError:  # unhashable, so malformed: check_decision says where
                pass
            check_decision(d, src, field, self.global_batch_size)

    def bucket_bytes_among(self, cpu_only: bool) -> int:
        """The bucket size the lowering uses for all-reduces among CPU devices only (`cpu_only`)
        or among devices with a GPU: bucket_bytes, or that kind's default."""
        if self.bucket_bytes is not None:
            return int(self.bucket_bytes)
        return DEFAULT_BUCKET_BYTES_CPU if cpu_only else DEFAULT_BUCKET_BYTES_GPU

    @property
    def effective_min_batch_per_replica(self) -> int:
        """The least micro-batch of a batch-statistics group, capped at the global batch."""
        least = DEFAULT_MIN_BATCH_PER_REPLICA if self.min_batch_per_replica is None else int(self.min_batch_per_replica)
        return min(least, int(self.global_batch_size))

    def decisions(self) -> List[Tuple[str, GroupDecision]]:
        """(field path, decision) for the default and every listed group, in file order."""
        return ([("default", self.default)] if self.default else []) + \
            [(f"groups.{n}", d) for n, d in self.groups.items()]

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
        if self.bucket_bytes is not None:
            out["bucket_bytes"] = int(self.bucket_bytes)
        if self.min_batch_per_replica is not None:
            out["min_batch_per_replica"] = int(self.min_batch_per_replica)
        if self.default is not None:
            out["default"] = self.default.to_json()
        out["groups"] = {name: d.to_json() for name, d in self.groups.items()}
        return out


def check_decision(d: GroupDecision, source: str, field: str, global_batch_size: int) -> None:
    """Semantic checks of one decision (the single place for them; file and code alike)."""
    if not d.shares:
        raise InputError(source, f"{field}.shares", "is empty", "give at least one device with samples")
    for device, sizes in d.shares:
        if not sizes or not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) and x > 0 for x in sizes):
            raise InputError(source, f"{field}.shares.{device}",
                             f"must be a positive integer or a list of them, got {list(sizes)}",
                             "give the samples this device processes (or its micro-batch sizes), each >= 1")
    if len({dev for dev, _ in d.shares}) != len(d.shares):
        raise InputError(source, f"{field}.shares", "lists a device twice", "give each device once")
    if d.total_samples != global_batch_size:
        raise InputError(source, f"{field}.shares",
                         f"samples sum to {d.total_samples}, but the global batch size is {global_batch_size}",
                         f"make the shares add up to {global_batch_size}")
    if d.sync not in SYNC_METHODS:
        raise InputError(source, f"{field}.sync", f"unknown sync method {d.sync!r}",
                         f"use one of {list(SYNC_METHODS)}")
    if d.sync == "ps" and d.ps_device is None:
        raise InputError(source, f"{field}.ps_device", 'missing while "sync" is "ps"',
                         "name the device that aggregates the gradients")
    if d.sync == "allreduce" and d.ps_device is not None:
        raise InputError(source, f"{field}.ps_device", 'given while "sync" is "allreduce"',
                         'remove it or set "sync": "ps"')
    if d.priority is not None and not (isinstance(d.priority, numbers.Integral) and not isinstance(d.priority, bool)):
        raise InputError(source, f"{field}.priority", f"must be an integer, got {d.priority!r}",
                         "give an integer (lower runs first)")


def _decision_from_reader(r: FieldReader) -> GroupDecision:
    """Type-level parsing only; `check_decision` (via Strategy) does the semantic checks."""
    r.expect_keys(("shares", "sync", "ps_device", "priority"), also_allowed=("comment",))
    shares_r = r.child("shares")
    shares = []
    for device, value in shares_r.data.items():
        sizes = [integral(x) for x in (value if isinstance(value, list) else [value])]
        if None in sizes:
            raise InputError(r.source, shares_r.field_path(device),
                             f"must be a positive integer or a list of them, got {value!r}",
                             "give the samples this device processes (or its micro-batch sizes)")
        shares.append((device, tuple(sizes)))
    return GroupDecision(tuple(shares), r.get("sync", str, default="allreduce"),
                         r.get("ps_device", str, default=None), r.get("priority", int, default=None))


def strategy_from_reader(r: FieldReader) -> Strategy:
    r.expect_keys(("graph", "global_batch_size", "max_groups", "default", "groups", "bucket_bytes",
                   "min_batch_per_replica"))
    batch = r.get("global_batch_size", int, check=lambda v: v > 0, must="be > 0")
    bucket = r.get("bucket_bytes", int, default=None, check=lambda v: v > 0, must="be > 0",
                   fix="give the gradient bucket size in bytes (1: one all-reduce per gradient)")
    least = r.get("min_batch_per_replica", int, default=None, check=lambda v: v >= 1, must="be >= 1",
                  fix="give the least samples a batch-norm replica may normalise over (1: no limit)")
    max_groups = r.get("max_groups", int, check=lambda v: v > 0, must="be > 0")
    graph = r.get("graph", str, default="")
    default = _decision_from_reader(r.child("default")) if r.has("default") else None
    groups = {name: _decision_from_reader(g) for name, g in r.child("groups", default_empty=True).entries()}
    return Strategy(batch, max_groups, default, groups, graph, r.source, bucket, least)


def load_strategy(path: Union[str, os.PathLike]) -> Strategy:
    """Reads a strategy.json file and checks it on its own (see `validate_strategy` for the
    checks against a graph and a cluster)."""
    return strategy_from_reader(FieldReader.from_file(path, expected_format=FORMAT))


def save_strategy(strategy: Strategy, path: Union[str, os.PathLike]) -> None:
    write_json(path, strategy.to_json())


def made_for(strategy: Strategy) -> str:
    """" (the strategy was made for graph 'X')" when the strategy names its graph, else "": said
    beside a group the graph lacks, since a strategy made for another graph is the usual cause."""
    return f" (the strategy was made for graph {strategy.graph!r})" if strategy.graph else ""


def graph_mismatch_note(strategy: Strategy, graph_name: str) -> Optional[str]:
    """A line to print when `strategy` names a graph other than `graph_name` (the graph's model
    name): a strategy with only a default decision applies to any graph, so nothing else says so."""
    if not strategy.graph or not graph_name or strategy.graph == graph_name:
        return None
    where = f" ({strategy.source})" if strategy.source else ""
    return f"note: the strategy{where} was made for graph {strategy.graph!r}; it is applied to {graph_name!r}"


def validate_strategy(strategy: Strategy, group_names: Optional[Sequence[str]], device_names: Sequence[str],
                      global_batch_size: Optional[int] = None) -> None:
    """Checks a strategy against a grouping and a cluster; raises InputError naming the field.

    group_names None skips the grouping checks (e.g. before the graph is loaded).
    """
    src = strategy.source or "strategy"
    known_devices = list(device_names)
    if global_batch_size is not None and strategy.global_batch_size != global_batch_size:
        raise InputError(src, "global_batch_size",
                         f"is {strategy.global_batch_size}, the graph is set up for {global_batch_size}",
                         "make a strategy for this batch size or change the batch size")
    if group_names is not None:
        known_groups = set(group_names)
        for name in strategy.groups:
            if name not in known_groups:
                raise InputError(src, f"groups.{name}", "no such group in the graph at this max_groups" +
                                 made_for(strategy), "give the graph the strategy was made for, with the same model "
                                 "options (image size, sequence length, layers; a training run's best_time.log names "
                                 "it as graph_file), at the same max_groups")
    for field, d in strategy.decisions():
        for device, _ in d.shares:
            if device not in known_devices:
                raise InputError(src, f"{field}.shares.{device}", f"unknown device {device!r}",
                                 f"use one of the cluster's devices {known_devices}")
        if d.ps_device is not None and d.ps_device not in known_devices:
            raise InputError(src, f"{field}.ps_device", f"unknown device {d.ps_device!r}",
                             f"use one of the cluster's devices {known_devices}")
    if strategy.default is None and group_names is not None:
        missing = [g for g in group_names if g not in strategy.groups]
        if missing:
            raise InputError(src, "groups", f"{len(missing)} groups have no decision, e.g. {missing[0]!r}",
                             'add a "default" decision')


def micro_batch_shortfall(d: GroupDecision, least: int) -> Optional[Tuple[str, int]]:
    """(device, samples) of the first micro-batch of `d` below `least` samples, or None."""
    for device, sizes in d.shares:
        for size in sizes:
            if size < least:
                return device, size
    return None


def _take(sizes: List[int], n: int) -> List[int]:
    """Micro-batch sizes with n samples taken from the last ones (emptied ones removed)."""
    out = list(sizes)
    while n:
        k = min(n, out[-1])
        out[-1] -= k
        n -= k
        if not out[-1]:
            out.pop()
    return out


def with_min_batch(d: GroupDecision, least: int) -> GroupDecision:
    """`d` with every micro-batch of at least `least` samples (`least` <= the decision's samples).

    A device whose samples fall short is raised to `least` with samples of the device holding the
    most (ties: the first), when that one keeps `least` itself; otherwise it gives its samples to
    that device (every device short: the one with the most takes the whole batch). Then, on each
    device, consecutive micro-batches are joined until each holds `least` (a short tail joins the
    one before it). Raising rather than dropping keeps the devices a move gave samples to. `d`
    itself when nothing falls short; sync, PS and priority are kept."""
    if micro_batch_shortfall(d, least) is None:
        return d
    order = [device for device, _ in d.shares]
    keep = {device: list(sizes) for device, sizes in d.shares}
    for device in order:
        short = least - sum(keep[device])
        if short <= 0:
            continue
        top = max(keep, key=lambda dev: (sum(keep[dev]), -order.index(dev)))
        if top == device:  # every device falls short
            keep = {top: [d.total_samples]}
            break
        if sum(keep[top]) - short >= least:
            keep[top] = _take(keep[top], short)
            keep[device] = [least]
        else:
            keep[top].append(sum(keep.pop(device)))
    shares = []
    for device, sizes in keep.items():
        merged: List[int] = []
        pending = 0
        for size in sizes:
            pending += size
            if pending >= least:
                merged.append(pending)
                pending = 0
        if pending:  # the short tail joins the micro-batch before it
            merged[-1] += pending
        shares.append((device, tuple(merged)))
    return dataclasses.replace(d, shares=tuple(shares))


def splits(d: GroupDecision) -> bool:
    """Whether `d` runs its group as more than one replica (several devices, or micro-batches)."""
    return len(d.shares) > 1 or any(len(sizes) > 1 for _, sizes in d.shares)


def whole_on_one_device(d: GroupDecision) -> GroupDecision:
    """`d` with the whole batch as one micro-batch on the device that held the most samples
    (ties: the first listed); sync, PS and priority kept. `d` itself when it does not split."""
    if not splits(d):
        return d
    device = max(d.shares, key=lambda share: sum(share[1]))[0]  # max keeps the first of equals
    return dataclasses.replace(d, shares=((device, (d.total_samples,)),))


# ---- data-parallel helpers (the baselines build on these) ----------------------------------
def proportional_shares(weights: Sequence[float], global_batch_size: int) -> List[int]:
    """Splits global_batch_size samples over devices in proportion to `weights`.

    Rule (largest remainder, exact rational arithmetic so ties are real ties):
      1. target_i = B * w_i / sum(w); share_i = floor(target_i).
      2. The samples left over go one at a time to the device with the largest shortfall
         target_i - share_i; ties go to the earlier device.
      3. If every weight is > 0 and B >= n, no device ends with 0: each device at 0 takes one
         sample from the device with the largest surplus share_j - target_j among those with
         share_j >= 2 (ties: earlier device).
    A weight of 0 gives 0 samples. Example: weights [1.8, 1], B = 64 -> [41, 23].
    """
    if global_batch_size < 0 or not weights:
        raise InputError("argument", "weights", "need at least one weight and a batch size >= 0",
                         "pass one weight per device and the global batch size")
    if any(not (0 <= w < float("inf")) for w in weights) or not any(w > 0 for w in weights):
        raise InputError("argument", "weights", f"must be finite, >= 0 and not all 0, got {list(weights)}",
                         "pass a relative speed per device (e.g. its peak FLOP/s)")
    return list(_largest_remainder(tuple(float(w) for w in weights), int(global_batch_size)))


@functools.lru_cache(maxsize=1 << 16)
def _largest_remainder(weights: Tuple[float, ...], global_batch_size: int) -> Tuple[int, ...]:
    """proportional_shares' rule for checked weights (memoised: planning splits the same weight
    rows thousands of times). Exact in integers: each float weight is num / 2^k, so on a common
    denominator the weights are integers W_i and target_i = B W_i / S (S = sum W). The remainders
    target_i - floor(target_i) are in [0, 1) and add up to the samples left over, so fewer than n
    are left and none goes twice: they go to the largest remainders, ties to the earlier device."""
    ratios = [w.as_integer_ratio() for w in weights]
    denominator = max(d for _, d in ratios)
    scaled = [global_batch_size * n * (denominator // d) for n, d in ratios]  # B W_i
    total = sum(n * (denominator // d) for n, d in ratios)  # S
    shares = [x // total for x in scaled]
    left = global_batch_size - sum(shares)
    for k in sorted(range(len(shares)), key=lambda i: (shares[i] * total - scaled[i], i))[:left]:
        shares[k] += 1
    if all(w > 0 for w in weights) and global_batch_size >= len(weights):
        for i in range(len(shares)):
            if shares[i] == 0:
                donors = [j for j in range(len(shares)) if shares[j] >= 2]
                k = max(donors, key=lambda j: (shares[j] * total - scaled[j], -j))  # surplus x S
                shares[k] -= 1
                shares[i] += 1
    return tuple(shares)


def proportional_strategy(device_names: Sequence[str], weights: Sequence[float], global_batch_size: int,
                          max_groups: int, sync: str = "allreduce", ps_device: Optional[str] = None,
                          graph: str = "") -> Strategy:
    """One default decision: every group data-parallel with `proportional_shares` samples per
    device (devices that get 0 samples are left out of the decision)."""
    if len(weights) != len(device_names):
        raise InputError("argument", "weights", f"{len(weights)} weights for {len(device_names)} devices",
                         "pass one weight per device")
    shares = proportional_shares(weights, global_batch_size)
    default = decision({d: s for d, s in zip(device_names, shares) if s > 0}, sync, ps_device)
    return Strategy(global_batch_size, max_groups, default, {}, graph)


def even_strategy(device_names: Sequence[str], global_batch_size: int, max_groups: int,
                  sync: str = "allreduce", ps_device: Optional[str] = None, graph: str = "") -> Strategy:
    """Data parallel with equal shares (the remainder goes to the first devices: 64 over 3 ->
    22, 21, 21). Needs at least one sample per device."""
    if global_batch_size < len(device_names):
        raise InputError("argument", "global_batch_size",
                         f"{global_batch_size} samples cannot cover {len(device_names)} devices",
                         "use a batch of at least one sample per device, or fewer devices")
    return proportional_strategy(device_names, [1.0] * len(device_names), global_batch_size,
                                 max_groups, sync, ps_device, graph)
