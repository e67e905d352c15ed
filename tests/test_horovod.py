"""Horovod data parallelism for real (multi-process: horovodrun --gloo on 127.0.0.1).

The equivalence test: 2 ranks with uneven batches (5 and 11 of 16), 2 training steps, against
the unmodified graph trained on the concatenated 16-sample batches in one process. With the
sample weights n_r·N/Σn the variables agree to float32 round-off (relative error <= 1e-5, also on
the change the two steps made); the naive average (weight 1) is the negative control and misses.
"""

import os

import numpy as np
import pytest

from tfplace.baselines import horovod_runner, registry
from tfplace.baselines.horovod_worker import reference_training

pytestmark = pytest.mark.multiprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_MLP = os.path.join(REPO, "graph_defs", "zoo", "tiny_mlp_b16_sgd.json")


def _relative_error(got, want):
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


@pytest.fixture(scope="module")
def reference():
    return reference_training(TINY_MLP, steps=2, batch_size=16), reference_training(TINY_MLP, steps=0, batch_size=16)


@pytest.mark.parametrize("batches, weighted, should_match", [
    ((5, 11), True, True),     # proportional-style uneven batches, sample-weighted
    ((8, 8), True, True),      # even batches
    ((5, 11), False, False),   # negative control: plain average of uneven batches
])
def test_one_step_equals_the_global_batch_step(tmp_path, reference, batches, weighted, should_match):
    final, initial = reference
    result = horovod_runner.run_horovod(TINY_MLP, batches, steps=2, warmup_steps=0, dump_variables=True,
                                        out_dir=str(tmp_path), sample_weighted=weighted, timeout_s=300)
    got = np.load(result.variables_path)
    worst = 0.0
    for name, want in final.items():
        value = got[name.replace("/", "__")]
        worst = max(worst, _relative_error(value, want), _relative_error(value - initial[name], want - initial[name]))
    if should_match:
        assert worst <= 1e-5
    else:
        assert worst > 1e-3
    assert result.steps == 2 and len(result.step_times_s) == 2 and result.batch_per_rank == batches


def test_runtime_baseline_report_with_thread_limits():
    result = registry.run_runtime_baseline("horovod_proportional", TINY_MLP, 16, 2, weights=[3, 1], steps=3,
                                           warmup_steps=1, threads_per_rank=[(2, 1), (1, 1)],
                                           device_names=["cpu0", "cpu1"], timeout_s=300)
    assert result.batch_per_rank == (12, 4) and result.threads_per_rank == ((2, 1), (1, 1))
    assert result.report.device_names == ("cpu0", "cpu1") and len(result.report.step_times_s) == 3
    assert result.mean_s > 0 and result.std_s >= 0 and len(result.losses) == 4
    assert all(len(t) == 3 for t in result.rank_step_times_s)


def test_failure_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"graph_file": "missing.pb", "inputs": []}')
    with pytest.raises(horovod_runner.HorovodError, match="exited with status"):
        horovod_runner.run_horovod(str(bad), [2, 2], steps=1, warmup_steps=0, timeout_s=120)


def _listening(pids):
    """(pid, ip, port) of every TCP socket in LISTEN state that one of `pids` holds."""
    import psutil
    out = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            out.add((conn.pid, conn.laddr.ip, conn.laddr.port))
    return out


@pytest.mark.skipif(not __import__("tfplace.emulation.cpu_quota", fromlist=["available"]).available(),
                    reason="CPU quotas need writable cgroups with the cpu controller (root)")
@pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="local_cpu_hetero.json pins ranks to cores 0 and 1")
def test_ranks_run_under_their_devices_emulation_and_listen_on_loopback_only():
    # 3 ranks on clusters/local_cpu_hetero.json: each rank reports the affinity and the cgroup
    # quota the kernel applies to it; meanwhile every listening socket of this process (the
    # rendezvous server) and of the ranks (Gloo) is sampled: all must be on 127.0.0.1.
    import threading
    import psutil
    from tfplace.formats.cluster import load_cluster
    cluster = load_cluster(os.path.join(REPO, "clusters", "local_cpu_hetero.json"))
    seen, done = set(), threading.Event()

    def sample():
        me = psutil.Process()
        while not done.is_set():
            try:
                pids = {me.pid} | {p.pid for p in me.children(recursive=True)}
                seen.update(_listening(pids))
            except psutil.Error:
                pass
            done.wait(0.05)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = horovod_runner.run_horovod(TINY_MLP, [8, 4, 4], steps=2, warmup_steps=0, timeout_s=300,
                                            emulation_per_rank=[d.emulation for d in cluster.devices],
                                            source=cluster.source, device_names=cluster.device_names)
    finally:
        done.set()
        sampler.join()
    limits = result.rank_limits
    assert [tuple(r["cpus"]) for r in limits] == [(0,), (1,), (1,)]
    assert limits[0]["quota_us"] is None
    for r in limits[1:]:
        assert r["quota_us"] / r["period_us"] == pytest.approx(0.5) and r["cgroup"]
    assert limits[1]["cgroup"] != limits[2]["cgroup"] and not any(os.path.isdir(r["cgroup"]) for r in limits[1:])
    assert len(result.step_times_s) == 2
    rank_sockets = {s for s in seen if s[0] != os.getpid()}
    assert rank_sockets, "no rank was seen listening (Gloo)"
    assert {ip for _, ip, _ in seen} == {"127.0.0.1"}, seen


def test_emulation_that_cannot_be_applied_starts_no_rank(tmp_path, monkeypatch):
    from tfplace.emulation import cpu_quota
    from tfplace.formats.cluster import Emulation
    from tfplace.formats.errors import InputError
    monkeypatch.setattr(cpu_quota, "available", lambda: False)
    monkeypatch.setattr(horovod_runner.subprocess, "Popen", lambda *a, **k: pytest.fail("a rank was started"))
    with pytest.raises(InputError) as e:
        horovod_runner.run_horovod(TINY_MLP, [8, 8], steps=1, out_dir=str(tmp_path), source="hetero.json",
                                   emulation_per_rank=[None, Emulation(cpus=(0,), cpu_fraction=0.5)])
    assert (e.value.source, e.value.field) == ("hetero.json", "devices[1].emulation.cpu_fraction")
