"""Training end to end through the CLI: outputs, and resume after a kill with no lost progress."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDED_ACTIONS = ("proportional action", "single-device action")  # train_lib.seed_pool


def _config(tmp_path, steps):
    cfg = {"format": "tfplace.train_config", "version": 1,
           "graphs": [{"graph": os.path.join(REPO, "graph_defs/zoo/tiny_mlp_b16_sgd.json"), "batch_size": 16}],
           "clusters": [os.path.join(REPO, "clusters/two_kind_4gpu.json")], "max_groups": 16,
           "budget": {"steps": steps}, "checkpoint_every_steps": 3, "seed": 3,
           "network": {"hidden_size": 16, "num_message_passing_steps": 1, "mlp_layers": 1},
           "rl": {"samples_per_step": 2}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _cmd(config, out):
    return [sys.executable, "-m", "tfplace.train", "--config", config, "--output_dir", out, "--noprogress"]


def _state(out):
    with open(os.path.join(out, "state.json")) as f:
        return json.load(f)


@pytest.mark.slow
def test_train_is_killed_and_resumes_without_losing_progress(tmp_path):
    config, out = _config(tmp_path, 14), str(tmp_path / "run")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(_cmd(config, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(os.path.join(out, "state.json")) and _state(out)["step"] >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = _state(out)
    assert 3 <= killed["step"] < 14
    label = killed["labels"][0]
    best_at_kill = killed["tasks"][label]["pool"]["entries"][0]["effective_time_s"]
    done = subprocess.run(_cmd(config, out), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resumed from step {killed['step']}" in done.stderr
    final = _state(out)
    assert final["step"] == 14
    rows = final["tasks"][label]["log"]
    assert [int(r[0]) for r in rows] == list(range(1, 15))  # step counter continued, nothing lost or repeated
    best = [r[3] for r in rows]
    assert all(b2 <= b1 for b1, b2 in zip(best, best[1:]))
    assert best[-1] <= best_at_kill
    folder = os.path.join(out, label)
    for name in ("time.log", "best_time.log", "best_strategy.json", "best_trace.json", "training.png"):
        assert os.path.getsize(os.path.join(folder, name)) > 0
    with open(os.path.join(folder, "best_time.log")) as f:
        report = json.load(f)
    # the report is the pool's best after the resume, credited to what produced it
    assert report["time_s"] == final["tasks"][label]["pool"]["entries"][0]["time_s"]
    assert re.fullmatch(r"(sample|greedy|local search) step \d+", report["source"]) \
        or report["source"] in report["baselines"] or report["source"] in SEEDED_ACTIONS, report["source"]
    if report["source"] in report["baselines"]:
        assert report["time_s"] == report["baselines"][report["source"]]["time_s"]
    with open(os.path.join(folder, "best_strategy.json")) as f:
        assert json.load(f) == report["strategy"]
    feasible = {n: b["time_s"] for n, b in report["baselines"].items() if not b["oom"]}
    assert report["best_baseline"] == min(feasible, key=feasible.get)
    for name, t in feasible.items():  # speed-ups over each baseline, by hand
        assert report["speedups"][name] == pytest.approx(t / report["time_s"])
