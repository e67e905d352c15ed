"""Memory-aware list-scheduling placers (HEFT, m-ETF, m-SCT family): every group on one device
with the whole batch, chosen by a list schedule of the graph's ops.

The schedule is an estimate used to choose devices; the strategy is then judged by the
simulator like any other. Instance (`SchedulingInstance`; `instance_from_problem` builds it):

  cost_s[T, D]        task t on device d (T tasks: the ops that depend on the batch, i.e. the
                      lowering's replica and update ops, at the global batch, profile per kind)
  task_group[T]       placement group of each task: all tasks of a group share one device
  memory_bytes[P]     params + estimated activations of each group (GroupCosts.memory_bytes)
  capacity_bytes[D]   device memory
  edges               (src task, dst task, bytes), src < dst: precedences (data edges carry
                      bytes, control edges 0), the op DAG in topological order
  mirror inputs       (group, task, bytes): a batch-independent value of a group (a weight
                      read, a constant) that a task of another group consumes; it is ready at
                      the start of the step on its group's device and must travel from there
  bandwidth[D, D], latency[D, D]   bottleneck bandwidth and latency of each device path

Transfer time of b bytes between devices i != j: latency[i, j] + b / bandwidth[i, j]; a device
sends one transfer at a time and receives one at a time, first come first served (the lowering's
device ports; shared NIC links between hosts are not modelled here).

Placement: a group takes its device when its first task is scheduled; the score of that choice
also charges the extra time the group's whole work would take on the device compared with its
fastest device (a group is not committed to a slow device for the sake of one tiny first task).
Candidates are the devices where
the groups already there plus this one fit in memory (no freeing, as in Baechi's m-* placers);
if none fits, the device with the most free memory, reported in `Schedule.overflow`.
Batch-independent ops (weight handles and reads, constants) are not tasks: a group whose value
a task reads before the group has a device follows that task (weights go with their first
consumer, as Baechi colocates variables), or, if it does not fit there, goes to the allowed
device closest to it; a group nobody placed goes to the fastest device it fits on.

  heft:  tasks by decreasing upward rank (mean cost over devices + the heaviest mean transfer
         time plus rank below); each on the device giving the earliest finish.
  m_etf: repeatedly schedule, among tasks whose predecessors are scheduled, the (task, device)
         pair with the earliest start (ties: higher upward rank, lower task, lower device).
  m_sct: m-ETF with Baechi's favourite-child idea in heuristic form: each task's favourite child
         is its successor with the most bytes; when the child is scheduled, the favourite
         parent's device gets a credit equal to the transfer time that staying saves (the
         edge's time to the nearest other device). (Baechi picks favourites with an LP
         relaxation; this is the greedy variant.)
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import numpy as np

from tfplace.lowering_graph import ROLE_MIRROR
from tfplace.strategy import Strategy

from tfplace.baselines.model_parallel import placement_strategy
from tfplace.baselines.problem import Problem

_EMPTY_I = np.zeros(0, dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class SchedulingInstance:
    """See the module docstring. task_group None: every task is its own group."""
    cost_s: np.ndarray
    memory_bytes: np.ndarray
    capacity_bytes: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_bytes: np.ndarray
    bandwidth: np.ndarray
    latency: np.ndarray
    task_group: Optional[np.ndarray] = None
    mirror_group: np.ndarray = dataclasses.field(default_factory=lambda: _EMPTY_I)
    mirror_task: np.ndarray = dataclasses.field(default_factory=lambda: _EMPTY_I)
    mirror_bytes: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    speed_order: Optional[Tuple[int, ...]] = None  # fastest first: where unclaimed groups go

    def __post_init__(self):
        t, d = self.cost_s.shape
        if self.task_group is None:
            object.__setattr__(self, "task_group", np.arange(t))
        if len(self.task_group) != t or len(self.capacity_bytes) != d:
            raise ValueError("SchedulingInstance: task_group needs T entries, capacity_bytes D entries")
        if len(self.task_group) and self.task_group.max() >= len(self.memory_bytes):
            raise ValueError("SchedulingInstance: memory_bytes needs one entry per group")
        if len(self.edge_src) and (np.asarray(self.edge_src) >= np.asarray(self.edge_dst)).any():
            raise ValueError("SchedulingInstance: edges must go forward (src < dst)")

    @property
    def num_tasks(self) -> int:
        return self.cost_s.shape[0]

    @property
    def num_devices(self) -> int:
        return self.cost_s.shape[1]

    @property
    def num_groups(self) -> int:
        return len(self.memory_bytes)

    def comm_s(self, src: int, dst: int, num_bytes: float) -> float:
        if src == dst:
            return 0.0
        return float(self.latency[src, dst] + num_bytes / self.bandwidth[src, dst])

    def comm_row_s(self, src: int, num_bytes: float) -> np.ndarray:
        """[D] transfer time from device src to every device."""
        out = self.latency[src] + num_bytes / self.bandwidth[src]
        out[src] = 0.0
        return out

    def adjacency(self):
        """(preds, succs): per task, lists of (other task, bytes)."""
        preds: List[List[Tuple[int, float]]] = [[] for _ in range(self.num_tasks)]
        succs: List[List[Tuple[int, float]]] = [[] for _ in range(self.num_tasks)]
        for s, t, b in zip(self.edge_src.tolist(), self.edge_dst.tolist(), self.edge_bytes.tolist()):
            preds[t].append((s, b))
            succs[s].append((t, b))
        return preds, succs

    def upward_rank(self, succs) -> np.ndarray:
        """HEFT's rank_u: mean cost + max over successors of (mean transfer time + their rank)."""
        d = self.num_devices
        off = ~np.eye(d, dtype=bool)
        inv_bw = float(np.mean(1.0 / self.bandwidth[off])) if d > 1 else 0.0
        lat = float(np.mean(self.latency[off])) if d > 1 else 0.0
        mean_cost = self.cost_s.mean(axis=1)
        rank = mean_cost.copy()
        for t in range(self.num_tasks - 1, -1, -1):  # successors have larger indices
            if succs[t]:
                rank[t] = mean_cost[t] + max(lat + b * inv_bw + rank[s] for s, b in succs[t])
        return rank


