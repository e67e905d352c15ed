"""benchmarks/process_spread.py: each fresh process times the bundle's step and the parent prints
one line per process and the spread of their medians; bad arguments are refused."""

import os
import re

import pytest

import process_spread as ps

pytest.importorskip("tensorflow")
MLP = os.path.join("graph_defs", "zoo", "tiny_mlp_b16_sgd.json")  # committed


def test_each_process_times_the_step_and_the_spread_is_printed(capsys):
    assert ps.main(["--bundle", MLP, "--processes", "2", "--steps", "3", "--cpu", str(min(os.sched_getaffinity(0)))]) == 0
    out = capsys.readouterr().out
    medians = [float(x) for x in re.findall(r"process \d: median +([0-9.]+) ms", out)]
    assert len(medians) == 2 and all(m > 0 for m in medians)
    spread = float(re.search(r"spread \(max / min\) ([0-9.]+)", out).group(1))
    assert spread == pytest.approx(max(medians) / min(medians), rel=0.02)  # medians printed to 1 us
    faults = [float(x) for x in re.findall(r"([0-9.]+) page faults per step", out)]
    assert len(faults) == 2 and all(f >= 0 for f in faults)
    assert "steady allocator" in out


@pytest.mark.parametrize("argv", [["--processes", "0"], ["--bundle", "no/such/bundle.json"], ["--model", "vgg1000"],
                                  ["--allocator", "jemalloc"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit) as e:
        ps.main(argv)
    assert e.value.code == 2
