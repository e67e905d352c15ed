"""A TensorFlow cluster of N server processes on this machine, as a context manager.

    with LocalCluster(num_tasks=3, threads_per_task=[2, 1, 1]) as lc:
        with lc.session(graph=g) as sess:          # a tf.compat.v1.Session on lc.target
            lc.run(sess, train_op)                 # like sess.run, but a dead worker raises
        lc.task_addresses   # ("127.0.0.1:40123", ...), task order
        lc.device_names     # ("/job:worker/replica:0/task:0/device:CPU:0", ...), one per task

Every task is a subprocess `python -m tfplace.runtime.worker` (see worker.py) in its own process group,
serving `tf.distribute.Server` on 127.0.0.1 with a port chosen by binding port 0. The client
(this process) holds no server: it connects to task 0's master through `target`. TensorFlow's
server binds every interface whatever its address says, so `start()` first moves this process
into a private network namespace whose only interface is loopback (tfplace.runtime.netns; it
refuses, with the fix, once this process already runs gRPC threads outside one).

Shutdown: leaving the `with` block (normally, on an exception, on Ctrl-C or on SIGTERM, which
`start()` turns into an exception when the process has the default handler: tfplace.runtime.signals), `close()`, or the
interpreter exiting terminates every process group (SIGTERM, then SIGKILL after
`TERM_GRACE_S`); if this process is killed outright, each worker notices its launcher is gone
and exits within `worker.PARENT_POLL_S`. So no server outlives its cluster.

Failures: a worker that dies while starting, or while `run` waits on a step, raises
`WorkerDiedError` naming the task, its exit status and the tail of its log, within
`POLL_S` of the death; TensorFlow alone would retry the gRPC channel for minutes.

Heterogeneity on one machine is emulated by per-task CPU affinity (`cpus_per_task`), CPU
bandwidth quotas (`cpu_fraction_per_task`, tfplace.emulation.cpu_quota) and thread limits
(`threads_per_task`), so a profile taken with the same limits (`python -m tfplace.profile
--cpus ... --cpu-fraction ...`) describes what the simulator should expect of that task.
A cluster file declares the first two per device (its `emulation`):

    with LocalCluster.for_cluster(load_cluster("clusters/local_cpu_hetero.json")) as lc: ...

refuses a cluster whose hosts are not loopback (`require_loopback`) and checks the cores and
the quotas before any task starts (tfplace.emulation.tasks); every cgroup is created before the
first task, so a refused quota leaves nothing started. Where the file's hosts declare emulated
links (`host_links`, tfplace.emulation.links), each task runs in its host's network namespace
behind that host's shaped NIC and serves at the host's address; the namespaces are made before
the first task and removed on close.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tfplace.formats.errors import InputError, TfplaceError
from tfplace.runtime.worker import PORT_IN_USE_EXIT, READY_PREFIX

POLL_S = 0.1
TERM_GRACE_S = 3.0
CLOSE_TIMEOUT_S = 2.0
START_TIMEOUT_S = 120.0
PORT_RETRIES = 3
LOG_TAIL_LINES = 12

_LIVE: "weakref.WeakSet[LocalCluster]" = weakref.WeakSet()


class WorkerDiedError(TfplaceError, RuntimeError):
    """A task of a local cluster exited (crashed, was killed, or failed to start)."""

    def __init__(self, task: int, address: str, pid: int, returncode: Optional[int], log_tail: str,
                 during: str):
        self.task, self.address, self.pid, self.returncode = task, address, pid, returncode
        if returncode is None:
            status = "did not become ready in time"
        elif returncode < 0:
            try:
                status = f"was killed by {signal.Signals(-returncode).name}"
            except ValueError:
                status = f"was killed by signal {-returncode}"
        else:
            status = f"exited with status {returncode}"
        tail = "\n    ".join(log_tail.strip().splitlines()[-LOG_TAIL_LINES:]) or "(empty log)"
        super().__init__(
            f"worker task {task} ({address}, pid {pid}) {status} {during}.\n  last log lines:\n    {tail}\n"
            "  Fix: check the log above (out of memory, port in use, import error); the cluster has been "
            "shut down, start a new one.")


def _free_ports(host: str, count: int) -> List[int]:
    """Distinct ports that were free a moment ago (all sockets held open until all are chosen)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _check_per_task(name: str, values: Optional[Sequence[Any]], n: int) -> List[Any]:
    if values is None:
        return [None] * n
    values = list(values)
    if len(values) != n:
        raise InputError("LocalCluster", name, f"has {len(values)} entries for {n} tasks",
                         "give one entry per task (or None for all)")
    return values


