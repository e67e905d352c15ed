"""The per-core machine speed probe (tfplace.runtime.machine_speed) and how activate uses it:
slowdowns against each core's quiet speed, a probe that sees a core shared with other work, and
activate's rows that leave out the rounds measured while the machine ran slow."""

import json
import os
import statistics
import subprocess
import sys
import time

import pytest

from tfplace.runtime import machine_speed
from tfplace.runtime.machine_speed import SpeedWatch, cores_of, probe_core_s, slowdown_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("probes, reference, expected", [
    ([{0: 1.0, 1: 1.0}], {0: 1.0, 1: 1.0}, 1.0),                      # quiet
    ([{0: 1.0, 1: 2.0}], {0: 1.0, 1: 1.0}, 2.0),                      # one core slow
    ([{0: 1.0}, {0: 1.5}], {0: 1.0}, 1.5),                            # slow at the window's end
    ([{0: 0.5}], {0: 1.0}, 1.0),                                      # faster than known: not < 1
    ([{0: 3.0, 7: 9.0}], {0: 2.0}, 1.5),                              # a core without reference
    ([], {0: 1.0}, 1.0),                                              # no probe (Horovod without watch)
])
def test_slowdown_is_the_worst_probe_over_its_cores_quiet_speed(probes, reference, expected):
    assert slowdown_of(probes, reference) == pytest.approx(expected)


def test_the_quiet_speed_is_each_cores_fastest_probe():
    seconds = iter([2.0, 3.0, 1.0, 3.0, 1.5, 6.0])
    watch = SpeedWatch([0, 1], probe_fn=lambda core: next(seconds))
    first = watch.probe()
    assert first == {0: 2.0, 1: 3.0} and watch.slowdown(first) == 1.0
    watch.probe()
    assert watch.reference_s == {0: 1.0, 1: 3.0}
    last = watch.probe()
    assert watch.reference_s == {0: 1.0, 1: 3.0}
    assert watch.slowdown(first, last) == pytest.approx(2.0)  # core 1: 6.0 against 3.0


def test_cores_are_the_emulated_ones_or_every_allowed_core():
    from tfplace.formats.cluster import load_cluster
    allowed = sorted(os.sched_getaffinity(0))
    hetero = load_cluster(os.path.join(ROOT, "clusters", "local_cpu_hetero.json"))
    plain = load_cluster(os.path.join(ROOT, "clusters", "local_cpu.json"))
    assert cores_of(hetero) == [c for c in (0, 1) if c in allowed]
    assert cores_of(plain) == allowed[:machine_speed.MAX_UNPINNED_CORES]


@pytest.mark.parametrize("allowed, pinned, expected", [
    (range(32), None, list(range(8))),          # unpinned on a large machine: the first 8
    (range(4), [[3], [1, 2]], [1, 2, 3]),       # the pinned ones, sorted
    (range(2), [[0], [5]], [0]),                # one this process may not use: left out
])
def test_the_probed_cores(monkeypatch, allowed, pinned, expected):
    from types import SimpleNamespace as NS
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(allowed))
    devices = [NS(emulation=NS(cpus=tuple(c))) for c in pinned] if pinned else [NS(emulation=None)]
    assert cores_of(NS(devices=devices)) == expected


def _hog(core):
    return subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])


def test_the_probe_sees_a_core_shared_with_other_work():
    core = sorted(os.sched_getaffinity(0))[0]
    before = os.sched_getaffinity(0)
    hogs = []
    try:
        alone, shared = [], []
        for _ in range(3):  # alternated, so a drift of the host touches both
            alone.append(probe_core_s(core))
            hogs = [_hog(core), _hog(core)]
            time.sleep(0.5)  # both started and spinning
            shared.append(probe_core_s(core))
            for h in hogs:
                h.kill()
                h.wait()
            hogs = []
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert os.sched_getaffinity(0) == before, "the probe gives the thread its cores back"
    # two busy processes on the core leave the probe about a third of it
    assert statistics.median(shared) > 1.6 * statistics.median(alone), (alone, shared)


