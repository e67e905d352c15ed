"""benchmarks/message_probe.py: the hop cost it prints is the cross-task chain less the same chain
on one task, so it is a message's cost, positive, and grows with the bytes moved. Multi-process."""

import pytest

from tfplace.runtime.local_cluster import LocalCluster

import message_probe as probe

pytestmark = pytest.mark.multiprocess
pytest.importorskip("tensorflow")


def test_a_hop_between_tasks_costs_a_message_and_more_for_4_mib():
    with LocalCluster(num_tasks=3, threads_per_task=[1, 1, 1], inter_threads_per_task=[1, 1, 1]) as lc:
        small = probe.hop_seconds(lc, ((1, 2),), 16, hops=4, steps=5)
        large = probe.hop_seconds(lc, ((1, 2),), 4 << 20, hops=4, steps=5)
        both = probe.hop_seconds(lc, ((1, 2), (0, 1)), 16, hops=4, steps=5)
    # a gRPC message on loopback costs tens of microseconds at least; moving 4 MiB more than 16 B
    assert 5e-6 < small < 0.1 and large > small and both > 0
