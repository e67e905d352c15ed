"""Memory-aware list-scheduling placers (HEFT, m-ETF, m-SCT family): every group on one device
with the whole batch, chosen by a list schedule of the placement groups.

The decision is per group, so the schedule is per group too: a group is one node whose cost on a
device is the summed cost of its tasks there, and it is placed once, looking at all its work and
at its communication with the groups already placed. (Scheduling single ops and committing a
group at its first op let tiny, early-ready ops, such as the shape ops of a backward group, pull
whole groups onto idle slow devices.) The schedule is an estimate used to choose devices; the
strategy is then judged by the simulator like any other.

Instance (`SchedulingInstance`; `instance_from_problem` builds it from a Problem):

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

Group view (`_GroupView`): a group can hold forward and backward ops, so the graph of groups can
have cycles (A's forward feeds B, B's gradient feeds A's backward). Each group is therefore cut
into phases: phase(t) = max(phase of t's inputs in its own group, 1 + the latest phase of its
own group among the ancestors t reaches through another group); the (group, phase) nodes form a
DAG in practice (a path that leaves a group and comes back always lands in a later phase; the
rare cycle left by two independent exchanges between the same groups is broken in node order,
its backward edges charged as traffic, not precedences). A node's cost on
a device is the summed cost of its tasks; node edges are the task edges between nodes, bytes
summed. A node starts when all its inputs are on its device and the device is free.

A group takes its device when its first node is scheduled, scoring each candidate device with
the group's whole work and traffic (the decision is per group, so no single op decides it):
    finish of the node + extra cost of the group's other phases there over their best device
    + transfer times of the group's edges to and from groups already placed (other than the
      node's own inputs, which are in its finish)
(− the m-SCT credit below). Later phases of a placed group just follow it. Mirror inputs of a
placed group are inputs ready at time 0 on its device (and count in the traffic term); a group
without tasks (weights, constants) follows its first consumer (Baechi colocates variables with
their first user), or, if it does not fit there, goes to the allowed device closest to it; a
group nobody reads goes to the fastest device it fits on.

Transfer time of b bytes between devices i != j: latency[i, j] + b / bandwidth[i, j]; a device
sends one transfer at a time and receives one at a time, first come first served (the lowering's
device ports; shared NIC links between hosts are not modelled here). Devices run one group at a
time (start = max(inputs on the device, device free)).

Candidates are the devices where the groups already there plus this one fit in memory (no
freeing, as in Baechi's m-* placers); if none fits, the device with the most free memory,
reported in `Schedule.overflow`. Ties go to the lower device index.

  heft:  among nodes whose predecessors are scheduled, the one with the highest upward rank
         (mean cost over devices + max over successors of mean transfer time + their rank;
         ties: earlier node), on its best-scoring device (earliest finish + group terms).
  m_etf: among those nodes, each on its best-scoring device, the one that starts earliest
         (ETF's rule; ties: higher upward rank, earlier node).
  m_sct: m-ETF with Baechi's favourite-child idea in heuristic form: a node's favourite child
         is its successor in another group over the heaviest edge; if the child's group is not
         placed yet, the favourite parent's device gets a credit equal to the transfer time
         staying saves (that edge's time to the nearest other device), both in the device
         score and in the start used for the selection. Memory-aware like m-ETF.
         (Baechi picks favourites with an LP relaxation; this is the greedy variant.)

The returned `Schedule` has per-task times: a node's tasks run back to back, in task order,
from the node's start; group_start_s / group_finish_s span a group's nodes.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import List, Optional, Tuple

import numpy as np

from tfplace.lowering.graph_index import ROLE_MIRROR
from tfplace.formats.strategy import Strategy

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

    def comm_col_s(self, dst: int, num_bytes: float) -> np.ndarray:
        """[D] transfer time from every device to device dst."""
        out = self.latency[:, dst] + num_bytes / self.bandwidth[:, dst]
        out[dst] = 0.0
        return out

    def mean_comm_s(self, num_bytes: float) -> float:
        """Transfer time of num_bytes averaged over the device pairs (HEFT's mean edge cost)."""
        d = self.num_devices
        if d < 2:
            return 0.0
        off = ~np.eye(d, dtype=bool)
        return float(np.mean(self.latency[off]) + num_bytes * np.mean(1.0 / self.bandwidth[off]))


@dataclasses.dataclass(frozen=True)
class Schedule:
    """task device[T], start_s[T], finish_s[T]; group_device[P]; group_start_s[P],
    group_finish_s[P] (0 for groups without tasks); makespan_s; overflow: groups placed where
    they did not fit."""
    device: np.ndarray
    start_s: np.ndarray
    finish_s: np.ndarray
    group_device: np.ndarray
    makespan_s: float
    overflow: Tuple[int, ...]
    group_start_s: Optional[np.ndarray] = None
    group_finish_s: Optional[np.ndarray] = None


class _GroupView:
    """The instance seen per group and phase (module docstring, "Group view")."""

    def __init__(self, inst: SchedulingInstance):
        self.inst = inst
        p, d, t_count = inst.num_groups, inst.num_devices, inst.num_tasks
        tg = inst.task_group.astype(np.int64)
        self.group_cost = np.zeros((p, d))
        np.add.at(self.group_cost, tg, inst.cost_s)
        task_preds: List[List[Tuple[int, float]]] = [[] for _ in range(t_count)]
        for a, b, nb in zip(np.asarray(inst.edge_src).tolist(), np.asarray(inst.edge_dst).tolist(),
                            np.asarray(inst.edge_bytes).tolist()):
            task_preds[int(b)].append((int(a), float(nb)))
        # Phases: phase(t) = max(phases of same-group inputs, 1 + the latest phase of its own
        # group among the ancestors reached through another group). reach[t, h] = latest phase of
        # group h among t's ancestors (and t itself), -1 if none.
        phase = np.zeros(t_count, dtype=np.int64)
        reach = np.full((t_count, max(p, 1)), -1, dtype=np.int64)
        for t in range(t_count):
            g = int(tg[t])
            ph = 0
            if task_preds[t]:
                srcs = np.array([a for a, _ in task_preds[t]], dtype=np.int64)
                other = tg[srcs] != g
                if (~other).any():
                    ph = int(phase[srcs[~other]].max())
                if other.any():
                    ph = max(ph, int(reach[srcs[other], g].max()) + 1)
                reach[t] = reach[srcs].max(axis=0)
            phase[t] = ph
            reach[t, g] = max(int(reach[t, g]), ph)
        keys = sorted(set(zip(tg.tolist(), phase.tolist())))
        node_id = {k: i for i, k in enumerate(keys)}
        self.num_nodes = n = len(keys)
        self.node_group = np.array([k[0] for k in keys], dtype=np.int64)
        self.task_node = np.array([node_id[k] for k in zip(tg.tolist(), phase.tolist())], dtype=np.int64)
        self.tasks: List[List[int]] = [[] for _ in range(n)]
        for t, v in enumerate(self.task_node.tolist()):
            self.tasks[v].append(t)
        self.cost = np.zeros((n, d))
        np.add.at(self.cost, self.task_node, inst.cost_s)
        pair_bytes = {}
        for t in range(t_count):
            for a, nb in task_preds[t]:
                u, v = int(self.task_node[a]), int(self.task_node[t])
                if u != v:
                    pair_bytes[(u, v)] = pair_bytes.get((u, v), 0.0) + nb
        all_preds: List[List[Tuple[int, float]]] = [[] for _ in range(n)]
        all_succs: List[List[Tuple[int, float]]] = [[] for _ in range(n)]
        for (u, v), nb in sorted(pair_bytes.items()):
            all_preds[v].append((u, nb))
            all_succs[u].append((v, nb))
        # Topological order of the nodes (Kahn), earliest first task first. Two groups exchanging
        # values in both directions along independent paths can still close a cycle of nodes;
        # then the waiting node with the earliest first task goes next, and the edges that point
        # backwards in the order are no precedences: their transfer is charged like traffic
        # (`back`).
        indeg = [len(x) for x in all_preds]
        first = [self.tasks[v][0] for v in range(n)]
        heap = [(first[v], v) for v in range(n) if indeg[v] == 0]
        heapq.heapify(heap)
        self.order: List[int] = []
        queued = np.zeros(n, dtype=bool)
        queued[[v for _, v in heap]] = True
        while len(self.order) < n:
            if not heap:
                v = min((x for x in range(n) if not queued[x]), key=lambda x: first[x])
                heap.append((first[v], v))
                queued[v] = True
            _, v = heapq.heappop(heap)
            self.order.append(v)
            for s, _ in all_succs[v]:
                indeg[s] -= 1
                if indeg[s] == 0 and not queued[s]:
                    queued[s] = True
                    heapq.heappush(heap, (first[s], s))
        self.pos = np.zeros(n, dtype=np.int64)
        self.pos[self.order] = np.arange(n)
        self.preds: List[List[Tuple[int, float]]] = [[] for _ in range(n)]  # forward in the order
        self.succs: List[List[Tuple[int, float]]] = [[] for _ in range(n)]
        self.back: List[List[Tuple[int, float, bool]]] = [[] for _ in range(n)]  # (other, bytes, sends)
        for v in range(n):
            for u, nb in all_preds[v]:
                if self.pos[u] < self.pos[v]:
                    self.preds[v].append((u, nb))
                    self.succs[u].append((v, nb))
                else:
                    self.back[v].append((u, nb, False))
                    self.back[u].append((v, nb, True))
        self.group_nodes: List[List[int]] = [[] for _ in range(p)]
        for v in self.order:
            self.group_nodes[int(self.node_group[v])].append(v)
        # Mirror inputs per (source group, consumer node).
        mirror = {}
        for w, t, nb in zip(np.asarray(inst.mirror_group).tolist(), np.asarray(inst.mirror_task).tolist(),
                            np.asarray(inst.mirror_bytes).tolist()):
            v = int(self.task_node[t])
            if w != int(self.node_group[v]):
                mirror[(w, v)] = mirror.get((w, v), 0.0) + nb
        self.mirror_in: List[List[Tuple[int, float]]] = [[] for _ in range(n)]
        self.mirror_out: List[List[Tuple[int, float]]] = [[] for _ in range(p)]
        for (w, v), nb in sorted(mirror.items()):
            self.mirror_in[v].append((w, nb))
            self.mirror_out[w].append((v, nb))
        self.rank = self._upward_rank()

    def _upward_rank(self) -> np.ndarray:
        mean_cost = self.cost.mean(axis=1)
        rank = mean_cost.copy()
        for v in reversed(self.order):
            if self.succs[v]:
                rank[v] = mean_cost[v] + max(self.inst.mean_comm_s(b) + rank[s] for s, b in self.succs[v])
        return rank

    def favourites(self) -> Tuple[np.ndarray, np.ndarray]:
        """(fav_parent[N], fav_bytes[N]): v's parent node when v is that node's heaviest
        successor in another group (the first such parent in the order), else -1."""
        n = self.num_nodes
        parent, nbytes = np.full(n, -1, dtype=np.int64), np.zeros(n)
        for u in self.order:
            cand = [(s, b) for s, b in self.succs[u] if self.node_group[s] != self.node_group[u]]
            if cand:
                child, b = max(cand, key=lambda x: (x[1], -self.pos[x[0]]))
                if parent[child] < 0 and b > 0:
                    parent[child], nbytes[child] = u, b
        return parent, nbytes


class _State:
    """Placement and timing state shared by the three algorithms."""

    def __init__(self, inst: SchedulingInstance, view: _GroupView):
        self.inst, self.view = inst, view
        p, d = inst.num_groups, inst.num_devices
        self.group_device = np.full(p, -1, dtype=np.int64)
        self.start = np.zeros(view.num_nodes)
        self.finish = np.zeros(view.num_nodes)
        self.done = np.zeros(view.num_nodes, dtype=bool)
        self.avail = np.zeros(d)
        self.out_free = np.zeros(d)  # when each device's outgoing / incoming port is next free
        self.in_free = np.zeros(d)
        self.used = np.zeros(d)
        self.overflow: List[int] = []

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

    def _dev(self, v: int) -> int:
        return int(self.group_device[self.view.node_group[v]])

    def _inputs(self, v: int) -> List[Tuple[int, float, float]]:
        """(source device, earliest send time, bytes) of node v's inputs, by send time: its
        predecessors (all scheduled) and mirror inputs of placed groups (ready at time 0)."""
        out = [(self._dev(q), float(self.finish[q]), b) for q, b in self.view.preds[v]]
        out += [(int(self.group_device[w]), 0.0, b) for w, b in self.view.mirror_in[v] if self.group_device[w] >= 0]
        return sorted(out, key=lambda x: (x[1], x[0]))

    def _receive(self, v: int, d: int, book: bool) -> float:
        """When all of v's inputs are on d, their transfers taking the ports one after another;
        book=True reserves the ports."""
        out_free = self.out_free if book else self.out_free.copy()
        in_free = self.in_free if book else self.in_free.copy()
        ready = 0.0
        for src, at, b in self._inputs(v):
            if src == d:
                ready = max(ready, at)
                continue
            end = max(at, out_free[src], in_free[d]) + self.inst.comm_s(src, d, b)
            out_free[src] = in_free[d] = end
            ready = max(ready, end)
        return ready

    def _group_penalty(self, v: int) -> np.ndarray:
        """[D] what placing v's (unplaced) group on each device adds beyond v's finish: the extra
        work of its other phases over their best device, and the transfers between the group and
        placed groups other than v's own inputs."""
        inst, view = self.inst, self.view
        g = int(view.node_group[v])
        rest = view.group_cost[g] - view.cost[v]
        out = rest - rest.min()
        for m in view.group_nodes[g]:
            for q, b in view.preds[m]:
                e = self._dev(q)
                if m != v and e >= 0 and view.node_group[q] != g:
                    out = out + inst.comm_row_s(e, b)
            for s, b in view.succs[m]:
                e = self._dev(s)
                if e >= 0 and view.node_group[s] != g:
                    out = out + inst.comm_col_s(e, b)
            for q, b, sends in view.back[m]:
                e = self._dev(q)
                if e >= 0 and view.node_group[q] != g:
                    out = out + (inst.comm_col_s(e, b) if sends else inst.comm_row_s(e, b))
        for s, b in view.mirror_out[g]:
            e = self._dev(s)
            if e >= 0:
                out = out + inst.comm_col_s(e, b)
        return out

    def evaluate(self, v: int) -> Tuple[np.ndarray, np.ndarray]:
        """(start[D], score[D]) of node v on every device (score inf where v may not go)."""
        g = int(self.view.node_group[v])
        allowed = self.allowed(g)
        d = self.inst.num_devices
        start = np.array([max(self._receive(v, x, book=False), self.avail[x]) if allowed[x] else np.inf
                          for x in range(d)])
        score = start + self.view.cost[v]
        if self.group_device[g] < 0:
            score = score + self._group_penalty(v)
        return start, np.where(allowed, score, np.inf)

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

    def run_node(self, v: int, d: int) -> None:
        g = int(self.view.node_group[v])
        if self.group_device[g] < 0:
            self.place_group(g, d)
        self.start[v] = max(self._receive(v, d, book=True), self.avail[d])
        self.finish[v] = self.start[v] + self.view.cost[v, d]
        self.avail[d] = self.finish[v]
        self.done[v] = True
        for w, _ in self.view.mirror_in[v]:  # weights without tasks follow their first consumer
            if self.group_device[w] < 0 and not self.view.group_nodes[w]:
                self.place_near(w, d)

    def result(self) -> Schedule:
        inst, view = self.inst, self.view
        order = list(inst.speed_order) if inst.speed_order else list(range(inst.num_devices))
        for g in np.nonzero(self.group_device < 0)[0].tolist():  # groups nobody placed
            allowed = self.allowed(g)
            self.place_group(g, next(d for d in order if allowed[d]))
        t = inst.num_tasks
        device, start, finish = np.zeros(t, dtype=np.int64), np.zeros(t), np.zeros(t)
        for v in view.order:
            d, clock = self._dev(v), float(self.start[v])
            for task in view.tasks[v]:
                device[task], start[task] = d, clock
                clock += float(inst.cost_s[task, d])
                finish[task] = clock
        p = inst.num_groups
        g_start, g_finish = np.zeros(p), np.zeros(p)
        for g in range(p):
            if view.group_nodes[g]:
                g_start[g] = min(self.start[v] for v in view.group_nodes[g])
                g_finish[g] = max(self.finish[v] for v in view.group_nodes[g])
        return Schedule(device, start, finish, self.group_device.copy(), float(self.finish.max(initial=0.0)),
                        tuple(self.overflow), g_start, g_finish)


def _list_schedule(inst: SchedulingInstance, rule: str) -> Schedule:
    """rule: "heft" (highest rank first), "etf" or "sct" (earliest start first)."""
    view = _GroupView(inst)
    st = _State(inst, view)
    fav, fav_bytes = view.favourites() if rule == "sct" else (None, None)
    indeg = np.array([len(view.preds[v]) for v in range(view.num_nodes)], dtype=np.int64)
    ready = [v for v in view.order if indeg[v] == 0]
    while ready:
        best = None
        for v in ready if rule != "heft" else [min(ready, key=lambda x: (-view.rank[x], view.pos[x]))]:
            start, score = st.evaluate(v)
            credit = np.zeros(inst.num_devices)
            if rule == "sct" and fav[v] >= 0 and st.group_device[view.node_group[v]] < 0:
                home = st._dev(int(fav[v]))
                others = np.delete(inst.comm_row_s(home, fav_bytes[v]), home)
                credit[home] = float(others.min()) if len(others) else 0.0
            d = int(np.argmin(score - credit))
            key = (float(start[d] - credit[d]), -float(view.rank[v]), int(view.pos[v]))
            if best is None or key < best[0]:
                best = (key, v, d)
        _, v, d = best
        ready.remove(v)
        st.run_node(v, d)
        for s, _ in view.succs[v]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    return st.result()


def heft_schedule(inst: SchedulingInstance) -> Schedule:
    return _list_schedule(inst, "heft")


def m_etf_schedule(inst: SchedulingInstance) -> Schedule:
    return _list_schedule(inst, "etf")


def m_sct_schedule(inst: SchedulingInstance) -> Schedule:
    return _list_schedule(inst, "sct")


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
