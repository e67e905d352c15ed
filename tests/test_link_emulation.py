"""Hosts with shaped links on one machine (tfplace.emulation.links, a cluster file's host
`emulation`): read and checked with the file, refused with the fix where the machine cannot
emulate them, and applied to the TF tasks of a LocalCluster and to the Horovod ranks: each runs in
its host's network namespace, reached at its host's address, and a transfer between hosts takes
as long as the shaped rate says.

The multi-process tests need root and the tbf qdisc (tc); they are skipped, saying why, elsewhere.
"""

import os
import time

import pytest

from tfplace.emulation import links
from tfplace.formats.cluster import (Device, Host, LinkEmulation, build_cluster, cluster_from_reader,
                                     load_cluster)
from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import FieldReader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPED = os.path.join(REPO, "clusters", "local_cpu_hetero_shaped.json")
RATE_BYTES_PER_S = 1.25e7  # 100 Mbit/s: 5 MB take 0.4 s


def _cluster(emulations, devices_per_host=1):
    hosts = [Host(f"h{i}", nic_bandwidth_bytes_per_s=RATE_BYTES_PER_S, emulation=e) for i, e in enumerate(emulations)]
    devices = [Device(f"d{i}_{k}", "CPU", f"h{i}", 10**9, task=i * devices_per_host + k)
               for i in range(len(hosts)) for k in range(devices_per_host)]
    return build_cluster("shaped", hosts, devices, source="shaped.json")


def _can_shape() -> bool:
    if os.geteuid() != 0:
        return False
    try:
        links.check_available(links.host_layout(_cluster([LinkEmulation(RATE_BYTES_PER_S)] * 2)))
    except InputError:
        return False
    return True


needs_shaping = pytest.mark.skipif(not _can_shape(), reason="emulated hosts need root, iproute2 and tc's tbf qdisc")


def _load(data):
    return cluster_from_reader(FieldReader.from_data(data, "c.json", expected_format="tfplace.cluster"))


def _file(host_emulations, address="127.0.0.1"):
    return {"format": "tfplace.cluster", "name": "t",
            "hosts": [dict({"name": f"h{i}", "address": address}, **({} if e is None else {"emulation": e}))
                      for i, e in enumerate(host_emulations)],
            "devices": [{"name": f"d{i}", "kind": "CPU", "host": f"h{i}", "memory_bytes": 10**9, "task": i}
                        for i in range(len(host_emulations))]}


def test_the_shaped_cluster_declares_every_host_and_round_trips():
    cluster = load_cluster(SHAPED)
    assert [h.emulation for h in cluster.hosts] == [LinkEmulation(1.25e8)] * 3
    # the simulator's links are the shaped ones: 1.25e8 bytes take 1 s (plus the latency) between hosts
    assert cluster.transfer_seconds(0, 1, 1.25e8) == pytest.approx(1.0 + 2 * 7.15e-05)
    again = _load(cluster.to_json())
    assert again.to_json() == cluster.to_json() and again.hosts == cluster.hosts
    layout = links.host_layout(cluster, per="task")
    assert layout.hosts == ("fast", "slow0", "slow1") and layout.host_of_process == (0, 1, 2)
    assert links.host_layout(load_cluster(os.path.join(REPO, "clusters", "local_cpu_hetero.json"))) is None


@pytest.mark.parametrize("emulations, address, field, words", [
    ([{"bandwidth_bytes_per_s": 1e8, "rate": 1}] * 2, "127.0.0.1", "hosts[0].emulation.rate", "unknown key"),
    ([{"bandwidth_bytes_per_s": 0}] * 2, "127.0.0.1", "hosts[0].emulation.bandwidth_bytes_per_s", "> 0"),
    ([{"bandwidth_bytes_per_s": 100}] * 2, "127.0.0.1", "hosts[0].emulation.bandwidth_bytes_per_s",
     "in bytes per second"),  # 100 Mbit/s meant: under the file's 1 MB/s bound
    ([{"bandwidth_bytes_per_s": "fast"}] * 2, "127.0.0.1", "hosts[0].emulation.bandwidth_bytes_per_s", "number"),
    ([{"latency_s": -1e-3}] * 2, "127.0.0.1", "hosts[0].emulation.latency_s", "[0, 10]"),
    ([{}] * 2, "127.0.0.1", "hosts[0].emulation", "neither"),
    ([{"bandwidth_bytes_per_s": 1e8}, None], "127.0.0.1", "hosts[1].emulation", "other hosts declare"),
    ([{"bandwidth_bytes_per_s": 1e8}] * 2, "10.0.0.7", "hosts[0].address", "not loopback"),
])
def test_bad_link_emulation_is_one_error_naming_the_field(emulations, address, field, words):
    with pytest.raises(InputError) as err:
        _load(_file(emulations, address))
    assert err.value.source == "c.json" and err.value.field == field, str(err.value)
    assert words in str(err.value)


