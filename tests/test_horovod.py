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
