"""A cluster file's emulation on this machine: checked, applied to task processes, read back.

    check_applicable([d.emulation for d in cluster.devices], cluster.source)  # before any process
    with TaskLimits([d.emulation for d in cluster.devices], cluster.source) as limits:
        subprocess.Popen(cmd, preexec_fn=limits.preexec(i))     # pinned, in its quota, before exec
    process_limits(pid)   # ProcessLimits(cpus=(1,), quota_us=2000, period_us=4000, cgroup=...)

A device's `emulation` (tfplace.formats.cluster.Emulation) pins its task's process to `cpus` and
limits it to `cpu_fraction` of one core with a cgroup CPU quota (tfplace.emulation.cpu_quota).
The local TF servers (tfplace.runtime.local_cluster) and the Horovod ranks
(tfplace.baselines.horovod_runner) go through `TaskLimits`, so a device runs under the same
limits whichever of them runs it. The limits are applied in the child between fork and exec, so
every thread the process ever starts is limited.

What the file cannot know is checked here, before anything starts: that the cores exist on this
machine (`machine_cores`: the launching process may itself be pinned to fewer), and that a CPU quota can be set (root, or a delegated
cgroup v2 sub-tree, with the cpu controller). Each problem is one InputError naming the cluster
file, the field (`devices[1].emulation.cpu_fraction`) and the fix.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, List, Optional, Sequence, Tuple

from tfplace.emulation import cpu_quota
from tfplace.formats.cluster import Emulation
from tfplace.formats.errors import InputError

QUOTA_FIX = ("run as root on a machine with cgroups (cgroup v2 cpu.max or v1 cpu.cfs_quota_us, or a "
             "delegated cgroup v2 sub-tree with the cpu controller), or remove cpu_fraction from the cluster "
             "file and emulate with pinned cores only")


def machine_cores() -> List[int]:
    """The machine's cores (os.cpu_count), whatever cores the calling process is pinned to: a
    benchmark's client pinned to core 1 still starts a task on core 0."""
    return list(range(os.cpu_count() or 1))


def check_applicable(emulations: Sequence[Optional[Emulation]], source: str, field: str = "devices") -> None:
    """Raises InputError naming `source` and `<field>[i].emulation.<key>` when entry i's cores do not
    exist on this machine or its CPU quota cannot be set here."""
    cores = machine_cores()
    quotas_ok: Optional[bool] = None
    for i, e in enumerate(emulations):
        if e is None:
            continue
        missing = sorted(set(e.cpus or ()) - set(cores))
        if missing:
            raise InputError(source, f"{field}[{i}].emulation.cpus",
                             f"core {missing[0]} does not exist on this machine (cores here: {cores})",
                             "pin the task to cores this machine has, or run on a machine with more cores")
        if e.cpu_fraction is not None:
            quotas_ok = cpu_quota.available() if quotas_ok is None else quotas_ok
            if not quotas_ok:
                raise InputError(source, f"{field}[{i}].emulation.cpu_fraction",
                                 f"a CPU quota cannot be applied here: no writable cgroup with the cpu controller "
                                 f"under {cpu_quota.CGROUP_ROOT}", QUOTA_FIX)


def child_limiter(cpus: Optional[Sequence[int]], quota: Optional[cpu_quota.CpuQuota]) -> Optional[Callable[[], None]]:
    """preexec_fn of a task process: pin it to `cpus` and join `quota` before it execs (None when
    neither is asked for)."""
    if not cpus and quota is None:
        return None

    def limit():
        if cpus:
            os.sched_setaffinity(0, tuple(cpus))
        if quota is not None:
            quota.join_in_child()
    return limit


class TaskLimits:
    """The cgroups of a list of emulations (one per task), created together before any task
    starts and removed on `close()` once the tasks have exited. `preexec(i)` limits task i."""

    def __init__(self, emulations: Sequence[Optional[Emulation]], source: str, field: str = "devices",
                 name: str = "task"):
        check_applicable(emulations, source, field)
        self.emulations = tuple(emulations)
        self.quotas: List[Optional[cpu_quota.CpuQuota]] = []
        try:
            for i, e in enumerate(self.emulations):
                fraction = None if e is None else e.cpu_fraction
                self.quotas.append(None if fraction is None else cpu_quota.CpuQuota(fraction, name=f"{name}{i}"))
        except BaseException:
            self.close()
            raise

    def preexec(self, i: int) -> Optional[Callable[[], None]]:
        e = self.emulations[i]
        return child_limiter(None if e is None else e.cpus, self.quotas[i])

    def close(self) -> None:
        for quota in self.quotas:
            if quota is not None:
                quota.close()

    def __enter__(self) -> "TaskLimits":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class ProcessLimits:
    """What the kernel applies to a process: its CPU affinity and its cgroup's CFS quota.
    quota_us / period_us: None without a quota (`max`, or -1 in cgroup v1)."""
    cpus: Tuple[int, ...]
    cgroup: str
    quota_us: Optional[int]
    period_us: Optional[int]

    @property
    def cpu_fraction(self) -> Optional[float]:
        return None if self.quota_us is None else self.quota_us / self.period_us


def _cgroup_lines(pid: int) -> List[Tuple[str, str]]:
    with open(f"/proc/{pid}/cgroup") as f:  # "<id>:<controllers>:<path>" per hierarchy
        return [(parts[1], parts[2]) for parts in (line.rstrip("\n").split(":", 2) for line in f) if len(parts) == 3]


def process_limits(pid: int) -> ProcessLimits:
    """The affinity and CPU quota of process `pid`, read from the kernel (/proc/<pid>/cgroup, then
    the cgroup's cpu.max in v2 or cpu.cfs_quota_us / cpu.cfs_period_us in v1)."""
    cpus = tuple(sorted(os.sched_getaffinity(pid)))
    lines = _cgroup_lines(pid)
    for controllers, rel in lines:  # v1: the hierarchy with the cpu controller
        if "cpu" in controllers.split(","):
            for mount in (controllers, "cpu", "cpu,cpuacct"):
                path = os.path.join(cpu_quota.CGROUP_ROOT, mount, rel.lstrip("/"))
                if os.path.exists(os.path.join(path, "cpu.cfs_quota_us")):
                    quota = int(_read(path, "cpu.cfs_quota_us"))
                    period = int(_read(path, "cpu.cfs_period_us"))
                    return ProcessLimits(cpus, path, None if quota < 0 else quota, None if quota < 0 else period)
    for controllers, rel in lines:  # v2: the unified hierarchy
        if controllers == "":
            path = os.path.join(cpu_quota.CGROUP_ROOT, rel.lstrip("/"))
            if os.path.exists(os.path.join(path, "cpu.max")):
                quota_text, period_text = _read(path, "cpu.max").split()
                if quota_text == "max":
                    return ProcessLimits(cpus, path, None, None)
                return ProcessLimits(cpus, path, int(quota_text), int(period_text))
            return ProcessLimits(cpus, path, None, None)
    return ProcessLimits(cpus, "", None, None)


def _read(path: str, name: str) -> str:
    with open(os.path.join(path, name)) as f:
        return f.read().strip()
