"""Horovod data parallelism for real: the baselines `horovod_even` and `horovod_proportional`.

    result = run_horovod("graph_defs/zoo/tiny_mlp_b16_sgd.json", batch_per_rank=[10, 6],
                         steps=10, warmup_steps=3, emulation_per_rank=[d.emulation for d in cluster.devices],
                         source=cluster.source)
    result.report              # RunReport: step_times_s, device_names, oom (+ mean_s, std_s)
    result.mean_s, result.std_s, result.warmup_steps, result.steps, result.losses
    result.rank_limits         # per rank: the affinity, CPU quota and network the rank found itself under

Runs N ranks of `python -m tfplace.baselines.horovod_worker` on this machine with Horovod's Gloo
controller (what each rank runs, and why the step equals the global-batch step, is in
horovod_worker). The ranks are started here, as `horovodrun --gloo -np N -H localhost:N` would
start them (the same environment variables, Horovod's own rendezvous server), with one
difference: horovodrun's rendezvous HTTP server binds every interface (0.0.0.0, no option to
change it in Horovod 0.28), while here it binds 127.0.0.1; Gloo binds the loopback interface
(HOROVOD_GLOO_IFACE, as horovodrun sets it for local hosts). So nothing of a run listens beyond
loopback, and all of it runs in the run's private network namespace (tfplace.runtime.netns),
where loopback is the only interface. Each rank runs in its own process group; leaving `run_horovod` by any route (success,
error, a rank's failure, timeout, Ctrl-C) terminates every group (SIGTERM, then SIGKILL), so no
rank outlives the call, and a failed rank stops the others at once.

Heterogeneity on one machine: rank i runs under `emulation_per_rank[i]` (a cluster file's
device emulation: pinned cores, CPU quota; tfplace.emulation.tasks), applied before the rank's
interpreter starts, exactly as the local TF server of that device is limited. The rank reads its
limits back from the kernel, refuses to run when they differ from its config, and reports them.
Without emulation, `threads_per_rank` (TF intra-/inter-op threads) is the cruder stand-in.
Where the cluster file's hosts emulate links (`host_links`, tfplace.emulation.links), rank i runs
in its device's host namespace behind that host's shaped NIC, as the TF task of that device does:
the rendezvous server binds the switch address, Gloo binds each host's NIC, and the ranks get the
host assignment (local and cross ranks) horovodrun gives ranks on those hosts.

Batches: `even_batches(B, n)` (remainder to the first ranks) and `proportional_batches(B,
weights)` (tfplace.formats.strategy.proportional_shares, the DP-CP rounding rule).

Step time = wall time of one sess.run of the train op on rank 0 (the all-reduce makes every
rank wait for the slowest, so rank 0's time is the step's); warm-up steps are excluded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tfplace.emulation.tasks import TaskLimits
from tfplace.formats.cluster import Emulation
from tfplace.formats.errors import InputError, TfplaceError
from tfplace.formats.reports import RunReport
from tfplace.formats.strategy import proportional_shares

TERM_GRACE_S = 3.0
POLL_S = 0.1
LOOPBACK = "127.0.0.1"


class HorovodError(TfplaceError, RuntimeError):
    """A Horovod rank failed or the run timed out; the message holds the tail of the rank's log."""


@dataclasses.dataclass(frozen=True)
class HorovodResult:
    """A measured Horovod run. report.step_times_s are rank 0's timed steps."""
    report: RunReport
    warmup_steps: int
    steps: int
    batch_per_rank: Tuple[int, ...]
    threads_per_rank: Optional[Tuple[Tuple[int, int], ...]]
    losses: Tuple[float, ...]
    rank_step_times_s: Tuple[Tuple[float, ...], ...]
    variables_path: str = ""
    rank_limits: Tuple[Dict[str, Any], ...] = ()  # per rank: cpus, cgroup, quota_us, period_us, net_namespace, interfaces

    @property
    def mean_s(self) -> float:
        return self.report.mean_s

    @property
    def std_s(self) -> float:
        return self.report.std_s

    @property
    def step_times_s(self) -> Tuple[float, ...]:
        return self.report.step_times_s

    @property
    def iteration_time_s(self) -> float:
        return self.report.iteration_time_s


