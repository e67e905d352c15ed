"""Training under faults, by category (tfplace.policy.train_lib, tfplace.cli.train):

  resume  a damaged state or checkpoint falls back to the newest usable one and logs why, or stops
          with one error; a config that changed since the run was checkpointed is refused (exit 2)
          before any training; SIGTERM checkpoints, exits 143, and the run resumes from there; a
          second run on an output folder in use stops (exit 2);
  value   a run whose best strategy runs out of memory fails (exit 1) unless the config accepts it,
          and the summary says INFEASIBLE either way.

Runs go through the command line in-process (tfplace.cli.common.call), except the SIGTERM case,
which needs a process to signal, and the lock's holder. The runs are tiny: the tiny MLP on a 4-GPU cluster, 2 steps.
"""

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
GRAPH = os.path.join(REPO, "graph_defs", "zoo", "tiny_mlp_b16_sgd.json")
OTHER_GRAPH = os.path.join(REPO, "graph_defs", "zoo", "tiny_cnn_b16_s16_sgd.json")  # committed, as GRAPH
CLUSTER = os.path.join(REPO, "clusters", "two_kind_4gpu.json")
LABEL = "tiny_mlp_b16_sgd_b16"
STEPS = 2  # the base runs checkpoint every step: checkpoints 1 and 2 are on disk


def _bundle(folder, bundle=GRAPH):
    """A copy of a zoo bundle (.json and its .pb) in folder/graphs/: the test owns its inputs (a
    re-export of the zoo by another process must not change them under it)."""
    os.makedirs(folder / "graphs", exist_ok=True)
    for path in (bundle, bundle[:-len(".json")] + ".pb"):
        shutil.copy(path, folder / "graphs")
    return str(folder / "graphs" / os.path.basename(bundle))


def _config(folder, name="config.json", cluster=None, graph=None, **changes):
    """A tiny train config in `folder` (its cluster.json and graphs/ unless given)."""
    graph = graph or str(folder / "graphs" / os.path.basename(GRAPH))
    cfg = {"format": "tfplace.train_config", "version": 1,
           "graphs": [{"graph": graph, "batch_size": 16}], "clusters": [cluster or str(folder / "cluster.json")],
           "max_groups": 16, "budget": {"steps": STEPS}, "checkpoint_every_steps": 1, "seed": 3,
           "network": {"hidden_size": 16, "num_message_passing_steps": 1, "mlp_layers": 1},
           "rl": {"samples_per_step": 2}}
    cfg.update(changes)
    path = folder / name
    path.write_text(json.dumps(cfg))
    return str(path)


def _cluster(folder, memory_bytes=None, devices=4, name="cluster.json"):
    with open(CLUSTER) as f:
        cluster = json.load(f)
    cluster["devices"] = cluster["devices"][:devices]
    for d in cluster["devices"]:
        d["memory_bytes"] = memory_bytes or d["memory_bytes"]
    (folder / name).write_text(json.dumps(cluster))
    return str(folder / name)


def _train(config, out):
    """(exit status, what it printed: stdout then stderr) of `python -m tfplace.train --config config
    --output_dir out`, in-process."""
    from tfplace.cli import common, train
    err, out_text = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out_text):
        status = common.call(train, ["--config", config, "--output_dir", out, "--noprogress"])
    return status, out_text.getvalue() + err.getvalue()


def _state(out, name="state.json"):
    with open(os.path.join(out, name)) as f:
        return json.load(f)


