"""The all-reduce's cost as the rewrite emits it: a ring among GPUs, the exchange among CPU devices."""

import numpy as np
import pytest

from tfplace.formats.cluster import Device, Host, build_cluster
from tfplace.lowering.costs import LinkCosts

BW, LAT = 1e9, 1e-4


def _cluster(kind: str, n: int):
    host = Host(name="h0", nic_bandwidth_bytes_per_s=BW, nic_latency_s=LAT,
                intra_bandwidth_bytes_per_s=BW, intra_latency_s=LAT)
    return build_cluster(f"{n}x{kind}", [host], [Device(f"d{i}", kind, "h0", 8 << 30, task=i) for i in range(n)])


@pytest.mark.parametrize("kind, n, latency_steps", [
    ("CPU", 2, 2), ("CPU", 3, 2), ("CPU", 5, 2),   # the exchange: two rounds of messages sent at once
    ("V100", 2, 2), ("V100", 3, 4), ("V100", 5, 8),  # a ring: 2(n-1) steps
])
def test_an_all_reduce_costs_its_bytes_and_its_latency_steps(kind, n, latency_steps):
    links = LinkCosts(_cluster(kind, n), None, device_ports=False)
    cid = links.collective(list(range(n)))
    nbytes = 8e6
    got = float(links.collective_seconds(np.array([cid]), np.array([nbytes]))[0])
    want = 2 * (n - 1) / n * nbytes / links.coll_bw[cid] + latency_steps * links.coll_lat[cid]
    assert got == pytest.approx(want, rel=1e-12)
    assert links.coll_lat[cid] > 0


def test_a_group_with_a_gpu_is_a_ring():
    host = Host(name="h0", nic_bandwidth_bytes_per_s=BW, nic_latency_s=LAT,
                intra_bandwidth_bytes_per_s=BW, intra_latency_s=LAT)
    cluster = build_cluster("mixed", [host], [Device("c0", "CPU", "h0", 8 << 30, task=0),
                                              Device("c1", "CPU", "h0", 8 << 30, task=1),
                                              Device("g0", "V100", "h0", 8 << 30, task=2)])
    links = LinkCosts(cluster, None, device_ports=False)
    assert links.coll_steps[links.collective([0, 1, 2])] == 4
    assert links.coll_steps[links.collective([0, 1])] == 2