@dataclasses.dataclass(frozen=True)
class Schedule:
    """task device[T], start_s[T], finish_s[T]; group_device[P]; makespan_s; overflow: groups
    placed where they did not fit."""
    device: np.ndarray
    start_s: np.ndarray
    finish_s: np.ndarray
    group_device: np.ndarray
    makespan_s: float
    overflow: Tuple[int, ...]


class _State:
    """Placement and timing state shared by the three algorithms."""

    def __init__(self, inst: SchedulingInstance):
        self.inst = inst
        t, d, p = inst.num_tasks, inst.num_devices, inst.num_groups
        self.device = np.full(t, -1, dtype=np.int64)
        self.start = np.zeros(t)
        self.finish = np.zeros(t)
        self.avail = np.zeros(d)
        self.out_free = np.zeros(d)  # when each device's outgoing / incoming port is next free
        self.in_free = np.zeros(d)
        self.booked = {}  # (producer task, consumer task) -> arrival time of an eager transfer
        self.used = np.zeros(d)
        self.group_device = np.full(p, -1, dtype=np.int64)
        self.overflow: List[int] = []
        self.preds, self.succs = inst.adjacency()
        self.rank = inst.upward_rank(self.succs)
        # Extra seconds the whole group would take on each device over its fastest one: what
        # committing the group to a device costs beyond the task at hand.
        work = np.zeros((p, d))
        np.add.at(work, inst.task_group.astype(np.int64), inst.cost_s)
        self.commit_s = work - work.min(axis=1, keepdims=True)
        self.mirror_in: List[List[Tuple[int, float]]] = [[] for _ in range(t)]
        for g, task, nb in zip(inst.mirror_group.tolist(), inst.mirror_task.tolist(), inst.mirror_bytes.tolist()):
            if g != int(inst.task_group[task]):
                self.mirror_in[task].append((g, nb))

    def allowed(self, g: int) -> np.ndarray:
        """[D] bool: devices g may take (its device once placed; else where it fits)."""
        inst = self.inst
        out = np.zeros(inst.num_devices, dtype=bool)
        if self.group_device[g] >= 0:
            out[self.group_device[g]] = True
            return out
        out[:] = self.used + inst.memory_bytes[g] <= inst.capacity_bytes
        if not out.any():
            out[int(np.argmax(inst.capacity_bytes - self.used))] = True
        return out

    def _inputs(self, t: int):
        """(source device, earliest send time, bytes) of every input of task t that has a device
        and no transfer booked yet."""
        for p, b in self.preds[t]:
            if (p, t) not in self.booked:
                yield int(self.device[p]), float(self.finish[p]), b
        for g, b in self.mirror_in[t]:  # from the step's start, once the group has a device
            if self.group_device[g] >= 0:
                yield int(self.group_device[g]), 0.0, b

    def data_ready(self, t: int) -> np.ndarray:
        """[D] time all inputs of task t could be on each device (transfers wait for their path)."""
        ready = np.zeros(self.inst.num_devices)
        for src, at, b in self._inputs(t):
            arrive = np.maximum(max(at, self.out_free[src]), self.in_free) + self.inst.comm_row_s(src, b)
            arrive[src] = at
            ready = np.maximum(ready, arrive)
        for p, _ in self.preds[t]:
            if (p, t) in self.booked:  # t's group is placed: only its device matters
                ready = np.maximum(ready, self.booked[(p, t)])
        return ready

    def _receive(self, t: int, d: int) -> float:
        """Books the transfers of t's inputs into d, one after another on the ports; returns
        when the last input is on d."""
        ready = 0.0
        for src, at, b in self._inputs(t):
            if src == d:
                ready = max(ready, at)
                continue
            end = max(at, self.out_free[src], self.in_free[d]) + self.inst.comm_s(src, d, b)
            self.out_free[src] = self.in_free[d] = end
            ready = max(ready, end)
        for p, _ in self.preds[t]:
            ready = max(ready, self.booked.get((p, t), 0.0))
        return ready

    def place_group(self, g: int, d: int) -> None:
        inst = self.inst
        if self.used[d] + inst.memory_bytes[g] > inst.capacity_bytes[d]:
            self.overflow.append(g)
        self.used[d] += inst.memory_bytes[g]
        self.group_device[g] = d

    def place_near(self, g: int, d: int) -> None:
        """Places g on d if it fits there, else on the allowed device with the fastest path to d."""
        allowed = self.allowed(g)
        if not allowed[d]:
            d = min(np.nonzero(allowed)[0].tolist(), key=lambda x: (self.inst.comm_s(x, d, 1e9), x))
        self.place_group(g, d)

    def run_task(self, t: int, d: int) -> None:
        g = int(self.inst.task_group[t])
        if self.group_device[g] < 0:
            self.place_group(g, d)
        self.start[t] = max(self._receive(t, d), self.avail[d])
        self.finish[t] = self.start[t] + self.inst.cost_s[t, d]
        self.avail[d] = self.finish[t]
        self.device[t] = d
        for w, _ in self.mirror_in[t]:
            if self.group_device[w] < 0:
                self.place_near(w, d)
        # Outputs to consumers whose device is known leave as soon as they exist (as in the
        # simulator, where a transfer starts when its producer ends, not when its consumer runs).
        for c, b in self.succs[t]:
            e = int(self.group_device[self.inst.task_group[c]])
            if e >= 0 and e != d:
                end = max(self.finish[t], self.out_free[d], self.in_free[e]) + self.inst.comm_s(d, e, b)
                self.out_free[d] = self.in_free[e] = end
                self.booked[(t, c)] = end

    def result(self) -> Schedule:
        inst = self.inst
        order = list(inst.speed_order) if inst.speed_order else list(range(inst.num_devices))
        for g in np.nonzero(self.group_device < 0)[0].tolist():  # groups without tasks
            allowed = self.allowed(g)
            self.place_group(g, next(d for d in order if allowed[d]))
        return Schedule(self.device.copy(), self.start.copy(), self.finish.copy(), self.group_device.copy(),
                        float(self.finish.max(initial=0.0)), tuple(self.overflow))