def _row(means, probes, simulated_s=1.0):
    return {"name": "e", "simulated_s": simulated_s, "rounds": [
        {"step_times_s": [m], "mean_s": m, "std_s": 0.0, "probes_s": p} for m, p in zip(means, probes)]}


QUIET, SLOW = [{"0": 1.0}, {"0": 1.0}], [{"0": 1.0}, {"0": 2.0}]


@pytest.mark.parametrize("means, probes, reference, median, disturbed", [
    ([3.0, 1.0, 2.0], [QUIET, QUIET, QUIET], {0: 1.0}, 2.0, 0),       # the plain median
    ([3.0, 1.0, 2.0], [SLOW, QUIET, QUIET], {0: 1.0}, 1.0, 1),        # of the two quiet rounds
    ([3.0, 1.0, 2.0], [QUIET, SLOW, QUIET], {0: 1.0}, 2.0, 1),
    ([3.0, 1.0, 2.0], [SLOW, SLOW, SLOW], {0: 1.0}, 2.0, 3),          # none quiet: all count
    ([3.0, 1.0, 2.0], [QUIET, QUIET, QUIET], {0: 0.5}, 2.0, 3),       # a faster core seen later
    ([3.0, 1.0, 2.0], [SLOW, QUIET, QUIET], {}, 2.0, 0),              # no reference: not judged
])
def test_a_row_counts_its_quiet_rounds(means, probes, reference, median, disturbed):
    from tfplace.cli.activate import _settle
    row = _row(means, probes)
    _settle(row, reference)
    assert row["mean_s"] == median and row["ratio"] == pytest.approx(1.0 / median)
    assert row["disturbed_rounds"] == disturbed and row["round_means_s"] == means
    assert [x["disturbed"] for x in row["rounds"]] == [x["machine_slowdown"] > 1.3 for x in row["rounds"]]


@pytest.mark.multiprocess
def test_activate_leaves_out_a_round_run_on_a_slowed_machine(tmp_path, monkeypatch):
    from tfplace.cli.activate import run
    first_core = sorted(os.sched_getaffinity(0))[0]
    probes = []

    def probe(core, **_):  # the machine is slow at the end of the second round's window only
        if core == first_core:
            probes.append(core)
        return 2.0 if len(probes) == 7 else 1.0  # 3 to calibrate, then before and after each round
    monkeypatch.setattr(machine_speed, "probe_core_s", probe)
    cfg = tmp_path / "activate_config.txt"
    cfg.write_text(json.dumps({
        "format": "tfplace.activate_config", "cluster": os.path.join(ROOT, "clusters", "local_cpu.json"),
        "baselines": ["single"], "graphs": [{"model": "tiny_mlp", "batch_size": 16}],
        "steps": 2, "warmup_steps": 1, "rounds": 3, "output_dir": str(tmp_path / "out"), "trace": False}))
    import io
    text = io.StringIO()
    (row,) = run(str(cfg), out=text)
    assert [x["disturbed"] for x in row["rounds"]] == [False, True, False]
    quiet = sorted(x["mean_s"] for x in row["rounds"] if not x["disturbed"])
    assert row["mean_s"] == quiet[0]  # the lower middle of the two quiet rounds
    assert "(round 2 of 3)" in text.getvalue() and "2.00x slower" in text.getvalue()
    assert "1 of 3 rounds on a slowed machine, left out" in text.getvalue()
    with open(tmp_path / "out" / "results.json") as f:
        results = json.load(f)
    assert results["core_quiet_s"] == {str(c): 1.0 for c in cores_of(None)}
    saved = results["results"][0]
    assert [x["disturbed"] for x in saved["rounds"]] == [False, True, False]
    assert saved["rounds"][1]["machine_slowdown"] == pytest.approx(2.0)