def require_loopback(cluster, source: str = "") -> None:
    """Raises InputError naming the cluster file and `hosts[i].address` when a host of `cluster`
    is not this machine's loopback: such a cluster runs on its own hosts, never silently here."""
    for i, host in enumerate(cluster.hosts):
        if not host.is_loopback:
            raise InputError(source or cluster.source or cluster.name, f"hosts[{i}].address",
                             f"{host.address!r} is not this machine's loopback; a local cluster would not run there",
                             "start the TF servers on those hosts, or use a cluster file whose hosts are 127.0.0.1 "
                             "(e.g. clusters/local_cpu.json)")


def require_devices_here(cluster, source: str = "", gpus_here: Optional[int] = None) -> None:
    """Raises InputError naming the cluster file and `devices[i]` when a device of `cluster` is
    not one a local TF task has: each task (one server process on this machine) has one CPU,
    CPU:0, and sees this machine's GPUs (`gpus_here`, default: those TensorFlow finds; none on a
    CPU-only build). A GPU-kind device where there is none, or a second CPU device in one task,
    would fail only once the servers run a step."""
    from tfplace.formats.cluster import is_cpu_kind
    source = source or cluster.source or cluster.name
    for i, d in enumerate(cluster.devices):
        ordinal = int(d.tf_device.rsplit(":", 1)[1])
        if is_cpu_kind(d.kind):
            if ordinal:
                first = next(e.name for e in cluster.devices if e.task == d.task and is_cpu_kind(e.kind))
                raise InputError(source, f"devices[{i}].task", f"{d.name} is a second CPU device of task {d.task} "
                                 f"(after {first}); a local TF task has one CPU",
                                 "give each CPU device its own task (its own host, or \"task\": k)")
            continue
        if gpus_here is None:
            import tensorflow as tf
            gpus_here = len(tf.config.list_physical_devices("GPU"))
        if ordinal >= gpus_here:
            raise InputError(source, f"devices[{i}].kind", f"{d.kind!r} is a GPU kind, run as GPU:{ordinal} of task "
                             f"{d.task}, but this machine has {gpus_here} GPU{'s' if gpus_here != 1 else ''} for TF",
                             "run it on a machine with those GPUs, or emulate the cluster with CPU kinds "
                             "(e.g. clusters/local_cpu_hetero.json)")


class _StepResult:
    """What one submitted call returned or raised; `done` is set when it has."""

    def __init__(self):
        self.done = threading.Event()
        self.value: Any = None
        self.error: Optional[BaseException] = None