def heft_schedule(inst: SchedulingInstance) -> Schedule:
    st = _State(inst)
    for t in range(inst.num_tasks):
        g = int(inst.task_group[t])
        ready = st.data_ready(t)
        score = np.maximum(ready, st.avail) + inst.cost_s[t] + (st.commit_s[g] if st.group_device[g] < 0 else 0.0)
        st.run_task(t, int(np.argmin(np.where(st.allowed(g), score, np.inf))))
    return st.result()


def _favourites(inst: SchedulingInstance, succs) -> Tuple[np.ndarray, np.ndarray]:
    """(fav_parent[T], fav_bytes[T]): t's parent p when t is p's favourite child, else -1."""
    parent = np.full(inst.num_tasks, -1, dtype=np.int64)
    nbytes = np.zeros(inst.num_tasks)
    for p in range(inst.num_tasks):
        if succs[p]:
            child, b = max(succs[p], key=lambda x: (x[1], -x[0]))
            if parent[child] < 0 and b > 0:
                parent[child], nbytes[child] = p, b
    return parent, nbytes


def _etf(inst: SchedulingInstance, sct: bool) -> Schedule:
    st = _State(inst)
    t_count, d = inst.num_tasks, inst.num_devices
    fav, fav_bytes = _favourites(inst, st.succs) if sct else (np.full(t_count, -1), np.zeros(t_count))
    indeg = np.zeros(t_count, dtype=np.int64)
    for t in range(t_count):
        indeg[t] = len(st.preds[t])
    dr = np.zeros((t_count, d))
    ready = [t for t in range(t_count) if indeg[t] == 0]
    group = inst.task_group.astype(np.int64)
    while ready:
        idx = np.array(ready, dtype=np.int64)
        grp = group[idx]
        placed = st.group_device[grp]
        fits = st.used[None, :] + inst.memory_bytes[grp][:, None] <= inst.capacity_bytes[None, :]
        none_fit = ~fits.any(axis=1)
        fits[none_fit, int(np.argmax(inst.capacity_bytes - st.used))] = True
        allowed = np.where((placed >= 0)[:, None], np.arange(d)[None, :] == placed[:, None], fits)
        score = np.maximum(dr[idx], st.avail[None, :]) + np.where((placed >= 0)[:, None], 0.0, st.commit_s[grp])
        if sct:
            for r, t in enumerate(ready):
                if fav[t] >= 0:
                    home = int(st.device[fav[t]])
                    others = np.delete(inst.comm_row_s(home, fav_bytes[t]), home)
                    score[r, home] -= float(others.min()) if len(others) else 0.0
        score = np.where(allowed, score, np.inf)
        col = np.argmin(score, axis=1)
        val = score[np.arange(len(idx)), col]
        r = int(np.lexsort((idx, -st.rank[idx], val))[0])
        t = ready.pop(r)
        unplaced = [w for w, _ in st.mirror_in[t] if st.group_device[w] < 0]
        st.run_task(t, int(col[r]))
        if unplaced:  # values of newly placed groups now travel to the tasks waiting for them
            for q in ready:
                if any(w in unplaced for w, _ in st.mirror_in[q]):
                    dr[q] = st.data_ready(q)
        for s, b in st.succs[t]:
            indeg[s] -= 1
            if indeg[s] == 0:
                dr[s] = st.data_ready(s)
                ready.append(s)
    return st.result()


