"""Costs the lowering attaches to tasks: op seconds from the profile (vectorised), link paths
and transfer times, collective (ring all-reduce) times, and the memory-bandwidth cost of the
auxiliary split / concat / sum tasks.

Links: the cluster's links [0, L), then one out-port per device [L, L+D) and one in-port per
device [L+D, L+2D). Ports model that a device has one PCIe/NVLink attachment: every transfer
that leaves device i also occupies port_out[i], every transfer into j occupies port_in[j] (so PS
traffic funnels into the PS device even when the cluster gives each device pair its own link).
A port's bandwidth is the best path bandwidth of that device, so one transfer alone is never
slowed by its ports. With `device_ports=False` the ports are left out of every path.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tfplace.formats.cluster import Cluster, is_cpu_kind
from tfplace.profiling.device_model import device_spec
from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import FieldReader
from tfplace.ir.graph_ir import OpGraph
from tfplace.formats.profile import Profile, graph_name


class ComputeCosts:
    """Profile seconds for (op, device, per-device batch) arrays, vectorised over instances.

    Per device kind k: bat[k][N, P] and sec[k][N, P] (measured points, padded), npts[k][N]
    (0 = no entry). An op without an entry costs `missing_op_s` when the profile lists it in
    `missing_ops` (the profiler saw no kernel for it); any other gap raises InputError when an
    instance of that op lands on a device of that kind.
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, profile: Profile, missing_op_s: float):
        self.kinds = cluster.kinds
        kind_index = {k: i for i, k in enumerate(self.kinds)}
        self.dev_kind = np.array([kind_index[d.kind] for d in cluster.devices], dtype=np.int64)
        self.names = graph.names
        self.source = profile.source or "profile"
        self.graph_source, self.profile = graph.source, profile
        self.missing_op_s = float(missing_op_s)
        listed_missing = set(profile.missing_ops)
        clone_of = graph.meta.get("tfplace_clone_of", {})  # metadata clones cost as their original
        self.clone_of = clone_of
        listed_missing |= {c for c, o in clone_of.items() if o in listed_missing}
        n = graph.num_ops
        self.bat, self.sec, self.npts, self.ok = [], [], [], []
        for kind in self.kinds:
            rows = [profile.ops.get(clone_of.get(name, name), {}).get(kind) for name in graph.names]
            width = max([len(r[0]) for r in rows if r is not None] + [1])
            bat = np.full((n, width), np.inf)
            sec = np.zeros((n, width))
            npts = np.zeros(n, dtype=np.int64)
            for i, r in enumerate(rows):
                if r is not None:
                    bat[i, :len(r[0])] = r[0]
                    sec[i, :len(r[1])] = r[1]
                    npts[i] = len(r[0])
            ok = (npts > 0) | np.array([name in listed_missing for name in graph.names], dtype=bool)
            self.bat.append(bat), self.sec.append(sec), self.npts.append(npts), self.ok.append(ok)

    def seconds(self, op: np.ndarray, dev: np.ndarray, batch: np.ndarray) -> np.ndarray:
        """Seconds of op[i] on device dev[i] at per-device batch batch[i] (float64 [len(op)])."""
        out = np.zeros(len(op))
        kind = self.dev_kind[dev]
        for k in range(len(self.kinds)):
            sel = np.nonzero(kind == k)[0]
            if len(sel):
                out[sel] = self._lookup(k, op[sel], batch[sel].astype(np.float64))
        return out

    def column(self, kind: int, batch: int, clamp: bool = False) -> np.ndarray:
        """Seconds of every op on `kind` at per-device `batch` (float64 [N]); NaN where the
        profile has no entry (callers raise with `check` when such an op is placed).

        clamp: look up at the measured batch nearest to `batch` instead of extrapolating; used
        for instances that do not split the batch (their cost does not depend on it, so a
        measured point is a better estimate than a line extended beyond the measurements)."""
        n = len(self.names)
        x = np.full(n, float(batch))
        if clamp:
            npts = self.npts[kind]
            last = self.bat[kind][np.arange(n), np.maximum(npts - 1, 0)]
            x = np.where(npts > 1, np.clip(x, self.bat[kind][:, 0], np.where(npts > 0, last, x)), x)
        col = _interpolate(self.bat[kind], self.sec[kind], self.npts[kind], x, self.missing_op_s)
        col[~self.ok[kind]] = np.nan
        return col

    def check(self, seconds: np.ndarray, op: np.ndarray, dev: np.ndarray) -> None:
        """Raises InputError for the first NaN (an op the profile lacks on that device kind)."""
        bad = np.isnan(seconds)
        if bad.any():
            i = int(np.argmax(bad))
            kind = self.kinds[int(self.dev_kind[dev[i]])]
            name = self.names[int(op[i])]
            name = self.clone_of.get(name, name)  # a metadata clone's gap is its original's
            self._check_graph(name)
            raise self.profile.missing_op_error(name, kind)

    def _check_graph(self, missing_op: str) -> None:
        """Raises InputError when the profile was measured on another graph (by name,
        tfplace.formats.profile.graph_name) and lacks `missing_op` on every kind: a gap of a
        profile of this graph is a kind to measure, but another graph's is the wrong file. A
        renamed bundle or a bare step may be named otherwise and still be this graph, so a
        name alone never refuses."""
        measured = self.profile.graph
        applied = graph_name(self.graph_source) if self.graph_source else ""
        if not measured or not applied or measured == applied or missing_op in self.profile.ops:
            return
        raise InputError(self.source, "graph", f"the profile was measured on graph {measured!r}, not {applied!r} "
                         f"(it has no op {missing_op!r} of it)",
                         f"give a profile measured on {applied} (python -m tfplace.profile --graph "
                         f"{self.graph_source} --out P), or none: the device model's")

    def _lookup(self, k: int, o: np.ndarray, x: np.ndarray) -> np.ndarray:
        y = _interpolate(self.bat[k][o], self.sec[k][o], self.npts[k][o], x, self.missing_op_s)
        y[~self.ok[k][o]] = np.nan
        return y


