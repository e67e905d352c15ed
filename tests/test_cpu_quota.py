"""CpuQuota: argument checks, the kernel's limits on periods and quotas, and the limit a child
process joins (where cgroups are writable)."""

import os
import subprocess
import sys

import pytest

from tfplace.emulation import cpu_quota
from tfplace.emulation.cpu_quota import CpuQuota, measure_throttle, period_for
from tfplace.formats.errors import InputError

needs_cgroups = pytest.mark.skipif(not cpu_quota.available(),
                                   reason="no writable cgroups with the cpu controller (needs root)")


@pytest.mark.parametrize("fraction", [0, -0.5, 100, "half", True, None])
def test_bad_fraction_is_one_clear_error(fraction):
    with pytest.raises(InputError, match="fraction.*share of one CPU"):
        CpuQuota(fraction)


def test_short_period_is_refused():
    with pytest.raises(InputError, match="period_us"):
        CpuQuota(0.5, period_us=500)


@pytest.mark.parametrize("fraction,period_us,expected_us", [
    (0.5, 4000, 4000),     # the default
    (0.5, 2000, 2000),
    (0.25, 2000, 4000),    # a 0.5 ms quota would be under the kernel's 1 ms minimum
    (0.1, 4000, 10000),
])
def test_period_grows_where_the_quota_would_be_under_1_ms(fraction, period_us, expected_us):
    assert period_for(fraction, period_us) == expected_us


@needs_cgroups
@pytest.mark.parametrize("fraction,period_us,quota_us", [
    (0.5, 2000, 1000),     # a 2 ms period (the default is 4 ms)
    (0.25, 2000, 1000),    # 500 us would be under the kernel's 1 ms minimum: the period grows to 4 ms
    (1.5, 2000, 3000),     # more than one CPU
])
def test_quota_and_period_written(fraction, period_us, quota_us):
    with CpuQuota(fraction, period_us=period_us) as q:
        assert q.quota_us == quota_us and q.quota_us / q.period_us == pytest.approx(fraction)
        if q.version == 1:
            with open(os.path.join(q.path, "cpu.cfs_quota_us")) as f:
                assert int(f.read()) == quota_us
        else:
            with open(os.path.join(q.path, "cpu.max")) as f:
                assert f.read().split() == [str(quota_us), str(q.period_us)]
    assert not os.path.isdir(q.path)


@needs_cgroups
def test_child_joins_and_burns_at_most_its_share():
    # A busy loop for 0.6 s of wall time under a 0.25 quota gets about 0.15 s of CPU.
    code = ("import time, os\nt0 = time.monotonic()\nwhile time.monotonic() - t0 < 0.6: pass\n"
            "print(sum(os.times()[:2]))")
    with CpuQuota(0.25, name="test") as q:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             preexec_fn=q.join_in_child)
        cpu_s = float(out.stdout.strip())
    assert cpu_s < 0.6 * 0.25 * 1.6 + 0.05, cpu_s    # unlimited, it would be ~0.6 s
    assert not os.path.isdir(q.path)


@needs_cgroups
@pytest.mark.parametrize("fraction", [0.5, 0.25])
def test_throttle_under_the_default_period_is_the_quotas(fraction):
    # With the period at least the kernel's tick, sustained compute under the quota takes
    # 1 / fraction wall seconds per CPU second (a 2 ms period on a 4 ms tick gave 2.03-2.42 at
    # 0.5). The probe runs in a child: this process stays unlimited.
    # (The upper margin leaves room for other tests sharing the core.)
    cpu = sorted(os.sched_getaffinity(0))[-1]
    got = measure_throttle(fraction, cpus=[cpu], cpu_s=0.1)
    assert 0.9 / fraction < got < 1.6 / fraction, got
    with CpuQuota(1.0, name="look") as q:
        left = [n for n in os.listdir(os.path.dirname(q.path)) if n.startswith("tfplace-throttle-")]
    assert left == []  # the probe's cgroup is gone


DEAD_PID = 2 ** 22 + 123  # above Linux's largest pid_max: no such process


@pytest.mark.parametrize("name, pid, age_s, member, removed", [
    ("tfplace-task1-{pid}-77", DEAD_PID, 120, False, True),     # its launcher was killed: removed
    ("tfplace-task1-{pid}-77", DEAD_PID, 5, False, False),      # just made (a launcher we cannot see)
    ("tfplace-task1-{pid}-77", os.getpid(), 120, False, False),  # its launcher runs
    ("tfplace-task1-{pid}-77", DEAD_PID, 120, True, False),     # members run in it still
    ("other-{pid}-77", DEAD_PID, 120, False, False),            # not a CpuQuota's
])
def test_stale_cgroups_of_launchers_now_gone_are_removed(tmp_path, name, pid, age_s, member, removed):
    """Plain folders stand in for cgroups (rmdir removes either only when empty)."""
    import time
    leaf = tmp_path / name.format(pid=pid)
    leaf.mkdir()
    if member:
        (leaf / "cgroup.procs").write_text("1234\n")
    old = time.time() - age_s
    os.utime(leaf, (old, old))
    assert cpu_quota.remove_stale_cgroups(str(tmp_path)) == ([leaf.name] if removed else [])
    assert leaf.exists() != removed