def even_batches(global_batch_size: int, num_ranks: int) -> Tuple[int, ...]:
    if num_ranks < 1 or global_batch_size < num_ranks:
        raise InputError("argument", "global_batch_size", f"{global_batch_size} samples for {num_ranks} ranks",
                         "give at least one sample per rank")
    return tuple(proportional_shares([1.0] * num_ranks, global_batch_size))


def proportional_batches(global_batch_size: int, weights: Sequence[float]) -> Tuple[int, ...]:
    shares = proportional_shares(list(weights), global_batch_size)
    if min(shares) < 1:
        raise InputError("argument", "weights", f"a rank gets 0 samples ({shares})",
                         "use a larger global batch or fewer ranks")
    return tuple(shares)


def _terminate(procs: Sequence[subprocess.Popen]) -> None:
    """SIGTERM every rank's process group, SIGKILL what is left after TERM_GRACE_S."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + TERM_GRACE_S
        for p in alive:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


def _loopback_interface() -> str:
    """The network interface that holds 127.0.0.1 (Gloo binds to an interface's address)."""
    from horovod.runner.util.network import get_local_intfs
    found = sorted(get_local_intfs())
    if not found:
        raise InputError("environment", "network", "no interface holds 127.0.0.1",
                         "bring the loopback interface up (ip link set lo up)")
    return found[0]


class _Rendezvous:
    """Horovod's rendezvous HTTP server for n local ranks, bound to `address` only: 127.0.0.1, or
    the switch of the run's emulated hosts (reachable from this run's namespaces alone)."""

    def __init__(self, n: int, host_of_rank: Optional[Sequence[int]] = None, address: str = LOOPBACK,
                 host_names: Sequence[str] = ("localhost",)):
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
        self.address = address
        self.slots = host_slots(list(host_of_rank) if host_of_rank is not None else [0] * n, host_names)
        self.server = RendezvousHTTPServer((address, 0), RendezvousHandler, 0)
        self.server.init(self.slots)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="tfplace-hvd-rendezvous",
                                        daemon=True)
        self._thread.start()

    def rank_env(self, rank: int, iface: str) -> Dict[str, str]:
        """What horovodrun --gloo sets for rank `rank`, with this server's address."""
        from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
        env = create_run_env_vars(self.address, [iface], self.port)
        env.update(create_slot_env_vars(self.slots[rank]))
        return {k: str(v) for k, v in env.items()}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(TERM_GRACE_S)


def host_slots(host_of_rank: Sequence[int], host_names: Sequence[str]) -> list:
    """Horovod's SlotInfo of every rank, rank r on host host_names[host_of_rank[r]]: local
    rank = its order among its host's ranks; cross rank = its host's order among the hosts that
    have that local rank (what horovodrun's host assignment gives, without reordering ranks)."""
    from horovod.runner.common.util.hosts import SlotInfo
    n = len(host_of_rank)
    local_rank, local_size = [0] * n, {}
    for r, h in enumerate(host_of_rank):
        local_rank[r] = local_size.get(h, 0)
        local_size[h] = local_rank[r] + 1
    hosts_at: Dict[int, List[int]] = {}  # local rank -> hosts having it, in order of first rank
    for r, h in enumerate(host_of_rank):
        hosts_at.setdefault(local_rank[r], []).append(h)
    return [SlotInfo(hostname=host_names[h], rank=r, local_rank=local_rank[r], cross_rank=hosts_at[local_rank[r]].index(h),
                     size=n, local_size=local_size[h], cross_size=len(hosts_at[local_rank[r]]))
            for r, h in enumerate(host_of_rank)]