def _errors(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A finished feasible run: (folder with config.json and cluster.json, run dir)."""
    folder = tmp_path_factory.mktemp("base")
    _cluster(folder)
    _bundle(folder)
    out = str(folder / "run")
    status, stderr = _train(_config(folder), out)
    assert status == 0, stderr[-3000:]
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == [
        f"ckpt-{s}.{k}" for s in (1, 2) for k in ("data-00000-of-00001", "index", "state.json")]
    return folder, out


@pytest.fixture(scope="module")
def tiny_memory_files():
    """Lets this module's cluster files give 2 kB devices. A cluster file refuses memory under 1 MB
    (taken for GB written as bytes), but the tiny MLP needs far less than 1 MB: only devices this
    small make every strategy run out of memory."""
    from tfplace.formats import cluster
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cluster, "MIN_FILE_MEMORY_BYTES", 1000)
        yield


@pytest.fixture(scope="module")
def oom_run(tmp_path_factory, tiny_memory_files):
    """A fresh run where every strategy runs out of memory (2 kB per device): (folder, run, status, stderr)."""
    folder = tmp_path_factory.mktemp("oom")
    _cluster(folder, memory_bytes=2000)
    _bundle(folder)
    out = str(folder / "run")
    status, stderr = _train(_config(folder), out)
    return folder, out, status, stderr


def _copy_run(base, tmp_path):
    """A copy of a base run and its inputs in tmp_path; returns the run dir."""
    folder, out = base[:2]
    shutil.copy(folder / "cluster.json", tmp_path / "cluster.json")
    shutil.copytree(folder / "graphs", tmp_path / "graphs")
    shutil.copytree(out, tmp_path / "run")
    return str(tmp_path / "run")


# ---- resume: damaged state or checkpoint -------------------------------------------------------
def _edit_json(path, edit):
    with open(path) as f:
        state = json.load(f)
    state = edit(state)
    with open(path, "w") as f:
        json.dump(state, f)


def _newest_states(out):
    return [os.path.join(out, "state.json"), os.path.join(out, "checkpoints", f"ckpt-{STEPS}.state.json")]


def _truncate(path, keep=0.5):
    with open(path, "r+b") as f:
        f.truncate(int(os.path.getsize(path) * keep))


def _overwrite(path, data=b"\x17garbage" * 64):
    with open(path, "r+b") as f:
        f.write(data)


def _on_newest(action):
    return lambda out: [action(p) for p in _newest_states(out)]


def _ckpt(out, step, ext):
    return os.path.join(out, "checkpoints", f"ckpt-{step}.{ext}")


def _drop(key):
    def edit(state):
        del state[key]
        return state
    return _on_newest(lambda p: _edit_json(p, edit))


def _set(key, value):
    return _on_newest(lambda p: _edit_json(p, lambda s: {**s, key: value}))


def _damage_pool(state):
    state["tasks"][LABEL]["pool"]["entries"][0]["strategy"] = "not a strategy"
    return state


def _remove_states(out):
    for name in os.listdir(os.path.join(out, "checkpoints")):
        if name.endswith(".state.json"):
            os.remove(os.path.join(out, "checkpoints", name))
    os.remove(os.path.join(out, "state.json"))


# name -> (damage(out), expected): ("resume", step, text the log must show) or
# ("error", file named by the one error line, text it must show)
DAMAGE = {
    "state.json truncated": (lambda out: _truncate(os.path.join(out, "state.json")),
                             ("resume", 2, "passed over state.json: line ")),
    "state.json not JSON": (lambda out: open(os.path.join(out, "state.json"), "w").write("{garbage"),
                            ("resume", 2, "not valid JSON")),
    "state.json gone": (lambda out: os.remove(os.path.join(out, "state.json")),
                        ("resume", 2, "(checkpoints/ckpt-2.state.json, ckpt-2)")),
    "newest states truncated": (_on_newest(_truncate),
                                ("resume", 1, "passed over checkpoints/ckpt-2.state.json: line ")),
    "newest states empty": (_on_newest(lambda p: open(p, "w").close()), ("resume", 1, "the file is empty")),
    "newest states a list": (_on_newest(lambda p: open(p, "w").write("[1, 2]")),
                             ("resume", 1, "must be a JSON object, got list")),
    "field missing": (_drop("rng"), ("resume", 1, "rng: is missing")),
    "field of the wrong type": (_set("step", "two"), ("resume", 1, "step: must be an integer")),
    "rng state damaged": (_set("rng", {"bit_generator": "PCG64"}), ("resume", 1, "rng: is not a numpy generator")),
    "pool damaged": (_on_newest(lambda p: _edit_json(p, _damage_pool)),
                     ("resume", 1, f"tasks.{LABEL}.pool: is not a strategy pool")),
    "TF checkpoint missing": (lambda out: [os.remove(_ckpt(out, 2, e)) for e in ("index", "data-00000-of-00001")],
                              ("resume", 1, "ckpt-2.index is missing")),
    "TF index truncated": (lambda out: _truncate(_ckpt(out, 2, "index")), ("resume", 1, "ckpt-2 cannot be read")),
    "TF data garbage": (lambda out: _overwrite(_ckpt(out, 2, "data-00000-of-00001")),
                        ("resume", 1, "ckpt-2 cannot be read")),
    "TF data truncated": (lambda out: _truncate(_ckpt(out, 2, "data-00000-of-00001"), 0.3),
                          ("resume", 1, "ckpt-2 cannot be read")),
    "checkpoints folder gone": (lambda out: shutil.rmtree(os.path.join(out, "checkpoints")),
                                ("error", "state.json", "no usable checkpoint to resume from")),
    "every TF checkpoint damaged": (lambda out: [_overwrite(_ckpt(out, s, "index")) for s in (1, 2)],
                                    ("error", "state.json", "ckpt-1 cannot be read")),
    "state files gone, TF checkpoints left": (_remove_states, ("error", "checkpoints", "no state file")),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_resume_falls_back_past_damage_or_stops_with_one_error(case, base, tmp_path):
    damage, (outcome, where, text) = DAMAGE[case]
    out = _copy_run(base, tmp_path)
    damage(out)
    before = sorted(os.listdir(out))
    status, stderr = _train(_config(tmp_path), out)
    assert "Traceback" not in stderr
    if outcome == "resume":
        assert status == 0, stderr[-3000:]
        assert f"resumed from step {where} " in stderr and text in stderr, stderr[-3000:]
        assert _state(out)["step"] == STEPS  # it trains the rest of the budget from there
        return
    assert status == 2, stderr[-3000:]
    errors = _errors(stderr)
    assert len(errors) == 1 and text in errors[0], stderr[-3000:]
    named = errors[0][len("error: "):].split(":")[0]
    assert named == os.path.join(out, where)
    assert f"delete {out} to start over" in errors[0]
    assert sorted(os.listdir(out)) == before  # nothing written


def test_after_a_fallback_the_damaged_checkpoint_is_replaced_and_two_are_kept(base, tmp_path):
    out = _copy_run(base, tmp_path)
    _truncate(_ckpt(out, 2, "index"))
    status, stderr = _train(_config(tmp_path, budget={"steps": 3}), out)
    assert status == 0 and "resumed from step 1 " in stderr, stderr[-3000:]
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == [
        f"ckpt-{s}.{k}" for s in (2, 3) for k in ("data-00000-of-00001", "index", "state.json")]
    assert [int(r[0]) for r in _state(out)["tasks"][LABEL]["log"]] == [1, 2, 3]
    status, stderr = _train(_config(tmp_path, budget={"steps": 3}), out)  # the new ones read back
    assert status == 0 and "resumed from step 3 (state.json" in stderr and "passed over" not in stderr


# ---- resume: the config changed ----------------------------------------------------------------
def _old_format(out):
    """A run as version 1 wrote it: state.json without a fingerprint, no state file per checkpoint."""
    _edit_json(os.path.join(out, "state.json"), lambda s: {k: v for k, v in s.items() if k != "fingerprint"}
               | {"version": 1})
    for name in os.listdir(os.path.join(out, "checkpoints")):
        if name.endswith(".state.json"):
            os.remove(os.path.join(out, "checkpoints", name))


# name -> (config for the resumed run (tmp folder -> path), damage of the run or None,
#          expected: ("refused", file, field) or ("resumed", final step))
CHANGES = {
    "cluster memory changed": (lambda d: _config(d, cluster=_cluster(d, memory_bytes=8 * 10**9, name="c2.json")),
                               None, ("refused", "config", "clusters[0]")),
    "cluster lost a device": (lambda d: _config(d, cluster=_cluster(d, devices=3, name="c2.json")),
                              None, ("refused", "config", "clusters[0]")),
    "graph changed": (lambda d: _config(d, graph=_bundle(d, OTHER_GRAPH)), None, ("refused", "config", "graphs[0]")),
    "learning rate changed": (lambda d: _config(d, rl={"samples_per_step": 2, "learning_rate": 0.01}), None,
                              ("refused", "config", "rl")),
    "seed changed": (lambda d: _config(d, seed=4), None, ("refused", "config", "seed")),
    "old run without a fingerprint": (_config, _old_format, ("refused", "state", "version")),
    "budget and checkpoint period changed": (lambda d: _config(d, budget={"steps": 3}, checkpoint_every_steps=5),
                                             None, ("resumed", 3)),
    "same cluster, another path": (lambda d: _config(d, cluster=_cluster(d, name="renamed.json"),
                                                     accept_infeasible=True), None, ("resumed", 2)),
}


@pytest.mark.parametrize("case", sorted(CHANGES))
def test_resume_refuses_a_changed_config_before_any_training(case, base, tmp_path):
    make_config, damage, expected = CHANGES[case]
    out = _copy_run(base, tmp_path)
    config = make_config(tmp_path)
    if damage:
        damage(out)
    before = _mtimes(out)
    status, stderr = _train(config, out)
    assert "Traceback" not in stderr
    if expected[0] == "resumed":
        assert status == 0 and f"resumed from step {STEPS} " in stderr, stderr[-3000:]
        assert _state(out)["step"] == expected[1]
        return
    _, source, field = expected
    errors = _errors(stderr)
    assert status == 2 and len(errors) == 1, stderr[-3000:]
    named = config if source == "config" else os.path.join(out, "state.json")
    assert errors[0].startswith(f"error: {named}: {field}: "), errors[0]
    assert errors[0].endswith(f"Fix: use a new output_dir, or delete {out} to start over"), errors[0]
    assert " ops, " not in stderr  # refused before the tasks were built
    assert _mtimes(out) == before


def _mtimes(out):
    """Modification time of each file in a run dir but the lock (every run rewrites its pid)."""
    return {n: os.path.getmtime(os.path.join(out, n)) for n in os.listdir(out) if n != ".tfplace.lock"}


# ---- resume: one run per output folder ---------------------------------------------------------
def test_a_second_run_on_an_output_folder_in_use_stops_before_any_work(tmp_path):
    _cluster(tmp_path)
    _bundle(tmp_path)
    config, out = _config(tmp_path), str(tmp_path / "run")
    os.makedirs(out)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from tfplace.cli.common import OutputLock\n"
                               f"with OutputLock({out!r}, 'x'):\n"
                               "    print('held', flush=True); sys.stdin.read()"],
                              cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        status, stderr = _train(config, out)
    finally:
        holder.stdin.close()
        holder.wait(30)
    errors = _errors(stderr)
    assert status == 2 and len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert errors[0].startswith(f"error: {config}: output_dir: {out} is in use by another run (pid {holder.pid})")
    assert os.listdir(out) == [".tfplace.lock"]  # nothing trained, nothing logged


# ---- resume: SIGTERM ---------------------------------------------------------------------------
def test_sigterm_checkpoints_exits_143_and_the_run_resumes_from_that_step(tmp_path):
    _cluster(tmp_path)
    _bundle(tmp_path)
    # 40 steps print a progress line every 2; the checkpoint period is never reached before the signal
    config, out = _config(tmp_path, budget={"steps": 40}, checkpoint_every_steps=50), str(tmp_path / "run")
    cmd = [sys.executable, "-m", "tfplace.train", "--config", config, "--output_dir", out]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen, deadline = [], time.time() + 120
    try:
        while time.time() < deadline:
            line = proc.stderr.readline()
            seen.append(line)
            if not line or line.startswith("[step "):
                break
        assert seen[-1].startswith("[step "), "".join(seen)[-3000:]
        assert not os.path.exists(os.path.join(out, "state.json"))
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = "".join(seen) + rest
    assert proc.returncode == 143 and "Traceback" not in stderr, stderr[-3000:]
    step = _state(out)["step"]
    assert 0 < step < 40 and f"stopped by SIGTERM at step {step}: checkpoint saved" in stderr, stderr[-3000:]
    config = _config(tmp_path, "more.json", budget={"steps": step + 2}, checkpoint_every_steps=50)
    status, stderr = _train(config, out)
    assert status == 0 and f"resumed from step {step} " in stderr, stderr[-3000:]
    final = _state(out)
    assert final["step"] == step + 2
    assert [int(r[0]) for r in final["tasks"][LABEL]["log"]] == list(range(1, step + 3))


# ---- value: an infeasible best -----------------------------------------------------------------
# name -> (run, config changes, exit status, texts stderr shows, texts it must not show)
INFEASIBLE_OK = "INFEASIBLE: the best strategy found"
FAILED = f"error: the run failed: no strategy found for {LABEL} fits in device memory"
VALUES = {
    "out of memory fails the run": ("oom", None, 1, [INFEASIBLE_OK, "no speed-up", FAILED, '"accept_infeasible": true'],
                                    ["speed-up x"]),
    "out of memory accepted": ("oom", {"accept_infeasible": True}, 0, [INFEASIBLE_OK, "no speed-up"],
                               ["error:", "speed-up x"]),
    "feasible": ("base", {}, 0, ["speed-up x"], ["INFEASIBLE", "error:"]),
    "accepted and feasible": ("base", {"accept_infeasible": True}, 0, ["speed-up x"], ["INFEASIBLE", "error:"]),
    "opt-in not a boolean": ("base", {"accept_infeasible": "yes"}, 2, ["accept_infeasible"], ["speed-up x"]),
}


@pytest.mark.parametrize("case", sorted(VALUES))
def test_an_infeasible_best_fails_the_run_unless_accepted(case, base, oom_run, tiny_memory_files, tmp_path):
    run, changes, expected_status, shows, hides = VALUES[case]
    if run == "oom" and changes is None:  # the fresh run itself
        _, out, status, stderr = oom_run
    else:
        out = _copy_run(oom_run if run == "oom" else base, tmp_path)
        status, stderr = _train(_config(tmp_path, **changes), out)  # resumes: the budget is spent
    assert status == expected_status, stderr[-3000:]
    assert "Traceback" not in stderr
    for text in shows:
        assert text in stderr, (text, stderr[-3000:])
    for text in hides:
        assert text not in stderr, (text, stderr[-3000:])
    if expected_status != 2:
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)["tasks"][LABEL]
        assert summary["feasible"] == (run == "base")
        assert bool(summary["oom_devices"]) == (run == "oom")
        for name, dev in summary["oom_devices"].items():
            assert dev["peak_memory_bytes"] > dev["memory_bytes"] == 2000
            assert f"{name} needs {dev['peak_memory_bytes']} of 2000 bytes" in stderr


def test_the_results_go_to_stdout_and_the_notes_to_stderr_both_to_the_log(base, tmp_path):
    """`train ... 2>/dev/null` still shows the results (a line per task, where the outputs are);
    `train ... >/dev/null` still shows progress, notes and errors; train.log keeps both."""
    from tfplace.cli import common, train
    out = _copy_run(base, tmp_path)
    err, printed = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(printed):
        assert common.call(train, ["--config", _config(tmp_path), "--output_dir", out, "--noprogress"]) == 0
    results = [f"{LABEL}: best ", "speed-up x", f"outputs in {out}"]
    notes = [f"resumed from step {STEPS} "]
    for text, stream, other in [(t, printed, err) for t in results] + [(t, err, printed) for t in notes]:
        assert text in stream.getvalue() and text not in other.getvalue(), (text, printed.getvalue(), err.getvalue())
    with open(os.path.join(out, "train.log")) as f:
        logged = f.read()
    assert all(text in logged for text in results + notes)


@pytest.mark.parametrize("last_checkpoint, says", [
    (None, "stopped at once by a second SIGINT; no checkpoint had been written before it"),
    (7, "stopped at once by a second SIGINT; the checkpoint of step 7 stands"),
])
def test_a_second_signal_says_which_checkpoint_stands(last_checkpoint, says, tmp_path, monkeypatch):
    """A run stopped at once (a second Ctrl-C) before its first checkpoint has none to point to."""
    from tfplace.policy import train_lib
    _cluster(tmp_path)
    _bundle(tmp_path)

    def stopped(*args, **kwargs):
        raise train_lib.TrainingInterrupted(signal.SIGINT, last_checkpoint, saved=False)
    monkeypatch.setattr(train_lib, "train", stopped)
    status, printed = _train(_config(tmp_path), str(tmp_path / "run"))
    assert status == 130 and says in printed, printed
