"""CPU bandwidth limits for one process tree (Linux cgroups): a reproducible "slow device".

    with CpuQuota(0.5, name="task1") as quota:    # at most half of one CPU
        subprocess.Popen(cmd, preexec_fn=quota.join_in_child)
    measure_throttle(0.5, cpus=[1])                 # wall per CPU second under it: ~2.0

A local cluster emulates devices of different speeds by giving each server process a fraction of
one CPU (and pinning it to a core, `LocalCluster(cpus_per_task=...)`): a task limited to 0.5 runs
every compute-bound kernel about 2x slower than an unlimited one, whatever the other tasks do,
and the profiler measures that factor under the same limit. Thread limits alone cannot do this
on a machine with few cores (the slow task still gets a whole core when the fast one waits).

The kernel's CFS bandwidth control enforces `fraction * period_us` of CPU time per `period_us`.
The period must not be shorter than the kernel's scheduler tick: the kernel charges a task's
CPU at its ticks and system calls, so a task that computes without system calls overruns a
shorter quota and then waits the overrun off. On this project's 2-core VM (a 4 ms tick, HZ 250)
a 2 ms period gave 2.03-2.42 s of wall per CPU second under a 0.5 quota, from run to run, and
even 1.13-1.83 under a quota of one whole CPU; from a 4 ms period on it gave 1.99-2.06 and 1.00.
So the default period is 4 ms (longer where the quota would fall under the kernel's 1 ms
minimum). A task that has been idle runs unthrottled until it has used its quota of the
period (2 ms of 4 ms at 0.5), so steps of a few milliseconds with idle gaps between them are
stretched less than 2x (a 4 ms matmul step: 1.13-1.74x; a 14 ms one: 1.83x).
`measure_throttle` measures the slowdown a compute-bound child sees; the profiler scales a quota
kind's op times by it (tfplace.cli.profile --cpu-fraction).

Works with cgroup v2 (`cpu.max` in a writable sub-tree of /sys/fs/cgroup) and v1 (the `cpu`
controller's `cpu.cfs_quota_us`). Where neither is writable (no root, no delegated sub-tree)
`CpuQuota` raises one InputError saying so; `available()` tells beforehand.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import List, Optional, Sequence

from tfplace.formats.errors import InputError

CGROUP_ROOT = "/sys/fs/cgroup"
DEFAULT_PERIOD_US = 4000  # >= the scheduler tick of common kernels (HZ 250); module doc
MIN_PERIOD_US = 1000  # the kernel refuses shorter CFS periods
_FIX = ("run as root on a machine with writable cgroups (or a delegated cgroup v2 sub-tree), "
        "or emulate speeds with threads_per_task instead")


def _v2_parent() -> Optional[str]:
    """A cgroup v2 directory we may create children in, or None."""
    if not os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        return None
    try:
        with open("/proc/self/cgroup") as f:
            rel = next((line.split("::", 1)[1].strip() for line in f if line.startswith("0::")), "/")
    except OSError:
        return None
    for path in (os.path.join(CGROUP_ROOT, rel.lstrip("/")), CGROUP_ROOT):
        try:
            with open(os.path.join(path, "cgroup.subtree_control")) as f:
                enabled = f.read().split()
        except OSError:
            continue
        if "cpu" in enabled and os.access(path, os.W_OK):
            return path
    return None


def _v1_parent() -> Optional[str]:
    for name in ("cpu", "cpu,cpuacct"):
        path = os.path.join(CGROUP_ROOT, name)
        if os.path.exists(os.path.join(path, "cpu.cfs_quota_us")) and os.access(path, os.W_OK):
            return path
    return None


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs: one we may not signal counts as running, a zombie (ended, not
    yet reaped by its parent) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"  # the state follows the command's name
    except (OSError, IndexError):
        return True  # no /proc: os.kill's answer


_LEAF = re.compile(r"tfplace-.+-(\d+)-\d+")  # CpuQuota's cgroup names: tfplace-<name>-<pid>-<n>


STALE_AFTER_S = 60.0  # younger cgroups are left: a live launcher whose pid this process cannot see


def remove_stale_cgroups(parent: str) -> List[str]:
    """Removes the empty cgroups under `parent` that a CpuQuota of a process now gone left behind
    (its launcher was killed before `close`); returns their names. A cgroup with members stays,
    and so does one made in the last STALE_AFTER_S (a launcher in another PID namespace looks
    gone from here, and its cgroup is empty until its tasks join)."""
    removed = []
    for name in sorted(os.listdir(parent)) if os.path.isdir(parent) else ():
        match = _LEAF.fullmatch(name)
        if match and not pid_alive(int(match.group(1))):
            try:
                if time.time() - os.stat(os.path.join(parent, name)).st_mtime < STALE_AFTER_S:
                    continue
                os.rmdir(os.path.join(parent, name))
                removed.append(name)
            except OSError:  # members still run in it, or another process removed it first
                pass
    return removed


def available() -> bool:
    """Whether this process may create CPU-limited cgroups here."""
    return _v2_parent() is not None or _v1_parent() is not None


def period_for(fraction: float, period_us: int = DEFAULT_PERIOD_US) -> int:
    """The CFS period a quota of `fraction` gets: `period_us`, longer where the quota would fall
    under the kernel's 1 ms minimum."""
    return max(period_us, int(-(-MIN_PERIOD_US // fraction)))


class CpuQuota:
    """A cgroup limiting its members to `fraction` of one CPU; removed on `close()` (once its
    members have exited). Args: fraction in (0, 64]; name: a readable part of the cgroup's
    name; period_us: the CFS period (>= 1000; at least the kernel's tick for an even slowdown)."""

    def __init__(self, fraction: float, name: str = "tfplace", period_us: int = DEFAULT_PERIOD_US):
        if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 < fraction <= 64:
            raise InputError("CpuQuota", "fraction", f"must be a number in (0, 64], got {fraction!r}",
                             "give the share of one CPU, e.g. 0.5 for half a core")
        if not isinstance(period_us, int) or period_us < MIN_PERIOD_US:
            raise InputError("CpuQuota", "period_us", f"must be an integer >= {MIN_PERIOD_US}, got {period_us!r}",
                             f"use the default {DEFAULT_PERIOD_US}")
        period_us = period_for(fraction, period_us)
        self.fraction, self.period_us = float(fraction), period_us
        self.quota_us = max(int(round(fraction * period_us)), MIN_PERIOD_US)
        leaf = f"tfplace-{name}-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        v2, v1 = _v2_parent(), _v1_parent()
        if v2 is None and v1 is None:
            raise InputError("CpuQuota", "cgroups", f"no writable cgroup with the cpu controller under {CGROUP_ROOT}",
                             _FIX)
        self.version = 2 if v2 is not None else 1
        parent = v2 if v2 is not None else v1
        remove_stale_cgroups(parent)
        self.path = os.path.join(parent, leaf)
        try:
            os.mkdir(self.path)
            if self.version == 2:
                self._write("cpu.max", f"{self.quota_us} {self.period_us}")
            else:
                self._write("cpu.cfs_period_us", str(self.period_us))
                self._write("cpu.cfs_quota_us", str(self.quota_us))
        except OSError as e:
            self.close()
            raise InputError("CpuQuota", "cgroups", f"could not set a CPU limit in {self.path} ({e})", _FIX) from e
        self._procs_file = os.path.join(self.path, "cgroup.procs")

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def throttled_periods(self) -> int:
        """How many CFS periods the kernel has throttled this cgroup's members in so far (its
        `cpu.stat` nr_throttled, in cgroup v1 and v2): > 0 shows the limit took effect."""
        with open(os.path.join(self.path, "cpu.stat")) as f:
            fields = dict(line.split() for line in f if line.strip())
        return int(fields["nr_throttled"])

    def join(self, pid: int) -> None:
        """Moves process `pid` (all its threads) into the cgroup."""
        with open(self._procs_file, "w") as f:
            f.write(str(pid))

    def join_in_child(self) -> None:
        """For `subprocess.Popen(preexec_fn=...)`: the child joins before it execs, so every
        thread it ever starts is limited."""
        self.join(os.getpid())

    def close(self, timeout_s: float = 2.0) -> None:
        """Removes the cgroup once it is empty (its members exited); best effort."""
        deadline = time.monotonic() + timeout_s
        while os.path.isdir(self.path):
            try:
                os.rmdir(self.path)
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.02)

    def __enter__(self) -> "CpuQuota":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# A compute loop without system calls (a task's CPU is charged at its ticks then, as for kernels);
# argv: iterations, repeats. Prints wall seconds per CPU second of each repeat.
_THROTTLE_PROBE = """
import sys, time
n, out = int(sys.argv[1]), []
for _ in range(int(sys.argv[2])):
    c0, t0 = time.process_time(), time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    out.append((time.perf_counter() - t0) / max(time.process_time() - c0, 1e-9))
print(" ".join(repr(r) for r in out))
"""
_PROBE_ITERATIONS_PER_CPU_S = 25_000_000  # CPython on this class of machine; only sets the length


def measure_throttle(fraction: float, cpus: Optional[Sequence[int]] = None, cpu_s: float = 0.2,
                     repeats: int = 5, period_us: int = DEFAULT_PERIOD_US) -> float:
    """Wall seconds per CPU second of sustained compute under CpuQuota(fraction, period_us),
    pinned to `cpus`: the fastest of `repeats` runs of about `cpu_s` CPU seconds each, in a
    child process (the caller stays unlimited). 1 / fraction where the kernel enforces the quota
    exactly; more where it charges late (a period under the tick, module doc). The fastest run,
    because another process on the same core only adds wall time: a busy loop beside the probe
    put it at 2.5-2.6 under a 0.5 quota that slows it 2.0 alone. Takes about
    repeats * cpu_s / fraction seconds."""
    with CpuQuota(fraction, name="throttle", period_us=period_us) as quota:
        def enter():
            quota.join_in_child()
            if cpus:
                os.sched_setaffinity(0, list(cpus))
        out = subprocess.run([sys.executable, "-c", _THROTTLE_PROBE, str(int(cpu_s * _PROBE_ITERATIONS_PER_CPU_S)),
                              str(repeats)], capture_output=True, text=True, preexec_fn=enter, timeout=600)
    if out.returncode != 0:
        raise InputError("CpuQuota", "measure_throttle", f"the probe failed: {out.stderr.strip()[-300:]}", _FIX)
    return min(float(x) for x in out.stdout.split())