def _check_args(bundle, batch_per_rank, steps, warmup_steps, threads_per_rank, emulation_per_rank, source):
    n = len(batch_per_rank)
    if n < 1 or any(int(b) < 1 for b in batch_per_rank):
        raise InputError("argument", "batch_per_rank", f"got {list(batch_per_rank)}", "give every rank >= 1 sample")
    if steps < 1 or warmup_steps < 0:
        raise InputError("argument", "steps", f"steps={steps}, warmup_steps={warmup_steps}",
                         "use steps >= 1 and warmup_steps >= 0")
    if threads_per_rank is not None and len(threads_per_rank) != n:
        raise InputError("argument", "threads_per_rank", f"{len(threads_per_rank)} entries for {n} ranks",
                         "give one (intra, inter) pair per rank")
    if emulation_per_rank is not None and len(emulation_per_rank) != n:
        raise InputError(source, "devices", f"{len(emulation_per_rank)} devices' emulation for {n} ranks",
                         "run one Horovod rank per device of the cluster")
    if not os.path.exists(bundle):
        raise InputError(bundle, "", "bundle not found", "give a bundle .json (graph_defs/zoo/...)")


def run_horovod(bundle: str, batch_per_rank: Sequence[int], steps: int = 10, warmup_steps: int = 3,
                threads_per_rank: Optional[Sequence[Tuple[int, int]]] = None, seed: int = 0,
                timeout_s: float = 600.0, out_dir: Optional[str] = None, dump_variables: bool = False,
                device_names: Optional[Sequence[str]] = None, sample_weighted: bool = True,
                emulation_per_rank: Optional[Sequence[Optional[Emulation]]] = None,
                source: str = "cluster", host_links=None) -> HorovodResult:
    """Runs the bundle's training step with Horovod on len(batch_per_rank) local ranks.

    out_dir: where the config, logs and rank results go (default: a temporary folder, removed
    unless dump_variables). dump_variables: rank 0 writes variables.npz after the last step.
    sample_weighted=False averages gradients unweighted (only for tests: wrong for uneven batches).
    emulation_per_rank: rank i's pinned cores and CPU quota (a cluster file's device i); errors
    about it name `source` (the cluster file) and are raised before any rank starts.
    host_links: rank i's emulated host (tfplace.emulation.links.HostLayout with one process per
    rank, `host_layout(cluster, per="device")`), or None: every rank on loopback.
    """
    _check_args(bundle, batch_per_rank, steps, warmup_steps, threads_per_rank, emulation_per_rank, source)
    n = len(batch_per_rank)
    if host_links is not None and len(host_links.host_of_process) != n:
        raise InputError(host_links.source, "devices", f"{len(host_links.host_of_process)} devices on emulated "
                         f"hosts for {n} ranks", "run one Horovod rank per device of the cluster")
    emulations = list(emulation_per_rank) if emulation_per_rank is not None else [None] * n
    own_dir = out_dir is None
    work = tempfile.mkdtemp(prefix="tfplace_hvd_") if own_dir else out_dir
    os.makedirs(work, exist_ok=True)
    config = {"bundle": os.path.abspath(bundle), "batch_per_rank": [int(b) for b in batch_per_rank],
              "steps": int(steps), "warmup_steps": int(warmup_steps), "seed": int(seed), "out_dir": work,
              "threads_per_rank": [list(t) for t in threads_per_rank] if threads_per_rank else None,
              "emulation_per_rank": [None if e is None else e.to_json() for e in emulations],
              "dump_variables": bool(dump_variables), "sample_weighted": bool(sample_weighted),
              # the ranks end, and remove a folder of ours, when this process is killed outright
              "parent_pid": os.getpid(), "orphan_cleanup_dir": work if own_dir and not dump_variables else ""}
    cfg_path = os.path.join(work, "horovod_config.json")
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    cmd = [sys.executable, "-m", "tfplace.baselines.horovod_worker", "--config", cfg_path]
    from tfplace.runtime.netns import ensure_private_network
    ensure_private_network("Horovod's rendezvous and Gloo")  # its ranks (and emulated hosts) live in it
    try:
        with TaskLimits(emulations, source, name="hvd-rank") as limits, _networks(host_links) as networks:
            _run_ranks(cmd, n, work, limits, timeout_s, networks)
        return _collect(work, n, device_names, dump_variables)
    finally:
        if own_dir and not dump_variables:
            shutil.rmtree(work, ignore_errors=True)