@pytest.mark.parametrize("link, expected", [
    # a rate alone: a token bucket of 100 us of the rate, at least one 64 KiB segment
    (LinkEmulation(1.25e8), ["tbf", "rate", "1000000000bit", "burst", "65536", "latency", "100ms"]),
    (LinkEmulation(1.25e10), ["tbf", "rate", "100000000000bit", "burst", "1250000", "latency", "100ms"]),
    # a delay: netem, with the rate when both are given
    (LinkEmulation(1.25e8, 5e-4), ["netem", "delay", "500us", "rate", "1000000000bit", "limit", "10000"]),
    (LinkEmulation(None, 2e-3), ["netem", "delay", "2000us", "limit", "10000"]),
])
def test_each_direction_of_a_link_is_one_qdisc(link, expected):
    assert links.qdisc_args(link) == expected


def test_a_machine_that_cannot_shape_refuses_with_the_fix(monkeypatch):
    layout = links.host_layout(_cluster([LinkEmulation(1e8, 1e-3)] * 2))
    monkeypatch.setattr(links, "_qdisc_works", lambda args: args[0] != "netem")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(InputError) as err:
        links.check_available(layout)
    assert err.value.field == "hosts[0].emulation.latency_s" and "sch_netem" in str(err.value)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(InputError) as err:
        links.check_available(layout)
    assert err.value.source == "shaped.json" and "root" in str(err.value)


