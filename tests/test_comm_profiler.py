"""Communication profiling: the latency + bandwidth fit on synthetic points, and a short real
sweep (p2p and a 2-task all-reduce) on a local cluster."""

import pytest

from tfplace.profiling import comm_profiler
from tfplace.formats.errors import InputError
from tfplace.formats.profile import CommModel, Profile


def test_fit_recovers_latency_and_bandwidth_despite_an_outlier():
    lat, bw = 50e-6, 2.5e9
    sizes = comm_profiler.message_sizes(4096, 64 << 20)
    assert sizes == [4096 * 4 ** k for k in range(8)]  # 4 KiB ... 64 MiB
    points = [(s, lat + s / bw) for s in sizes]
    points[3] = (points[3][0], points[3][1] * 3.0)  # one disturbed step
    fit = comm_profiler.fit_linear(points)
    assert fit.latency_s == pytest.approx(lat, rel=0.05)
    assert fit.bandwidth_bytes_per_s == pytest.approx(bw, rel=0.02)


def test_fit_needs_two_points():
    with pytest.raises(InputError, match="points"):
        comm_profiler.fit_linear([(4096, 1e-4)])
    with pytest.raises(InputError, match="max_bytes"):
        comm_profiler.message_sizes(4096, 1024)


def test_comm_model_round_trips_through_profile_json(tmp_path):
    from tfplace.formats.profile import LinearCost, load_profile, save_profile
    comm = CommModel(p2p=LinearCost(5e-5, 2.5e9), allreduce={2: LinearCost(7e-4, 6e8), 3: LinearCost(1e-3, 4e8)})
    save_profile(Profile(ops={}, comm=comm), tmp_path / "c.json")
    assert load_profile(tmp_path / "c.json").comm == comm


@pytest.mark.multiprocess
def test_short_sweep_on_a_local_cluster():
    pytest.importorskip("tensorflow")
    m = comm_profiler.measure_comm(sizes=[4096, 1 << 20, 4 << 20], group_sizes=(2,), repeats=2, warmup=1)
    assert [b for b, _ in m.p2p] == [4096, 1 << 20, 4 << 20]
    assert all(t > 0 for _, t in m.p2p) and all(t > 0 for _, t in m.allreduce[2])
    assert m.p2p[-1][1] > m.p2p[0][1]  # 4 MB takes longer than 4 KB
    assert m.model.p2p.bandwidth_bytes_per_s > 1e7 and m.model.allreduce[2].latency_s >= 0
    text = comm_profiler.format_fits(m)
    assert "p2p" in text and "all-reduce x2" in text