class _Stepper:
    """A daemon thread that runs submitted calls one at a time (LocalCluster.run's steps), so
    that the calling thread is free to watch the workers while a step runs."""

    def __init__(self):
        self._calls: "queue.SimpleQueue" = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="tfplace-step", daemon=True).start()

    def submit(self, call) -> _StepResult:
        result = _StepResult()
        self._calls.put((call, result))
        return result

    def stop(self) -> None:
        """Ends the thread after its current call."""
        self._calls.put(None)

    def _loop(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            call, result = item
            try:
                result.value = call()
            except BaseException as e:  # handed to the waiting thread by LocalCluster.run
                result.error = e
            result.done.set()


class LocalCluster:
    """N `tf.distribute.Server` processes on one host. See the module docstring.

    Args:
      num_tasks: number of server processes (tasks of job `job_name`), >= 1.
      threads_per_task: intra-op thread count per task (None or 0 = TF's default).
      inter_threads_per_task: inter-op thread count per task (None or 0 = TF's default).
      cpus_per_task: CPU ids each task is pinned to (None = no pinning).
      cpu_fraction_per_task: share of one CPU each task may use (cgroup CPU bandwidth, see
        tfplace.emulation.cpu_quota; None = unlimited). Needs writable cgroups (root).
      env_per_task: extra environment variables per task (e.g. CUDA_VISIBLE_DEVICES).
      job_name: TF job name of every task.
      host: address to bind; loopback unless you mean to serve other hosts.
      collective_leader: set `experimental.collective_group_leader` to task 0 on every server and
        on sessions from `session()` (needed by CollectiveReduceV2 in a compat.v1 graph).
      start_timeout_s: how long a task may take to import TensorFlow and listen.
      log_dir: where task logs go (default: a temporary folder removed on close).
      host_links: the emulated host of every task (tfplace.emulation.links.HostLayout, one process
        per task), or None: every task on this process's loopback.
    """

    def __init__(self, num_tasks: int = 2, threads_per_task: Optional[Sequence[Optional[int]]] = None,
                 inter_threads_per_task: Optional[Sequence[Optional[int]]] = None,
                 cpus_per_task: Optional[Sequence[Optional[Sequence[int]]]] = None,
                 cpu_fraction_per_task: Optional[Sequence[Optional[float]]] = None,
                 env_per_task: Optional[Sequence[Optional[Mapping[str, str]]]] = None,
                 job_name: str = "worker", host: str = "127.0.0.1", collective_leader: bool = True,
                 start_timeout_s: float = START_TIMEOUT_S, log_dir: Optional[str] = None,
                 host_links=None):
        if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1:
            raise InputError("LocalCluster", "num_tasks", f"must be an integer >= 1, got {num_tasks!r}",
                             "ask for at least one task")
        self.num_tasks = num_tasks
        self.threads = _check_per_task("threads_per_task", threads_per_task, num_tasks)
        self.inter_threads = _check_per_task("inter_threads_per_task", inter_threads_per_task, num_tasks)
        self.cpus = _check_per_task("cpus_per_task", cpus_per_task, num_tasks)
        self.cpu_fractions = _check_per_task("cpu_fraction_per_task", cpu_fraction_per_task, num_tasks)
        for i, v in enumerate(self.cpu_fractions):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 64):
                raise InputError("LocalCluster", f"cpu_fraction_per_task[{i}]", f"must be a number in (0, 64], got {v!r}",
                                 "give the share of one CPU the task may use (0.5 = half a core), or None")
        if host_links is not None and len(host_links.host_of_process) != num_tasks:
            raise InputError("LocalCluster", "host_links", f"places {len(host_links.host_of_process)} tasks, "
                             f"not {num_tasks}", "give a layout with one process per task (links.host_layout)")
        self.host_links = host_links
        self._networks = None  # tfplace.emulation.links.HostNetworks while started
        self._limits = None  # tfplace.emulation.tasks.TaskLimits while started
        self.source = ""  # the cluster file, for `for_cluster`; named by errors of its emulation
        self._emulation_field = "tasks"
        self.envs = _check_per_task("env_per_task", env_per_task, num_tasks)
        for field, values in (("threads_per_task", self.threads), ("inter_threads_per_task", self.inter_threads)):
            for i, v in enumerate(values):
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                    raise InputError("LocalCluster", f"{field}[{i}]", f"must be an integer >= 0, got {v!r}",
                                     "give a thread count, or 0/None for TensorFlow's default")
        self.job_name = job_name
        self.host = host
        self.collective_leader = collective_leader
        self.start_timeout_s = start_timeout_s
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir
        self._procs: List[subprocess.Popen] = []
        self._logs: List[str] = []
        self._addresses: Tuple[str, ...] = ()
        self._closed = False
        self._steppers: List[_Stepper] = []  # idle step threads, reused from step to step
        self._stepper_lock = threading.Lock()

    @classmethod
    def for_cluster(cls, cluster, **kwargs) -> "LocalCluster":
        """A LocalCluster of `cluster`'s tasks (a tfplace.formats.cluster.Cluster whose hosts are
        all loopback), each pinned and limited as its device's `emulation` says. kwargs: the other
        constructor arguments (threads, env, ...). Raises InputError naming the cluster file and
        the field, before anything starts, for a non-loopback host, a device a local task does not
        have (require_devices_here), a core this machine lacks or a CPU quota that cannot be set
        here."""
        from tfplace.emulation import links
        from tfplace.emulation.tasks import check_applicable
        for key in ("num_tasks", "cpus_per_task", "cpu_fraction_per_task", "host_links"):
            if key in kwargs:
                raise InputError("LocalCluster.for_cluster", key, "is set by the cluster file",
                                 "declare it as the devices' emulation in the cluster file")
        require_loopback(cluster)
        require_devices_here(cluster)
        source = cluster.source or cluster.name
        check_applicable([d.emulation for d in cluster.devices], source)
        layout = links.checked_layout(cluster, per="task")
        emulations = cluster.task_emulations
        lc = cls(num_tasks=cluster.num_tasks, cpus_per_task=[e and e.cpus for e in emulations],
                 cpu_fraction_per_task=[e and e.cpu_fraction for e in emulations], host_links=layout, **kwargs)
        lc.source = source
        return lc

    # ---- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "LocalCluster":
        """Starts every task and waits until all listen. Raises WorkerDiedError on failure."""
        if self._procs:
            raise RuntimeError("LocalCluster.start() called twice")
        from tfplace.runtime.netns import ensure_private_network
        from tfplace.runtime.signals import stop_on_sigterm
        ensure_private_network("a local cluster")  # TF servers bind every interface: keep them to loopback
        stop_on_sigterm(replace=False)  # SIGTERM then closes this cluster as Ctrl-C does
        if self.log_dir is None:
            self.log_dir = tempfile.mkdtemp(prefix="tfplace_cluster_")
        os.makedirs(self.log_dir, exist_ok=True)
        _LIVE.add(self)
        try:  # every cgroup and host exists before the first task starts: a refusal starts nothing
            self._limits = self._task_limits()
            if self.host_links is not None:
                from tfplace.emulation.links import HostNetworks
                self._networks = HostNetworks(self.host_links)
        except BaseException:
            self.close()
            raise
        for attempt in range(PORT_RETRIES):
            try:
                self._start_once(attempt)
                return self
            except WorkerDiedError as e:
                self._kill_all()
                port_clash = e.returncode == PORT_IN_USE_EXIT  # taken between choosing and binding
                if not port_clash or attempt == PORT_RETRIES - 1:
                    self.close()
                    raise
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    def _start_once(self, attempt: int) -> None:
        from tfplace.emulation.links import chain
        ports = _free_ports(self.host, self.num_tasks)  # a fresh host namespace has them free too
        net = self._networks
        self._addresses = tuple(f"{self.host if net is None else net.address(t)}:{p}" for t, p in enumerate(ports))
        spec = json.dumps({self.job_name: list(self._addresses)})
        self._procs, self._logs = [], []
        ready_files = []
        for task in range(self.num_tasks):
            log = os.path.join(self.log_dir, f"task{task}.try{attempt}.log")
            ready = os.path.join(self.log_dir, f"task{task}.try{attempt}.ready")
            cmd = [sys.executable, "-m", "tfplace.runtime.worker", "--cluster-spec", spec, "--task", str(task),
                   "--job", self.job_name, "--intra-threads", str(self.threads[task] or 0),
                   "--inter-threads", str(self.inter_threads[task] or 0), "--ready-file", ready,
                   "--parent-pid", str(os.getpid())]
            if self.collective_leader:
                cmd += ["--collective-leader", self.leader]
            if self._own_log_dir:  # a SIGKILLed launcher cannot remove its temporary folder: the tasks do
                cmd += ["--orphan-cleanup-dir", self.log_dir]
            env = dict(os.environ)
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            env.update(self.envs[task] or {})
            with open(log, "wb") as logf:
                proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True,  # own process group: Ctrl-C reaches us, we stop it
                    preexec_fn=chain(self._limits.preexec(task), None if net is None else net.preexec(task)))
            self._procs.append(proc)
            self._logs.append(log)
            ready_files.append(ready)
        deadline = time.monotonic() + self.start_timeout_s
        pending = set(range(self.num_tasks))
        while pending:
            for task in sorted(pending):
                if os.path.exists(ready_files[task]):
                    with open(ready_files[task]) as f:
                        if f.read().startswith(READY_PREFIX):
                            pending.discard(task)
                elif self._procs[task].poll() is not None:
                    raise self._died(task, "while starting")
            if pending and time.monotonic() > deadline:
                raise self._died(min(pending), f"within {self.start_timeout_s:.0f} s of starting")
            if pending:
                time.sleep(POLL_S / 2)

    def close(self) -> None:
        """Terminates every task (idempotent); removes the temporary log folder."""
        if self._closed:
            return
        self._closed = True
        try:  # never in the way of stopping the servers
            _close_sessions_on([f"grpc://{a}" for a in self._addresses])
        except Exception:  # noqa: BLE001  (a session object too broken to inspect: its finalizer's problem)
            pass
        self._kill_all()
        with self._stepper_lock:
            for stepper in self._steppers:
                stepper.stop()
            self._steppers.clear()
        if self._limits is not None:
            self._limits.close()
        if self._networks is not None:
            self._networks.close()
        _LIVE.discard(self)
        if self._own_log_dir and self.log_dir and os.path.isdir(self.log_dir):
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def _kill_all(self) -> None:
        for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 5.0)):
            alive = [p for p in self._procs if p.poll() is None]
            for p in alive:
                try:
                    os.killpg(p.pid, sig)  # the worker's own group: its children go too
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            for p in alive:
                try:
                    p.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        # A group leader that exited may leave children behind in its group; sweep the groups.
        for p in self._procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _task_limits(self):
        from tfplace.emulation.tasks import TaskLimits
        from tfplace.formats.cluster import Emulation
        emulations = [None if cpus is None and fraction is None else
                      Emulation(None if cpus is None else tuple(cpus), fraction)
                      for cpus, fraction in zip(self.cpus, self.cpu_fractions)]
        return TaskLimits(emulations, self.source or "LocalCluster", self._emulation_field)

    @property
    def _quotas(self) -> list:
        """The CPU quotas of the limited tasks, in task order (empty before start)."""
        return [q for q in (self._limits.quotas if self._limits else []) if q is not None]

    # ---- what callers use ----------------------------------------------------------------------
    @property
    def leader(self) -> str:
        return f"/job:{self.job_name}/replica:0/task:0"

    @property
    def target(self) -> str:
        """gRPC target of task 0's master, for `tf.compat.v1.Session(target)`."""
        self._require_started()
        return f"grpc://{self._addresses[0]}"

    @property
    def task_addresses(self) -> Tuple[str, ...]:
        self._require_started()
        return self._addresses

    @property
    def device_names(self) -> Tuple[str, ...]:
        """The CPU device of every task, in task order."""
        return tuple(self.task_device(t) for t in range(self.num_tasks))

    def task_device(self, task: int, device_type: str = "CPU", index: int = 0) -> str:
        return f"/job:{self.job_name}/replica:0/task:{task}/device:{device_type}:{index}"

    @property
    def cluster_spec(self) -> Dict[str, List[str]]:
        return {self.job_name: list(self.task_addresses)}

    @property
    def pids(self) -> Tuple[int, ...]:
        return tuple(p.pid for p in self._procs)

    def log_path(self, task: int) -> str:
        return self._logs[task]

    def session_config(self, **kwargs):
        """A ConfigProto for sessions on this cluster (collective leader set if enabled)."""
        import tensorflow as tf
        config = tf.compat.v1.ConfigProto(**kwargs)
        if self.collective_leader:
            config.experimental.collective_group_leader = self.leader
        return config

    def session(self, graph=None, config=None):
        """A `tf.compat.v1.Session` on task 0; config defaults to `session_config()`.

        Its `close()` gives up after CLOSE_TIMEOUT_S instead of blocking forever when a task
        has died or a collective is stuck (stock `close()` waits on the dead master).
        """
        self.check()
        if config is not None:
            self._check_grappler_plugin(config)
        return _session_class()(self.target, graph=graph,
                                config=self.session_config() if config is None else config)

    def _check_grappler_plugin(self, config) -> None:
        """Raises InputError when `config` runs the tfplace Grappler plugin but task 0, the master
        that runs Grappler, was started without the library: TensorFlow would skip the unknown
        optimizer and run the original graph on one device, with no error."""
        from tfplace.runtime.worker import LIBRARIES_ENV, PLUGIN_OPTIMIZER
        if not any(c.name == PLUGIN_OPTIMIZER for c in config.graph_options.rewrite_options.custom_optimizers):
            return
        env = dict(os.environ, **(self.envs[0] or {}))
        if not env.get(LIBRARIES_ENV):
            raise InputError("LocalCluster.session", "config", "runs the tfplace Grappler plugin, but task 0 (which "
                             "runs Grappler for the session) was started without it, so the step would run unplaced",
                             f"start the LocalCluster with env_per_task=[grappler.worker_env()] * {self.num_tasks}")

    @property
    def running(self) -> bool:
        """True between a successful start() and close() (a dead task closes the cluster)."""
        return bool(self._addresses) and not self._closed

    def dead_tasks(self) -> List[int]:
        return [t for t, p in enumerate(self._procs) if p.poll() is not None]

    def check(self, during: str = "") -> None:
        """Raises WorkerDiedError if any task has exited."""
        self._require_started()
        dead = self.dead_tasks()
        if dead:
            raise self._fail(dead[0], during or "(found by a liveness check)")

    def run(self, session, fetches, feed_dict=None, options=None, run_metadata=None,
            timeout_s: Optional[float] = None):
        """`session.run(...)` that raises WorkerDiedError within POLL_S of a task dying.

        The step runs in a helper thread while this thread watches the worker processes; a step
        still running after `timeout_s` raises TimeoutError (the cluster is left as it is).
        """
        self.check("before the step")
        stepper = self._idle_stepper()
        box = stepper.submit(lambda: session.run(fetches, feed_dict=feed_dict, options=options,
                                                 run_metadata=run_metadata))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while not box.done.wait(POLL_S):
                dead = self.dead_tasks()
                if dead:
                    raise self._fail(dead[0], "during a step")
                if deadline is not None and time.monotonic() > deadline and not box.done.is_set():
                    raise TimeoutError(f"step did not finish within {timeout_s} s on {self.target}")
        except BaseException:
            stepper.stop()  # not reused: it may stay inside the unfinished session.run, then ends
            raise
        self._release_stepper(stepper)
        if box.error is not None:
            time.sleep(POLL_S)  # a crash shows up as a gRPC error a moment before the exit code
            dead = self.dead_tasks()
            if dead:
                raise self._fail(dead[0], "during a step") from box.error
            raise box.error
        return box.value

    def _idle_stepper(self) -> "_Stepper":
        """An idle step thread: reused, so that a step does not pay for starting a thread
        (0.1-0.5 ms on a busy 2-core machine, more than a tiny model's step); a new one when
        every existing one is busy (steps run from several threads at once)."""
        with self._stepper_lock:
            return self._steppers.pop() if self._steppers else _Stepper()

    def _release_stepper(self, stepper: "_Stepper") -> None:
        with self._stepper_lock:
            self._steppers.append(stepper)

    def kill_task(self, task: int, sig: int = signal.SIGKILL) -> None:
        """Sends `sig` to one task (for fault-injection tests)."""
        os.killpg(self._procs[task].pid, sig)

    # ---- internals -----------------------------------------------------------------------------
    def _require_started(self) -> None:
        if not self._addresses or self._closed:
            raise RuntimeError("LocalCluster is not running; use it in a `with` block or call start()")

    def _fail(self, task: int, during: str) -> WorkerDiedError:
        """The error for a dead task; shuts the rest of the cluster down (it is unusable)."""
        err = self._died(task, during)
        self.close()
        return err

    def _died(self, task: int, during: str) -> WorkerDiedError:
        proc = self._procs[task]
        try:
            with open(self._logs[task], errors="replace") as f:
                tail = f.read()[-8000:]
        except OSError:
            tail = ""
        return WorkerDiedError(task, self._addresses[task], proc.pid, proc.poll(), tail, during)


