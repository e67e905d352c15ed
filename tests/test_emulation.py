"""A cluster file's per-device emulation: read and checked with the file, checked against this
machine before anything starts, and applied to every task of a LocalCluster (read back from the
kernel: each worker's affinity and its cgroup's CPU quota).

The multi-process test needs root (writable cgroups with the cpu controller) and 2 cores, as
clusters/local_cpu_hetero.json pins tasks to cores 0 and 1; it is skipped, saying why, elsewhere.
"""

import json
import os

import pytest

from tfplace.emulation import cpu_quota, tasks
from tfplace.emulation.tasks import check_applicable, process_limits
from tfplace.formats.cluster import Emulation, cluster_from_reader, load_cluster
from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import FieldReader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HETERO = os.path.join(REPO, "clusters", "local_cpu_hetero.json")

needs_quotas = pytest.mark.skipif(not cpu_quota.available(),
                                  reason="CPU quotas need writable cgroups with the cpu controller (root)")
needs_two_cores = pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0),
                                     reason="local_cpu_hetero.json pins tasks to cores 0 and 1")


def _cluster_json(emulations, tasks_=None, address="127.0.0.1"):
    return {"format": "tfplace.cluster", "name": "t", "hosts": [{"name": "h", "address": address}],
            "devices": [dict({"name": f"d{i}", "kind": "CPU", "host": "h", "memory_bytes": 10**9,
                              "task": i if tasks_ is None else tasks_[i]},
                             **({} if e is None else {"emulation": e})) for i, e in enumerate(emulations)]}


def _load(data, source="c.json"):
    return cluster_from_reader(FieldReader.from_data(data, source, expected_format="tfplace.cluster"))


def test_the_hetero_cluster_declares_its_emulation_and_round_trips():
    cluster = load_cluster(HETERO)
    assert cluster.task_emulations == (Emulation(cpus=(0,)), Emulation(cpus=(1,), cpu_fraction=0.5),
                                       Emulation(cpus=(1,), cpu_fraction=0.5))
    assert cluster.has_emulation and not load_cluster(os.path.join(REPO, "clusters", "local_cpu.json")).has_emulation
    again = _load(cluster.to_json())
    assert again.to_json() == cluster.to_json() and again.devices == cluster.devices
    assert cluster.to_json()["devices"][1]["emulation"] == {"cpus": [1], "cpu_fraction": 0.5}


@pytest.mark.parametrize("emulation, field, words", [
    ({"cpus": [1], "cpu_quota": 0.5}, "devices[0].emulation.cpu_quota", "unknown key"),
    ({"cpu_fraction": 0}, "devices[0].emulation.cpu_fraction", "(0, 1]"),
    ({"cpu_fraction": 1.5}, "devices[0].emulation.cpu_fraction", "(0, 1]"),
    ({"cpu_fraction": "half"}, "devices[0].emulation.cpu_fraction", "number"),
    ({"cpus": [-1]}, "devices[0].emulation.cpus[0]", ">= 0"),
    ({"cpus": [0, 1.5]}, "devices[0].emulation.cpus[1]", "integer"),
    ({"cpus": [1, 1]}, "devices[0].emulation.cpus", "twice"),
    ({"cpus": []}, "devices[0].emulation.cpus", "non-empty"),
    ({}, "devices[0].emulation", "neither"),
    ([1], "devices[0].emulation", "object"),
])
def test_bad_emulation_is_one_error_naming_the_field(emulation, field, words):
    with pytest.raises(InputError) as e:
        _load(_cluster_json([emulation, None]))
    assert e.value.source == "c.json" and e.value.field == field and words in str(e.value), str(e.value)


def test_emulation_needs_a_task_of_its_own():
    with pytest.raises(InputError, match=r"devices\[0\]\.emulation.*task of its own"):
        _load(_cluster_json([{"cpus": [0]}, None], tasks_=[0, 0]))


def test_missing_core_and_unavailable_quota_name_the_file_and_field(monkeypatch):
    cluster = _load(_cluster_json([None, {"cpus": [4096]}]), source="my_cluster.json")
    with pytest.raises(InputError) as e:
        check_applicable([d.emulation for d in cluster.devices], cluster.source)
    assert (e.value.source, e.value.field) == ("my_cluster.json", "devices[1].emulation.cpus")
    assert "core 4096 does not exist" in str(e.value)
    monkeypatch.setattr(cpu_quota, "available", lambda: False)
    cluster = _load(_cluster_json([{"cpus": [0]}, {"cpu_fraction": 0.5}]), source="my_cluster.json")
    with pytest.raises(InputError) as e:
        check_applicable([d.emulation for d in cluster.devices], cluster.source)
    assert (e.value.source, e.value.field) == ("my_cluster.json", "devices[1].emulation.cpu_fraction")
    assert "root" in e.value.fix and "remove cpu_fraction" in e.value.fix