def _interpolate(b: np.ndarray, s: np.ndarray, n: np.ndarray, x: np.ndarray, missing_s: float) -> np.ndarray:
    """Row-wise `tfplace.formats.profile.interpolate_seconds` (same formula, same extrapolation)."""
    rows = np.arange(len(x))
    cnt = (b <= x[:, None]).sum(axis=1)  # padding is +inf, never counted
    i = np.clip(cnt - 1, 0, np.maximum(n - 2, 0))
    j = np.minimum(i + 1, np.maximum(n - 1, 0))
    b0, b1, s0, s1 = b[rows, i], b[rows, j], s[rows, i], s[rows, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = (s1 - s0) / (b1 - b0)
        y = np.maximum(slope * (x - b0) + s0, 0.0)
        y = np.where(n == 1, s0 * x / b0, y)
    last = b[rows, np.maximum(n - 1, 0)]
    y = np.where((n >= 2) & (x == last), s[rows, np.maximum(n - 1, 0)], y)
    return np.where(n == 0, missing_s, y)


class LinkCosts:
    """Paths with ports, transfer times, and collective (ring) groups.

    Arrays: link_bw[L'], link_lat[L'], link_names[L']; pair_ptr[D*D+1], pair_links (CSR over
    ordered device pairs i*D+j), pair_bw[D, D] (bottleneck, inf on the diagonal), pair_lat[D, D].
    Collective groups (memoised by ring-ordered participants): coll_parts[c], coll_links[c]
    (distinct links used by the ring's hops), coll_bw[c] (min over links of bandwidth / number of
    hops using the link), coll_lat[c] (slowest hop latency), coll_steps[c] (latency steps).
    """

    def __init__(self, cluster: Cluster, profile: Optional[Profile], device_ports: bool):
        d = cluster.num_devices
        base = len(cluster.link_names)
        self.num_devices = d
        bw = [float(x) for x in cluster.link_bandwidth_bytes_per_s]
        lat = [float(x) for x in cluster.link_latency_s]
        names = list(cluster.link_names)
        out_bw = [max([cluster.path_bandwidth_bytes_per_s(i, j) for j in range(d) if j != i] + [1.0]) for i in range(d)]
        in_bw = [max([cluster.path_bandwidth_bytes_per_s(i, j) for i in range(d) if i != j] + [1.0]) for j in range(d)]
        if device_ports:
            bw += out_bw + in_bw
            lat += [0.0] * (2 * d)
            names += [f"{x.name}/port_out" for x in cluster.devices] + [f"{x.name}/port_in" for x in cluster.devices]
        self.link_bw, self.link_lat, self.link_names = np.array(bw), np.array(lat), tuple(names)
        self.pair_bw = np.full((d, d), np.inf)
        self.pair_lat = np.zeros((d, d))
        pair_links: List[Tuple[int, ...]] = []
        for i in range(d):
            for j in range(d):
                links: Tuple[int, ...] = ()
                if i != j:
                    links = tuple(cluster.paths[i][j])
                    if device_ports:
                        links = (base + i,) + links + (base + d + j,)
                    self.pair_bw[i, j] = min(bw[x] for x in links)
                    self.pair_lat[i, j] = sum(lat[x] for x in links)
                pair_links.append(links)
        self.pair_links = pair_links
        self.pair_ptr = np.concatenate([[0], np.cumsum([len(p) for p in pair_links])]).astype(np.int64)
        self.pair_idx = np.array([x for p in pair_links for x in p], dtype=np.int64)
        host_index = {h.name: k for k, h in enumerate(cluster.hosts)}
        self.ring_key = [(host_index[x.host], i) for i, x in enumerate(cluster.devices)]
        self.host = [host_index[x.host] for x in cluster.devices]
        self.task = [x.task for x in cluster.devices]  # TF task of each device (build_cluster fills it in)
        self.is_cpu = [is_cpu_kind(x.kind) for x in cluster.devices]
        fits = profile.comm.allreduce if (profile is not None and profile.comm is not None) else {}
        self.fits = {int(k): (float(v.latency_s), float(v.bandwidth_bytes_per_s)) for k, v in fits.items()}
        self._coll: Dict[Tuple[int, ...], int] = {}
        self.coll_parts: List[Tuple[int, ...]] = []
        self.coll_links: List[Tuple[int, ...]] = []
        self.coll_bw: List[float] = []
        self.coll_lat: List[float] = []
        self.coll_steps: List[float] = []
        self._coll_table: Optional[Tuple[np.ndarray, ...]] = None  # collective_table's arrays

    def ring_order(self, devices: Sequence[int]) -> Tuple[int, ...]:
        """Participants in ring order: by host, then device index (NCCL keeps hosts contiguous)."""
        return tuple(sorted(set(devices), key=lambda x: self.ring_key[x]))

    def collective(self, devices: Sequence[int]) -> int:
        """Id of the collective group over `devices` (ring-ordered), created on first use."""
        parts = self.ring_order(devices)
        cid = self._coll.get(parts)
        if cid is None:
            cid = self._coll[parts] = len(self.coll_parts)
            count: Dict[int, int] = {}
            for k, a in enumerate(parts):
                b = parts[(k + 1) % len(parts)]
                for x in self.pair_links[a * self.num_devices + b]:
                    count[x] = count.get(x, 0) + 1
            hops = [(a, parts[(k + 1) % len(parts)]) for k, a in enumerate(parts)]
            self.coll_parts.append(parts)
            self.coll_links.append(tuple(sorted(count)))
            self.coll_bw.append(min(self.link_bw[x] / c for x, c in count.items()))
            self.coll_lat.append(max(self.pair_lat[a, b] for a, b in hops))
            # latency steps: a ring's 2(n-1); the rewrite's exchange among CPU devices
            # (tfplace.ir.node_defs.exchange_all_reduce) sends each round's messages at once
            n = len(parts)
            self.coll_steps.append(2.0 if all(self.is_cpu[x] for x in parts) else 2.0 * (n - 1))
        return cid

    def collective_table(self) -> Tuple[np.ndarray, ...]:
        """The collective groups made so far as arrays: (participants [C] float, coll_bw [C],
        coll_lat [C], coll_steps [C], link_ptr [C+1], link_idx, part_ptr [C+1], part_idx), the
        last four CSR over coll_links and coll_parts. Rebuilt only when groups were added: the
        lowering asks thousands of times in a search while the set of groups barely grows."""
        if self._coll_table is None or len(self._coll_table[0]) != len(self.coll_parts):
            def csr(lists):
                ptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
                return ptr, np.array([v for x in lists for v in x], dtype=np.int64)
            self._coll_table = (np.array([len(p) for p in self.coll_parts], dtype=np.float64),
                                np.array(self.coll_bw, dtype=np.float64), np.array(self.coll_lat, dtype=np.float64),
                                np.array(self.coll_steps, dtype=np.float64)) \
                + csr(self.coll_links) + csr(self.coll_parts)
        return self._coll_table

    def collective_seconds(self, cid: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """All-reduce time 2(n-1)/n * S / B_eff + steps * latency per collective (steps: 2(n-1)
        for a ring, 2 for the exchange among CPU devices; the bytes each participant sends are
        the same), or the profile's fitted `latency + S / bandwidth` for that group size when it
        has one."""
        n, bw, lat, steps = (col[cid] for col in self.collective_table()[:4])
        out = 2.0 * (n - 1.0) / n * nbytes / bw + steps * lat
        for size, (f_lat, f_bw) in self.fits.items():
            sel = n == size
            out[sel] = f_lat + nbytes[sel] / f_bw
        return out


def memory_bandwidth(cluster: Cluster, table: Optional[Mapping[str, float]], default: float,
                     profile: Optional[Profile] = None) -> np.ndarray:
    """Bytes/s a copy kernel reaches in each device's memory.

    table None: the device model's datasheet table (tfplace.profiling.device_model: peak bandwidth times
    its streaming efficiency). A CPU kind the table does not know ("CPU_<label>", a CPU of
    another speed, e.g. a local-cluster task under a CPU quota) gets the CPU's figure times the
    share of a core its profile kind may use (cpu_fractions below; 1 without one):
    a copy under a 0.5 quota takes twice the wall, as its kernels do. Other unknown kinds get
    `default`. A given table maps kind -> bytes/s, with `default` for the kinds it lacks."""
    out = []
    for d in cluster.devices:
        if table is not None:
            out.append(float(table.get(d.kind, default)))
            continue
        try:
            spec = device_spec(d.kind)
            out.append(spec.memory_bandwidth_bytes_per_s * spec.memory_efficiency)
        except InputError:
            if not is_cpu_kind(d.kind):
                out.append(float(default))
                continue
            spec = device_spec("CPU")
            share = float(cpu_fractions(profile, [d.kind])[0])
            out.append(spec.memory_bandwidth_bytes_per_s * spec.memory_efficiency * share)
    return np.array(out)


def cpu_fractions(profile, kinds: Sequence[str]) -> np.ndarray:
    """Per device kind in `kinds`, the CPU fraction of its profile kind's quota: the effective
    one where the profile measured it, else the quota's (1.0 when the profile records none)."""
    by_kind = ((getattr(profile, "conditions", None) or {}).get("by_kind") or {}) if profile is not None else {}
    out = np.ones(len(kinds))
    for i, kind in enumerate(kinds):
        emulation = (by_kind.get(kind) or {}).get("emulation") or {}
        key = "effective_cpu_fraction" if "effective_cpu_fraction" in emulation else "cpu_fraction"
        if emulation.get(key) is not None:
            out[i] = FieldReader(emulation, "profile conditions", f"by_kind.{kind}.emulation").get(
                key, float, check=lambda v: v > 0, must="be > 0",
                fix="profile the kind again with `python -m tfplace.profile --cpu-fraction F`")
    return out