def m_etf_schedule(inst: SchedulingInstance) -> Schedule:
    return _etf(inst, sct=False)


def m_sct_schedule(inst: SchedulingInstance) -> Schedule:
    return _etf(inst, sct=True)


def instance_from_problem(problem: Problem) -> SchedulingInstance:
    """Tasks = the ops that are not batch-independent mirrors, grouped as the lowering groups them."""
    costs, cluster, graph = problem.costs, problem.cluster, problem.lowered_graph
    ix = problem.lowerer.index
    batch = problem.global_batch_size
    is_task = ix.role != ROLE_MIRROR
    tasks = np.nonzero(is_task)[0]
    task_of = np.full(graph.num_ops, -1, dtype=np.int64)
    task_of[tasks] = np.arange(len(tasks))
    per_kind = {}
    for k in costs.kinds:
        dev = costs.device_kind.index(k)
        per_kind[k] = problem.lowerer.compute.seconds(tasks, np.full(len(tasks), dev), np.full(len(tasks), float(batch)))
    cost = np.stack([per_kind[k] for k in costs.device_kind], axis=1)
    memory = np.array([costs.memory_bytes([g], batch) for g in range(problem.num_groups)])
    # Data edges: distinct (tensor, consumer op) bytes at the batch, summed per (producer, consumer).
    t_edge = graph.edge_tensor.astype(np.int64)
    src_op = graph.tensor_op[t_edge].astype(np.int64)
    dst_op = graph.edge_dst.astype(np.int64)
    pairs, first = np.unique(np.stack([t_edge, dst_op], axis=1), axis=0, return_index=True)
    nbytes = graph.tensor_bytes_at(batch)[pairs[:, 0]]
    src_op, dst_op = src_op[first], dst_op[first]
    both = is_task[src_op] & is_task[dst_op]
    key = task_of[src_op[both]] * len(tasks) + task_of[dst_op[both]]
    ctrl = is_task[graph.control_src] & is_task[graph.control_dst]
    ckey = task_of[graph.control_src[ctrl]].astype(np.int64) * len(tasks) + task_of[graph.control_dst[ctrl]]
    all_keys = np.concatenate([key, ckey])
    uniq, inv = np.unique(all_keys, return_inverse=True)
    e_bytes = np.bincount(inv, weights=np.concatenate([nbytes[both], np.zeros(len(ckey))]), minlength=len(uniq))
    e_src, e_dst = uniq // max(len(tasks), 1), uniq % max(len(tasks), 1)
    keep = e_src < e_dst  # the op order is topological; a self pair cannot cross devices
    # Mirror inputs: batch-independent producers feeding a task of another group.
    og = costs.op_group
    mirror = ~is_task[src_op] & is_task[dst_op] & (og[src_op] != og[dst_op])
    mkey = og[src_op[mirror]] * len(tasks) + task_of[dst_op[mirror]]
    muniq, minv = np.unique(mkey, return_inverse=True)
    m_bytes = np.bincount(minv, weights=nbytes[mirror], minlength=len(muniq))
    d = cluster.num_devices
    bw = np.array([[cluster.path_bandwidth_bytes_per_s(i, j) for j in range(d)] for i in range(d)])
    lat = np.array([[cluster.path_latency_s(i, j) for j in range(d)] for i in range(d)])
    speed = costs.device_throughput()
    order = tuple(sorted(range(d), key=lambda i: (-speed[i], i)))
    return SchedulingInstance(cost, memory, cluster.memory_bytes.astype(float), e_src[keep], e_dst[keep],
                              e_bytes[keep], bw, lat, task_group=og[tasks], mirror_group=muniq // max(len(tasks), 1),
                              mirror_task=muniq % max(len(tasks), 1), mirror_bytes=m_bytes, speed_order=order)


def _placer(schedule_fn):
    def place(problem: Problem) -> Strategy:
        return placement_strategy(problem, schedule_fn(instance_from_problem(problem)).group_device)
    place.__doc__ = f"Strategy from `{schedule_fn.__name__}` over the problem's op DAG."
    return place


heft = _placer(heft_schedule)
m_etf = _placer(m_etf_schedule)
m_sct = _placer(m_sct_schedule)
