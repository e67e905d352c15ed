"""PlacedGraph: one training step after the strategy is applied, as flat arrays of tasks.

Built only by `tfplace.lowering.lower.lower` (the one place that decides what a strategy means);
consumed by the simulator (`tfplace.simulator.simulate`) and by the graph rewrite, so what is
simulated is what runs. No TensorFlow import.

Layout (M tasks, F buffers, D devices, L links, N ops / T tensors / E data edges of the OpGraph).
Times in seconds, sizes in bytes, sample ranges are half-open [lo, hi) of the global batch.

  tasks       task_kind[M] int8        COMPUTE, RESPLIT, SUM, TRANSFER, COLLECTIVE, HANDLER
                                       (constants below)
              task_device[M] int32     device whose compute lane runs it (COMPUTE/RESPLIT/SUM/
                                       HANDLER), the destination of a TRANSFER, -1 for a COLLECTIVE
              task_src_device[M] int32 source device of a TRANSFER, else -1
              task_op[M] int32         the op (COMPUTE), the producer op of task_tensor, or for
                                       a PS send-back the variable's handle op (a bucket's first)
              task_tensor[M] int32     tensor moved / combined by a non-COMPUTE task; -1 for
                                       COMPUTE and for a PS send-back (a TRANSFER of an updated
                                       variable from the PS to a mirror, after every update)
              task_samples[M] int32    COMPUTE: samples of its micro-batch, 0 for a mirrored
                                       (not batch-split) instance; RESPLIT/TRANSFER of a batched
                                       tensor: samples in the slice; else 0
              task_lo[M], task_hi[M]   int32 sample range (COMPUTE replica or batched slice); a
                                       mirrored instance or a whole tensor has [0, B)
              task_seconds[M] float64  duration on free resources (profile, memory bandwidth,
                                       link or collective model); the simulator adds contention
              task_bytes[M] float64    bytes produced (COMPUTE: all its outputs) or moved
                                       (TRANSFER: slice bytes; COLLECTIVE: the tensor size S)
              task_priority[M] int64   lower runs first on a device (group priority, then
                                       topological rank; see handlers);
                                       ties by task id
              task_weight[M] float64   COMPUTE replicas: aggregation weight of its partial values,
                                       samples / B (used where tensor_weight_mean, else 1); 0 else
  compute     tasks [0, num_compute) are op instances, op-major: op i runs as tasks
              op_task_ptr[i] .. op_task_ptr[i+1]-1 (micro-batches / mirrors in layout order)
  deps        dep_src[K], dep_dst[K] int32   task dep_src must finish before dep_dst starts
                                       (data through buffers, control edges, PS send-back,
                                       the step's messages);
                                       duplicates allowed (the simulator counts them consistently)
  links       link_ptr[M+1], link_idx  links a TRANSFER / COLLECTIVE occupies (CSR)
              link_names[L'], link_bandwidth_bytes_per_s[L']: the cluster's links followed by
                                       one out-port and one in-port per device (see lowering)
  collectives part_ptr[M+1], part_dev  participants of a COLLECTIVE in ring order (CSR)
  buffers     buf_task[F], buf_device[F], buf_bytes[F] float64, buf_tensor[F] (-1 if none);
              sorted by buf_task, so out_ptr[M+1] (CSR) lists each task's buffers
              in_ptr[M+1], in_buf, in_edge  buffers each task reads (CSR); a COMPUTE task lists
                                       its data inputs in port order with in_edge = the OpGraph
                                       edge, other tasks list their inputs (slices in range
                                       order) with in_edge = -1. A buffer nobody reads lives
                                       until its producer ends.
  memory      static_bytes[D] float64  variables and optimizer slots resident on each device
  weights     tensor_weight_mean[T] bool  True: combining replicas of the tensor (sum of partial
                                       values, or concatenation into an update) weights replica r
                                       by task_weight (= samples_r / B); False: weight 1
              tensor_mean_scaled[T] bool  batched tensors of a mean-reduced loss's backward pass
                                       from the mean's division by the replica's count on
                                       (GraphIndex._after_batch_count; not the loss gradient
                                       tiled over the batch before it):
                                       replica r's values carry 1/s_r per sample, so a slice a
                                       RESPLIT/TRANSFER hands to a consumer replica of s_c samples
                                       is scaled by s_r / s_c (empty: none; additive field)
              tensor_batch_rows[T] int32  entries per sample along a batched tensor's batch axis:
                                       samples [lo, hi) of the tensor are entries [lo*k, hi*k)
                                       of that axis (k = L for activations flattened to [N*L, d];
                                       empty: 1 everywhere; additive field)
  control     task_control[M] bool     TRANSFERs that carry no data: a control edge between op
                                       instances on different devices, one empty message per
                                       (source instance, destination device) as TensorFlow's
                                       partitioner sends it (0 bytes, the link latency; the rewrite
                                       emits it as the control edge itself). Empty: none; additive
  handlers    HANDLER tasks: none in what the lowering emits; only the runtime-overhead pass
              (tfplace.overheads.apply) adds them, and the rewrite refuses a graph with them. A TF server with
              one inter-op thread serves a tensor, and hands a received one on, only when no op
              is ready there: per TRANSFER x, two, the sender's (x's source device; the sending
              half of x's message CPU; last by priority), after every task x depends on
              and before x, and the receiver's hand-back (x's destination; 0 s), after x and
              before every task that depends on x. Per collective or transfer on CPU devices,
              with the runtime overheads' collective / per-byte CPU: one per CPU device it
              occupies, that CPU over the device's CPU fraction, ready with it (after every task
              it depends on), at its priority, before nothing. task_op / task_tensor are their
              owner's; no buffers
  step        step_message_start int     TRANSFERs from here on are the step's own messages
                                       (tfplace.lowering.assemble._step_messages; -1: none,
                                       additive field): a feed slice is a TRANSFER of an input
                                       instance's bytes from the feed device (where the global
                                       batch is fed) to the instance's device, with no buffers
                                       (task_op the input op); a device's "done" is a control
                                       TRANSFER to the feed device after the tasks on it that
                                       nothing else waits for (task_op the sink)
  link hold   task_hold_seconds[M] float64  how long a TRANSFER / COLLECTIVE occupies its links
                                       from its start (<= task_seconds: the bandwidth part plus
                                       the runtime's per-message gap; the latency part overlaps
                                       the next message on the link). Empty: the whole duration
                                       (additive field)
  CPU         device_cpu_fraction[D] float64 the share of a core each device may use (its
                                       profile kind's CPU quota, 1 without one; the lowering
                                       fills it), and
              device_cpu_seconds[D] float64  CPU seconds the step asks of each device (kernels,
                                       message and collective work): only the runtime-overhead
                                       pass (tfplace.overheads.apply) fills it; the simulator's
                                       step is then at least their CPU bound. Empty: no bound
                                       (additive fields)
  feed        input_ops[I] int32       the graph's fed input ops, in the graph's order, and
              feed_bytes float         their bytes at the global batch (what the client feeds)
  send-back   send_back_task[K], send_back_op[K] int32  a PS send-back that carries a bucket of
  buckets                              variables (tfplace.lowering.buckets) lists every member's
                                       handle op here; a send-back not listed carries its task_op
                                       alone (empty: none; additive fields)
  scratch     scratch_task[H], scratch_device[H], scratch_free_task[H] int32, scratch_bytes[H]
                                       float64: memory a task's TensorFlow nodes hold that is no
                                       buffer of the PlacedGraph (a bucket's packed concat, the CPU
                                       exchange's received shards, a PS send-back's received
                                       value): allocated on
                                       scratch_device when scratch_task allocates its outputs,
                                       freed when scratch_free_task finishes (a TRANSFER /
                                       COLLECTIVE allocates at its end, so its scratch counts
                                       there, next to its inputs and outputs; memory only: the
                                       rewrite reads none of it; empty: none; additive fields)

Reading it to emit a graph (the rewrite): COMPUTE task k of op i is replica k of i on
task_device, reading in_buf in port order; a buffer is (producer task, tensor) on buf_device;
TRANSFER = Send/Recv of its one input (a bucket: of each input, packed); RESPLIT = slice/concat of
its inputs (in range order) to [task_lo, task_hi); SUM = add of its inputs; COLLECTIVE = all-reduce
(sum) of its inputs, one output per participant. Scaling a replica's value of a weighted tensor by task_weight where the
replica produces it makes every later SUM / COLLECTIVE a plain sum.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

import numpy as np

TASK_COMPUTE, TASK_RESPLIT, TASK_SUM, TASK_TRANSFER, TASK_COLLECTIVE, TASK_HANDLER = 0, 1, 2, 3, 4, 5
TASK_KIND_NAMES = ("compute", "resplit", "sum", "transfer", "collective", "handler")
#: Kinds that run on a device's compute lane (one at a time per device).
DEVICE_KINDS = (TASK_COMPUTE, TASK_RESPLIT, TASK_SUM, TASK_HANDLER)


@dataclasses.dataclass(frozen=True, eq=False)
class PlacedGraph:
    """See the module docstring for every array. Built by `tfplace.lowering.lower.lower`."""
    device_names: Tuple[str, ...]
    global_batch_size: int
    num_compute: int
    op_task_ptr: np.ndarray
    task_kind: np.ndarray
    task_device: np.ndarray
    task_src_device: np.ndarray
    task_op: np.ndarray
    task_tensor: np.ndarray
    task_samples: np.ndarray
    task_lo: np.ndarray
    task_hi: np.ndarray
    task_seconds: np.ndarray
    task_bytes: np.ndarray
    task_priority: np.ndarray
    task_weight: np.ndarray
    dep_src: np.ndarray
    dep_dst: np.ndarray
    link_ptr: np.ndarray
    link_idx: np.ndarray
    link_names: Tuple[str, ...]
    link_bandwidth_bytes_per_s: np.ndarray
    part_ptr: np.ndarray
    part_dev: np.ndarray
    buf_task: np.ndarray
    buf_device: np.ndarray
    buf_bytes: np.ndarray
    buf_tensor: np.ndarray
    out_ptr: np.ndarray
    in_ptr: np.ndarray
    in_buf: np.ndarray
    in_edge: np.ndarray
    static_bytes: np.ndarray
    tensor_weight_mean: np.ndarray
    op_names: Tuple[str, ...] = ()
    tensor_mean_scaled: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=bool))
    tensor_batch_rows: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    task_control: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=bool))
    task_hold_seconds: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    step_message_start: int = -1
    device_cpu_seconds: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    device_cpu_fraction: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    input_ops: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    feed_bytes: float = 0.0
    send_back_task: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    send_back_op: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    scratch_task: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    scratch_device: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    scratch_bytes: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    scratch_free_task: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int32))

    def is_step_message(self, task: int) -> bool:
        """Whether `task` is one of the step's own messages (a feed slice or a device's "done")."""
        return 0 <= self.step_message_start <= task and int(self.task_kind[task]) == TASK_TRANSFER

    def is_control_message(self, task: int) -> bool:
        """Whether `task` is a TRANSFER of no data (a control edge across devices)."""
        return bool(len(self.task_control)) and bool(self.task_control[task])

    def __post_init__(self):
        m, f = len(self.task_kind), len(self.buf_task)
        per_task = ("task_device", "task_src_device", "task_op", "task_tensor", "task_samples", "task_lo",
                    "task_hi", "task_seconds", "task_bytes", "task_priority", "task_weight")
        for name in per_task:
            if len(getattr(self, name)) != m:
                raise ValueError(f"PlacedGraph.{name}: length {len(getattr(self, name))} != {m} tasks")
        for name in ("link_ptr", "part_ptr", "out_ptr", "in_ptr"):
            if len(getattr(self, name)) != m + 1:
                raise ValueError(f"PlacedGraph.{name}: must have {m + 1} entries (CSR over tasks)")
        for name in ("buf_device", "buf_bytes", "buf_tensor"):
            if len(getattr(self, name)) != f:
                raise ValueError(f"PlacedGraph.{name}: length != {f} buffers")
        if len(self.dep_src) != len(self.dep_dst) or len(self.in_buf) != len(self.in_edge):
            raise ValueError("PlacedGraph: dep_src/dep_dst or in_buf/in_edge lengths differ")
        if len(self.task_hold_seconds) not in (0, m):
            raise ValueError(f"PlacedGraph.task_hold_seconds: length {len(self.task_hold_seconds)} != {m} tasks (or 0)")
        for name in ("device_cpu_seconds", "device_cpu_fraction"):
            if len(getattr(self, name)) not in (0, len(self.device_names)):
                raise ValueError(f"PlacedGraph.{name}: one entry per device (or none)")
        if len(self.static_bytes) != len(self.device_names):
            raise ValueError("PlacedGraph.static_bytes: one entry per device")
        if len(self.send_back_task) != len(self.send_back_op):
            raise ValueError("PlacedGraph: send_back_task/send_back_op lengths differ")
        h = len(self.scratch_task)
        if any(len(getattr(self, name)) != h for name in ("scratch_device", "scratch_bytes", "scratch_free_task")):
            raise ValueError("PlacedGraph: scratch_task/device/bytes/free_task lengths differ")

    @property
    def num_tasks(self) -> int:
        return len(self.task_kind)

    @property
    def num_devices(self) -> int:
        return len(self.device_names)

    def send_back_ops(self, task: int) -> Tuple[int, ...]:
        """The handle ops of the variables PS send-back `task` carries (send_back_task/op)."""
        listed = self.send_back_op[self.send_back_task == task]
        return tuple(int(x) for x in listed) if len(listed) else (int(self.task_op[task]),)

    def memory_buffers(self) -> Tuple[np.ndarray, ...]:
        """What the simulator's memory accounting reads: the buffers followed by the scratch
        entries, each scratch entry a buffer of its task read once by its free task. Returns
        (out_ptr[M+1], buf_device[F+H], buf_bytes[F+H], in_ptr[M+1], in_buf[R+H]), buffers
        grouped by task (CSR) as out_ptr / in_ptr are."""
        if not len(self.scratch_task):
            return self.out_ptr, self.buf_device, self.buf_bytes, self.in_ptr, self.in_buf
        m, f = self.num_tasks, len(self.buf_task)
        owner = np.concatenate([self.buf_task, self.scratch_task]).astype(np.int64)
        border = np.argsort(owner, kind="stable")
        new_id = np.empty(len(border), dtype=np.int64)
        new_id[border] = np.arange(len(border))
        readers = np.concatenate([np.repeat(np.arange(m), np.diff(self.in_ptr)), self.scratch_free_task])
        read_buf = np.concatenate([self.in_buf, f + np.arange(len(self.scratch_task))]).astype(np.int64)
        rorder = np.argsort(readers, kind="stable")
        device = np.concatenate([self.buf_device, self.scratch_device]).astype(np.int64)[border]
        nbytes = np.concatenate([self.buf_bytes, self.scratch_bytes]).astype(np.float64)[border]
        return (exclusive_cumsum(np.bincount(owner, minlength=m)), device, nbytes,
                exclusive_cumsum(np.bincount(readers, minlength=m)), new_id[read_buf[rorder]])

    def tasks_of_op(self, op: int) -> np.ndarray:
        """Task ids of op `op`'s instances (its replicas or mirrors)."""
        return np.arange(self.op_task_ptr[op], self.op_task_ptr[op + 1])

    def successors(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(succ_ptr[M+1], succ_idx[K], indegree[M]): the dependency lists as CSR by source."""
        cached = self.__dict__.get("_succ")
        if cached is None:
            cached = csr_from_pairs(self.dep_src, self.dep_dst, self.num_tasks)
            indegree = np.bincount(self.dep_dst, minlength=self.num_tasks).astype(np.int32)
            cached = (cached[0], cached[1], indegree)
            object.__setattr__(self, "_succ", cached)
        return cached

    @property
    def has_runtime_overheads(self) -> bool:
        """Whether the runtime-overhead pass ran on it (HANDLER tasks or a CPU demand): such a
        graph is for the simulator only; the rewrite emits the lowering's own."""
        return bool(len(self.device_cpu_seconds)) or bool((self.task_kind == TASK_HANDLER).any())

    def weighted_reads(self, tensor_batch_axis: np.ndarray) -> Tuple[np.ndarray, ...]:
        """Where the rewrite multiplies a replica's partial value by its aggregation weight, for a
        PlacedGraph lowered from a graph with `tensor_batch_axis` [T] (the lowered graph's,
        metadata clones included): weighted_reads's (buffer[W], device[W], weight[W], charged
        task[W]). The lowering costs the same multiplies, so both read this one rule."""
        read_task = np.repeat(np.arange(self.num_tasks), np.diff(self.in_ptr))
        return weighted_reads(self.task_kind, self.task_device, self.task_samples, read_task,
                              self.in_buf.astype(np.int64), self.buf_task.astype(np.int64),
                              self.buf_tensor.astype(np.int64), self.buf_device, tensor_batch_axis,
                              self.tensor_weight_mean, self.global_batch_size)

    def task_name(self, task: int) -> str:
        """Readable name of a task, used in traces: "conv1/Conv2D/replica_1", "transfer x:0 -> gpu1"."""
        kind = int(self.task_kind[task])
        op = int(self.task_op[task])
        base = self.op_names[op] if 0 <= op < len(self.op_names) else f"op{op}"
        if kind == TASK_COMPUTE:
            return f"{base}/replica_{task - int(self.op_task_ptr[op])}"
        if kind == TASK_TRANSFER and self.is_control_message(task):
            return f"control {base} {self.device_names[self.task_src_device[task]]}->{self.device_names[self.task_device[task]]}"
        if kind == TASK_TRANSFER:
            return (f"transfer {base}:{int(self.task_tensor[task])} {self.device_names[self.task_src_device[task]]}"
                    f"->{self.device_names[self.task_device[task]]}")
        if kind == TASK_HANDLER:
            return f"handler {base}:{int(self.task_tensor[task])} on {self.device_names[self.task_device[task]]}"
        return f"{TASK_KIND_NAMES[kind]} {base}:{int(self.task_tensor[task])}"


def weighted_reads(kind, device, samples, read_task, read_buf, buf_task, buf_tensor, buf_device, tensor_batch_axis,
                   tensor_weight_mean, batch: int) -> tuple:
    """Where the rewrite multiplies a replica's partial value by its aggregation weight
    (tfplace.rewrite.graph_rewrite, "weights"; PlacedGraph.weighted_reads): (buffer[W], device[W], weight[W], charged task[W]), one entry
    per (buffer, device) as the rewrite emits one Mul per pair.

    A read is weighted when its task aggregates (a SUM, a COLLECTIVE, or an update instance: a
    COMPUTE with no samples) and the buffer, followed back through TRANSFERs to its origin, is a
    raw partial: made by a COMPUTE instance with samples, of a tensor without a batch axis that
    is mean-weighted (tensor_weight_mean), with weight samples / batch != 1. The Mul runs on the
    aggregating device (a COLLECTIVE's: the participant whose buffer it is). Its cost is charged
    to the task that made the buffer when that is a COMPUTE on the same device (the gradient
    op, before a collective), else to the aggregating task.

    kind, device, samples [M]: the tasks; read_task, read_buf [R]: every data read; buf_task,
    buf_tensor, buf_device [B]: the buffers; tensor_batch_axis, tensor_weight_mean [T]."""
    m = len(kind)
    # a transfer's input buffer of each tensor it moves (one, or a bucket's: tfplace.lowering.buckets)
    x = kind[read_task] == TASK_TRANSFER
    span = int(buf_tensor.max(initial=0)) + 1
    x_key = read_task[x].astype(np.int64) * span + buf_tensor[read_buf[x]]
    order = np.argsort(x_key, kind="stable")
    x_key, x_buf = x_key[order], np.asarray(read_buf, dtype=np.int64)[x][order]
    origin = np.asarray(read_buf, dtype=np.int64).copy()
    for _ in range(m):
        up = buf_task[origin]
        key = up.astype(np.int64) * span + buf_tensor[origin]
        at = np.minimum(np.searchsorted(x_key, key), max(len(x_key) - 1, 0))
        step = (kind[up] == TASK_TRANSFER) & (x_key[at] == key) if len(x_key) else np.zeros(len(origin), bool)
        if not step.any():
            break
        origin[step] = x_buf[at[step]]
    src, tensor = buf_task[origin], buf_tensor[origin]
    weight = np.where(kind[src] == TASK_COMPUTE, samples[src] / batch, 1.0)
    raw = (kind[src] == TASK_COMPUTE) & (samples[src] > 0) & (tensor_batch_axis[tensor] < 0) & tensor_weight_mean[tensor]
    ck = kind[read_task]
    aggregates = (ck == TASK_SUM) | (ck == TASK_COLLECTIVE) | ((ck == TASK_COMPUTE) & (samples[read_task] == 0))
    sel = np.nonzero(aggregates & raw & (weight != 1.0))[0]
    dev = np.where(ck[sel] == TASK_COLLECTIVE, buf_device[read_buf[sel]], device[read_task[sel]]).astype(np.int64)
    _, first = np.unique(read_buf[sel].astype(np.int64) * (int(device.max(initial=0)) + 1) + dev, return_index=True)
    sel, dev = sel[first], dev[first]
    buf = read_buf[sel].astype(np.int64)
    maker = buf_task[buf]
    charged = np.where((kind[maker] == TASK_COMPUTE) & (device[maker] == dev), maker, read_task[sel])
    return buf, dev, weight[sel], charged.astype(np.int64)


def exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    """CSR pointer [n+1] int64 of `counts` [n]: 0, counts[0], counts[0] + counts[1], ..."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def csr_from_pairs(keys: np.ndarray, values: np.ndarray, n: int) -> Tuple[np.ndarray, np.ndarray]:
    """Groups `values` by `keys` (ints in [0, n)), keeping their order within a key.

    Returns (ptr[n+1] int64, grouped values int32)."""
    keys = np.asarray(keys, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=ptr[1:])
    return ptr, np.asarray(values, dtype=np.int32)[order]
