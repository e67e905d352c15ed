"""CPU bandwidth limits for one process tree (Linux cgroups): a reproducible "slow device".

    with CpuQuota(0.5, name="task1") as quota:    # at most half of one CPU
        subprocess.Popen(cmd, preexec_fn=quota.join_in_child)
    limit_current_process(0.5)                      # the profiler measuring under the same limit

A local cluster emulates devices of different speeds by giving each server process a fraction of
one CPU (and pinning it to a core, `LocalCluster(cpus_per_task=...)`): a task limited to 0.5 runs
every compute-bound kernel about 2x slower than an unlimited one, whatever the other tasks do,
and a profile measured in a process under the same limit sees the same factor. Thread limits alone
cannot do this on a machine with few cores (the slow task still gets a whole core when the fast
one waits).

The kernel's CFS bandwidth control enforces `fraction * period_us` of CPU time per `period_us`;
a short period (default 2 ms; longer where the quota would fall under the kernel's 1 ms minimum)
keeps the slowdown even over millisecond-long steps.

Works with cgroup v2 (`cpu.max` in a writable sub-tree of /sys/fs/cgroup) and v1 (the `cpu`
controller's `cpu.cfs_quota_us`). Where neither is writable (no root, no delegated sub-tree)
`CpuQuota` raises one InputError saying so; `available()` tells beforehand.
"""

from __future__ import annotations

import os
import time
from typing import Optional

from tfplace.errors import InputError

CGROUP_ROOT = "/sys/fs/cgroup"
DEFAULT_PERIOD_US = 2000
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


def available() -> bool:
    """Whether this process may create CPU-limited cgroups here."""
    return _v2_parent() is not None or _v1_parent() is not None


class CpuQuota:
    """A cgroup limiting its members to `fraction` of one CPU; removed on `close()` (once its
    members have exited). Args: fraction in (0, 64]; name: a readable part of the cgroup's
    name; period_us: the CFS period (>= 1000)."""

    def __init__(self, fraction: float, name: str = "tfplace", period_us: int = DEFAULT_PERIOD_US):
        if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 < fraction <= 64:
            raise InputError("CpuQuota", "fraction", f"must be a number in (0, 64], got {fraction!r}",
                             "give the share of one CPU, e.g. 0.5 for half a core")
        if not isinstance(period_us, int) or period_us < MIN_PERIOD_US:
            raise InputError("CpuQuota", "period_us", f"must be an integer >= {MIN_PERIOD_US}, got {period_us!r}",
                             f"use the default {DEFAULT_PERIOD_US}")
        # the kernel also refuses quotas under 1 ms: small fractions get a longer period
        period_us = max(period_us, int(-(-MIN_PERIOD_US // fraction)))
        self.fraction, self.period_us = float(fraction), period_us
        self.quota_us = max(int(round(fraction * period_us)), MIN_PERIOD_US)
        leaf = f"tfplace-{name}-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        v2, v1 = _v2_parent(), _v1_parent()
        if v2 is None and v1 is None:
            raise InputError("CpuQuota", "cgroups", f"no writable cgroup with the cpu controller under {CGROUP_ROOT}",
                             _FIX)
        self.version = 2 if v2 is not None else 1
        self.path = os.path.join(v2 if v2 is not None else v1, leaf)
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


def limit_current_process(fraction: float, name: str = "self") -> CpuQuota:
    """Puts this process into a new CpuQuota (returned; it cannot be removed while we live)."""
    quota = CpuQuota(fraction, name=name)
    quota.join(os.getpid())
    return quota