def _networks(layout):
    """The emulated hosts of `layout` (a context manager), or a no-op without one."""
    import contextlib
    from tfplace.emulation.links import HostNetworks
    return contextlib.nullcontext() if layout is None else HostNetworks(layout)


def _run_ranks(cmd: List[str], n: int, work: str, limits: TaskLimits, timeout_s: float, networks=None) -> None:
    """Starts the n ranks (each in its own process group, under its limits, in its host's
    namespace when `networks` emulates hosts) and waits for all; raises HorovodError on the first
    failed rank or at the timeout. Every rank is gone on return."""
    from tfplace.emulation.links import chain
    base = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"), PYTHONUNBUFFERED="1")
    if networks is None:
        iface, rendezvous = _loopback_interface(), _Rendezvous(n)
    else:
        iface = networks.interface
        layout = networks.layout
        rendezvous = _Rendezvous(n, layout.host_of_process, networks.switch_address, layout.hosts)
    procs: List[subprocess.Popen] = []
    try:
        for rank in range(n):
            with open(_log_path(work, rank), "w", encoding="utf-8") as log:
                enter_host = None if networks is None else networks.preexec(rank)
                procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                              env=dict(base, **rendezvous.rank_env(rank, iface)),
                                              start_new_session=True, preexec_fn=chain(limits.preexec(rank), enter_host)))
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None:
                raise HorovodError(f"rank {failed} exited with status {codes[failed]}\n"
                                   f"{_tail(_log_path(work, failed))}")
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                raise HorovodError(f"the Horovod ranks did not finish in {timeout_s:.0f} s\n"
                                   f"{_tail(_log_path(work, 0))}")
            time.sleep(POLL_S)
    finally:
        _terminate(procs)
        rendezvous.close()


def _log_path(work: str, rank: int) -> str:
    return os.path.join(work, f"rank_{rank}.log")


def _tail(path: str, lines: int = 25) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        kept = [ln for ln in f.read().splitlines() if "oneDNN" not in ln and "cpu_feature_guard" not in ln]
    return "\n".join(kept[-lines:])


def _collect(work: str, n: int, device_names, dump_variables: bool) -> HorovodResult:
    ranks = []
    for r in range(n):
        path = os.path.join(work, f"rank_{r}.json")
        if not os.path.exists(path):
            raise HorovodError(f"rank {r} wrote no result\n{_tail(_log_path(work, r))}")
        with open(path, encoding="utf-8") as f:
            ranks.append(json.load(f))
    r0 = ranks[0]
    names = tuple(device_names) if device_names else tuple(f"rank{r}" for r in range(n))
    report = RunReport(step_times_s=tuple(r0["step_times_s"]), device_names=names)
    threads = tuple(tuple(r["threads"]) for r in ranks) if r0["threads"] else None
    return HorovodResult(report=report, warmup_steps=r0["warmup_steps"], steps=r0["steps"],
                         batch_per_rank=tuple(r0["batch_per_rank"]), threads_per_rank=threads,
                         losses=tuple(r0["losses"]), rank_step_times_s=tuple(tuple(r["step_times_s"]) for r in ranks),
                         variables_path=os.path.join(work, "variables.npz") if dump_variables else "",
                         rank_limits=tuple(r["limits"] for r in ranks))

