"""CpuQuota: argument checks, the kernel's limits on periods and quotas, and the limit a child
process joins (where cgroups are writable)."""

import os
import subprocess
import sys

import pytest

from tfplace import cpu_quota
from tfplace.cpu_quota import CpuQuota
from tfplace.errors import InputError

needs_cgroups = pytest.mark.skipif(not cpu_quota.available(),
                                   reason="no writable cgroups with the cpu controller (needs root)")


@pytest.mark.parametrize("fraction", [0, -0.5, 100, "half", True, None])
def test_bad_fraction_is_one_clear_error(fraction):
    with pytest.raises(InputError, match="fraction.*share of one CPU"):
        CpuQuota(fraction)


def test_short_period_is_refused():
    with pytest.raises(InputError, match="period_us"):
        CpuQuota(0.5, period_us=500)


@needs_cgroups
@pytest.mark.parametrize("fraction,period_us,quota_us", [
    (0.5, 2000, 1000),     # the default period
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