def test_local_cluster_refuses_before_any_task_starts(monkeypatch):
    from tfplace.runtime import local_cluster
    started = []
    monkeypatch.setattr(local_cluster.subprocess, "Popen", lambda *a, **k: started.append(a))
    remote = _load(_cluster_json([None, None], address="10.20.30.40"), source="remote.json")
    with pytest.raises(InputError) as e:
        local_cluster.LocalCluster.for_cluster(remote)
    assert (e.value.source, e.value.field) == ("remote.json", "hosts[0].address") and "those hosts" in e.value.fix
    monkeypatch.setattr(cpu_quota, "available", lambda: False)
    with pytest.raises(InputError, match=r"devices\[1\]\.emulation\.cpu_fraction"):
        local_cluster.LocalCluster.for_cluster(load_cluster(HETERO))
    assert not started


def test_own_process_limits_are_read_back():
    limits = process_limits(os.getpid())
    assert limits.cpus == tuple(sorted(os.sched_getaffinity(0)))
    assert (limits.quota_us is None) == (limits.period_us is None) == (limits.cpu_fraction is None)


def _read_int(path):
    with open(path) as f:
        return int(f.read())


def _cpu_max_of(pid):
    """(quota_us or None, period_us or None) of pid's cgroup, read directly: v1's cpu controller
    line of /proc/<pid>/cgroup, else v2's unified line and its cpu.max."""
    with open(f"/proc/{pid}/cgroup") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    for _, controllers, rel in lines:
        if "cpu" in controllers.split(","):
            path = os.path.join(cpu_quota.CGROUP_ROOT, controllers, rel.lstrip("/"))
            if os.path.exists(os.path.join(path, "cpu.cfs_quota_us")):
                quota, period = (_read_int(os.path.join(path, f"cpu.cfs_{key}_us")) for key in ("quota", "period"))
                return (None, None) if quota < 0 else (quota, period)
    rel = next(r for _, c, r in lines if c == "")
    with open(os.path.join(cpu_quota.CGROUP_ROOT, rel.lstrip("/"), "cpu.max")) as f:
        quota, period = f.read().split()
    return (None, None) if quota == "max" else (int(quota), int(period))


@pytest.mark.multiprocess
@needs_quotas
@needs_two_cores
def test_local_cluster_from_the_hetero_file_pins_and_limits_every_worker():
    from tfplace.runtime.local_cluster import LocalCluster
    with LocalCluster.for_cluster(load_cluster(HETERO), threads_per_task=[1, 1, 1]) as lc:
        affinities = [os.sched_getaffinity(pid) for pid in lc.pids]
        shares = [_cpu_max_of(pid) for pid in lc.pids]
        read_back = [process_limits(pid) for pid in lc.pids]
        paths = [q.path for q in lc._quotas]
    assert affinities == [{0}, {1}, {1}]
    assert shares[0] == (None, None)
    for quota_us, period_us in shares[1:]:
        assert quota_us / period_us == pytest.approx(0.5)
    assert [r.cpu_fraction for r in read_back] == [None, pytest.approx(0.5), pytest.approx(0.5)]
    assert [r.cgroup for r in read_back[1:]] == paths and len(set(paths)) == 2
    assert not any(os.path.isdir(p) for p in paths), "cgroups left behind"


def test_task_limits_make_no_cgroup_when_one_cannot_be_made(monkeypatch):
    made = []

    class Refused:
        def __init__(self, fraction, name):
            if made:
                raise InputError("CpuQuota", "cgroups", "refused", "fix")
            made.append(self)
            self.closed = False

        def close(self):
            self.closed = True
    monkeypatch.setattr(cpu_quota, "available", lambda: True)
    monkeypatch.setattr(cpu_quota, "CpuQuota", Refused)
    with pytest.raises(InputError, match="refused"):
        tasks.TaskLimits([Emulation(cpu_fraction=0.5), Emulation(cpu_fraction=0.5)], "c.json")
    assert len(made) == 1 and made[0].closed