def _close_sessions_on(targets: Sequence[str]) -> None:
    """Closes every TensorFlow session still open on one of `targets` (a cluster's task addresses,
    grpc://host:port) while its servers live. A session a
    script left open (its creation failed part way: a session hook raised, or Ctrl-C came while
    MonitoredTrainingSession started) is otherwise closed by its finalizer after the servers
    stopped, and TensorFlow retries that RPC forever: the script would hang instead of exiting.
    Each close is bounded by CLOSE_TIMEOUT_S. Does nothing unless TensorFlow is imported."""
    if "tensorflow" not in sys.modules:
        return
    import gc

    from tensorflow.python.client.session import BaseSession
    names = set(targets) | {t.encode() for t in targets}  # a session's target is bytes in TF 2.15
    open_sessions = [obj for obj in gc.get_objects() if isinstance(obj, BaseSession)
                     and not getattr(obj, "_closed", True) and getattr(obj, "_target", None) in names]
    for session in open_sessions:
        closing = threading.Thread(target=session.close, name="tfplace-session-close", daemon=True)
        closing.start()
        closing.join(CLOSE_TIMEOUT_S)


_SESSION_CLASS = None


def _session_class():
    """tf.compat.v1.Session whose close() is idempotent and bounded in time (built lazily so
    importing this module does not import TensorFlow)."""
    global _SESSION_CLASS
    if _SESSION_CLASS is None:
        import tensorflow as tf

        class ClusterSession(tf.compat.v1.Session):
            _tfplace_closing = None

            def close(self):
                if sys.is_finalizing():
                    # garbage-collected at interpreter exit (a session left open): no thread can
                    # start any more (start() would wait forever) and the atexit hook has already
                    # stopped the cluster's servers; the process's end frees what is left
                    return
                if self._tfplace_closing is None:
                    self._tfplace_closing = threading.Thread(
                        target=tf.compat.v1.Session.close, args=(self,), name="tfplace-session-close",
                        daemon=True)
                    self._tfplace_closing.start()
                self._tfplace_closing.join(CLOSE_TIMEOUT_S)

        _SESSION_CLASS = ClusterSession
    return _SESSION_CLASS


@atexit.register
def _close_live_clusters() -> None:
    for lc in list(_LIVE):
        lc.close()