def test_local_cluster_refuses_before_any_namespace_is_made(monkeypatch):
    from tfplace.runtime.local_cluster import LocalCluster
    monkeypatch.setattr(links, "_qdisc_works", lambda args: False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    before = set(os.listdir(links.NETNS_DIR)) if os.path.isdir(links.NETNS_DIR) else set()
    with pytest.raises(InputError) as err:
        LocalCluster.for_cluster(_cluster([LinkEmulation(1e8)] * 2))
    assert err.value.field == "hosts[0].emulation.bandwidth_bytes_per_s"
    assert (set(os.listdir(links.NETNS_DIR)) if os.path.isdir(links.NETNS_DIR) else set()) == before


def test_horovod_slots_follow_the_hosts_without_reordering_ranks():
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from tfplace.baselines.horovod_runner import host_slots
    # contiguous hosts: exactly what horovodrun assigns for "a:2,b:1"
    ours = host_slots([0, 0, 1], ["a", "b"])
    assert [s.to_response_string() for s in ours] == \
        [s.to_response_string() for s in get_host_assignments(parse_hosts("a:2,b:1"), 3)]
    # interleaved hosts keep the rank order (rank r is device r) with per-host local ranks
    mixed = host_slots([0, 1, 0], ["a", "b"])
    assert [(s.hostname, s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in mixed] == \
        [("a", 0, 2, 0, 2), ("b", 0, 1, 1, 2), ("a", 1, 2, 0, 1)]


def _own_namespaces():
    prefix = f"{links.NETNS_PREFIX}{os.getpid()}-"
    return sorted(n for n in (os.listdir(links.NETNS_DIR) if os.path.isdir(links.NETNS_DIR) else ()) if n.startswith(prefix))


@needs_shaping
@pytest.mark.multiprocess
def test_tasks_on_emulated_hosts_talk_over_their_shaped_links():
    """Two hosts, two tasks each: a task is reached at its host's address, from its host's own
    namespace; 5 MB between hosts take at least 5 MB / rate, and 256 KiB are shaped too; within a
    host they are not shaped."""
    import numpy as np
    import tensorflow as tf
    from tfplace.runtime import netns
    from tfplace.runtime.local_cluster import LocalCluster
    cluster = _cluster([LinkEmulation(RATE_BYTES_PER_S)] * 2, devices_per_host=2)
    payload_bytes, small_bytes = 5_000_000, 262_144
    lc = LocalCluster.for_cluster(cluster)
    with lc:
        hosts = [a.split(":")[0] for a in lc.task_addresses]
        assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
        spaces = [os.readlink(f"/proc/{pid}/ns/net") for pid in lc.pids]
        assert spaces[0] == spaces[1] != spaces[2] == spaces[3]
        assert os.readlink("/proc/self/ns/net") not in spaces
        for pid in lc.pids:
            assert netns.non_loopback_listeners(pid) == []  # the hosts lead only to this run's switch
        g = tf.Graph()
        with g.as_default():
            with tf.device(lc.task_device(0)):
                x = tf.random.uniform([payload_bytes // 4])
            with tf.device(lc.task_device(0)):
                small = tf.random.uniform([small_bytes // 4])
            sums = []
            for task in (1, 2):  # the same host, then the other host
                with tf.device(lc.task_device(task)):
                    sums.append(tf.reduce_sum(x))
            with tf.device(lc.task_device(2)):
                sums.append(tf.reduce_sum(small))  # a message the size of a bucket's piece: shaped too
        took_s = []
        with lc.session(graph=g) as sess:
            for fetch in sums:
                sess.run(fetch)  # warm: channels open
                start = time.perf_counter()
                sess.run(fetch)
                took_s.append(time.perf_counter() - start)
        wire_s = payload_bytes / RATE_BYTES_PER_S
        print(f"links: 5 MB within a host {took_s[0] * 1e3:.0f} ms, between hosts {took_s[1] * 1e3:.0f} ms "
              f"(shaped rate: {wire_s * 1e3:.0f} ms); 256 KiB between hosts {took_s[2] * 1e3:.1f} ms")
        assert took_s[1] >= 0.9 * wire_s, took_s
        assert took_s[0] < 0.5 * wire_s, took_s
        # a deep token bucket would let 256 KiB through at loopback speed (no shaping below its depth)
        assert took_s[2] >= 0.6 * small_bytes / RATE_BYTES_PER_S, took_s
        assert len(_own_namespaces()) == 2
    assert _own_namespaces() == [] and netns.in_private_network()
    assert not [i for i in netns.interfaces() if i.startswith(links.PREFIX)]


@needs_shaping
@pytest.mark.multiprocess
def test_horovod_ranks_run_in_their_hosts_namespaces():
    """...under their CPU quotas too where quotas can be set: each rank checks its own limits
    from inside its host (a fresh /sys there would hide its cgroup)."""
    from tfplace.baselines.horovod_runner import run_horovod
    from tfplace.emulation import cpu_quota
    from tfplace.formats.cluster import Emulation
    from tfplace.graph_defs.export import ensure_bundle
    cluster = _cluster([LinkEmulation(RATE_BYTES_PER_S)] * 2)
    bundle = ensure_bundle("tiny_mlp", batch_size=16)
    quotas = cpu_quota.available()
    res = run_horovod(bundle, [8, 8], steps=2, warmup_steps=1, source=cluster.source,
                      emulation_per_rank=[Emulation(cpu_fraction=0.5)] * 2 if quotas else None,
                      host_links=links.host_layout(cluster, per="device"))
    if quotas:
        assert all(r["quota_us"] * 2 == r["period_us"] for r in res.rank_limits), res.rank_limits
    assert len(res.report.step_times_s) == 2 and all(t > 0 for t in res.report.step_times_s)
    spaces = [r["net_namespace"] for r in res.rank_limits]
    assert spaces[0] != spaces[1] and os.readlink("/proc/self/ns/net") not in spaces
    assert all(r["interfaces"] == ["lo", links.INTERFACE] for r in res.rank_limits), res.rank_limits
    assert _own_namespaces() == []


@needs_shaping
def test_a_failed_setup_leaves_no_host_behind(monkeypatch):
    """A command that fails halfway (here the second host's qdisc) raises with the command, and
    every namespace, veth and switch made before it is gone."""
    from tfplace.runtime import netns
    netns.ensure_private_network("the test's emulated hosts")
    real_run, calls = links._run, []

    def failing(cmd):
        calls.append(cmd)
        if cmd[:2] == ["tc", "-n"] and cmd[2].endswith("-h1"):
            raise links.LinkEmulationError(f"tfplace: link emulation: `{' '.join(cmd)}` failed: injected")
        real_run(cmd)
    monkeypatch.setattr(links, "_run", failing)
    with pytest.raises(links.LinkEmulationError, match="injected"):
        links.HostNetworks(links.host_layout(_cluster([LinkEmulation(RATE_BYTES_PER_S)] * 2)))
    assert any(c[:3] == ["ip", "netns", "add"] for c in calls)  # something was made before the failure
    assert _own_namespaces() == []
    assert not [i for i in netns.interfaces() if i.startswith(links.PREFIX)]
    assert not os.path.exists(links.ETC_NETNS_DIR) or not [
        n for n in os.listdir(links.ETC_NETNS_DIR) if n.startswith(f"{links.NETNS_PREFIX}{os.getpid()}-")]
