"""Training: end to end through the CLI (outputs, resume after a kill with no lost progress),
seeds (one seed, one run), and the fingerprint a resumed run is checked against. Faults (damaged
checkpoints, changed configs, SIGTERM, an infeasible best) are in tests/test_faults_unit_resume.py."""

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
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
    # a SIGKILLed process leaves TensorFlow's autograph modules in its temporary folder: this one's
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(tmp_path / "tmp"))
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
    assert re.fullmatch(r"(sample|greedy(, .+)?|local search) step \d+", report["source"]) \
        or report["source"].removesuffix(" as an action") in report["baselines"] \
        or report["source"] in SEEDED_ACTIONS, report["source"]
    if report["source"] in report["baselines"]:
        assert report["time_s"] == report["baselines"][report["source"]]["time_s"]
    with open(os.path.join(folder, "best_strategy.json")) as f:
        assert json.load(f) == report["strategy"]
    feasible = {n: b["time_s"] for n, b in report["baselines"].items() if not b["oom"]}
    assert report["best_baseline"] == min(feasible, key=feasible.get)
    for name, t in feasible.items():  # speed-ups over each baseline, by hand
        assert report["speedups"][name] == pytest.approx(t / report["time_s"])


@pytest.mark.parametrize("rank_feature", [0, 1])
def test_a_network_that_reads_the_device_rank_imitates_the_best_in_canonical_order(tmp_path, rank_feature,
                                                                                   monkeypatch):
    from tfplace.formats.config import load_train_config
    from tfplace.policy import actions as A
    from tfplace.policy import train_lib
    config = load_train_config(_config(tmp_path, 2))
    config = dataclasses.replace(config, network=dataclasses.replace(config.network, device_rank_feature=rank_feature),
                                 output_dir=str(tmp_path / "run"))
    trainer = train_lib.Trainer(config, log=lambda m: None, progress=False)
    run = trainer.runs[0]
    # the pool's best: every group on the second of two identical devices (an order no canonical
    # action has), ahead of everything training finds
    from tfplace.policy.features import identical_device_classes
    classes = [c for c in identical_device_classes(run.task.cluster) if len(c) > 1]
    best = A.proportional_action(run.task.num_groups, run.task.num_devices)
    best["shares"][:] = 0
    best["shares"][:, classes[0][1]] = 2
    run.pool.add(train_lib.PoolEntry("planted", run.task.decode(best), 1e-9, 1e-9, False, 0, best))
    seen = []
    monkeypatch.setattr(trainer.learner, "imitate", lambda demos: seen.extend(d for _, d in demos) or 0.0)
    trainer.train_step()
    used = sorted({int(i) for d in seen for i in np.flatnonzero(d["shares"].any(axis=0))})
    assert used == [classes[0][0] if rank_feature else classes[0][1]], used


def test_every_step_times_the_policys_own_plans_as_planning_makes_them(tmp_path):
    """The greedy strategy restricted to the fastest devices / the policy's top devices is what
    `plan` answers zero-shot when it beats the plain greedy one: a training step times the same plans
    (before its update), keeps them in the pool and logs the best of them, so a run never ends
    worse than planning from the policy it started with."""
    from tfplace.formats.config import load_train_config
    from tfplace.policy import actions as A
    from tfplace.policy import train_lib
    config = dataclasses.replace(load_train_config(_config(tmp_path, 1)), output_dir=str(tmp_path / "run"))
    trainer = train_lib.Trainer(config, log=lambda m: None, progress=False)
    run = trainer.runs[0]
    plans = A.greedy_plans(trainer.learner.probabilities(run.task.features.as_observation()), run.task.speeds)
    times = [run.task.evaluate(a).effective_time_s for _, a in plans]
    assert plans[0][0] == "greedy" and min(times) < times[0]  # the case where the restrictions matter
    trainer.train_step()
    assert run.log_rows[-1][4] == min(times)
    assert run.pool.best.effective_time_s <= min(times)


def test_a_resumed_run_counts_the_simulations_of_every_session(tmp_path):
    """summary.json's "simulations" is the run's, not the last session's: a state file carries
    each task's count, and a resumed run adds its own."""
    from tfplace.formats.config import load_train_config
    from tfplace.policy import train_lib
    config = dataclasses.replace(load_train_config(_config(tmp_path, 2)), output_dir=str(tmp_path / "run"))
    first = train_lib.Trainer(config, log=lambda m: None, progress=False)
    first.train_step()
    first.save()
    label = first.runs[0].label
    saved = _state(config.output_dir)["tasks"][label]["simulations"]
    assert saved >= 10  # the baselines, the samples and the plans of one step
    again = train_lib.Trainer(config, log=lambda m: None, progress=False)  # resumes from step 1
    assert again.step == 1
    assert again.runs[0].task.num_simulations == saved  # carried over once; the saved outputs' traces not counted
    summary = again.run()
    assert summary["tasks"][label]["simulations"] == again.runs[0].task.num_simulations > saved + 2
    with open(os.path.join(config.output_dir, label, "best_time.log")) as f:  # the graph to simulate it on
        assert json.load(f)["graph_file"] == os.path.abspath(config.graphs[0].graph)


def test_the_pool_starts_with_the_best_baseline_in_the_action_space(tmp_path):
    """Local search mutates and the policy imitates the best entry that has an action: the best
    baseline is in the pool as an action too (its nearest share levels), timed as decoded, so a
    baseline that only a strategy expressed (a hybrid's whole layers on one device) is a start and a
    target, not out of the policy's reach."""
    from tfplace.formats.config import load_train_config
    from tfplace.policy import actions as A
    from tfplace.policy import train_lib
    config = dataclasses.replace(load_train_config(_config(tmp_path, 1)), output_dir=str(tmp_path / "run"))
    run = train_lib.Trainer(config, log=lambda m: None, progress=False).runs[0]
    task, pool = run.task, run.pool
    b = pool.best_baseline()
    act = A.encode(b.strategy, task.grouping.group_names, task.cluster.device_names, task.speeds)
    best_encoded = task.evaluate(act).effective_time_s
    assert pool.best_with_action().effective_time_s <= best_encoded
    prop = A.proportional_action(task.num_groups, task.num_devices)
    plain = min(task.evaluate(a).effective_time_s for a in (prop, {k: 0 * v for k, v in prop.items()}))
    assert best_encoded < plain  # the case where the encoded baselines matter: better than the plain starts
    holder = next(e for e in pool.entries
                  if e.source in (b.source, f"{b.source} as an action") and e.action is not None)
    assert task.evaluate(holder.action).effective_time_s == best_encoded


# ---- seeds -------------------------------------------------------------------------------------
def _short_run(tmp_path, name, seed, steps=3):
    """(losses per step, state.json without the wall time, network weights) of `steps` steps."""
    import dataclasses

    from tfplace.formats.config import load_train_config
    from tfplace.policy import train_lib
    config = load_train_config(_config(tmp_path, steps))
    config = dataclasses.replace(config, seed=seed, output_dir=str(tmp_path / name))
    trainer = train_lib.Trainer(config, log=lambda m: None, progress=False)
    losses = [trainer.train_step()["loss"] for _ in range(steps)]
    trainer.save()
    state = _state(config.output_dir)
    del state["elapsed_s"]
    return losses, state, [v.numpy() for v in trainer.network.trainable_variables]


def test_two_runs_with_one_seed_take_the_same_steps_and_another_seed_does_not(tmp_path):
    import numpy as np
    losses, state, weights = _short_run(tmp_path, "a", seed=3)
    again_losses, again_state, again_weights = _short_run(tmp_path, "b", seed=3)
    assert again_losses == losses
    assert again_state == state  # pools (best strategies), logs, RNG, reward baselines, fingerprint
    assert all(np.array_equal(a, b) for a, b in zip(weights, again_weights))
    other_losses, other_state, other_weights = _short_run(tmp_path, "c", seed=4)
    assert other_losses != losses
    assert not all(np.array_equal(a, b) for a, b in zip(weights, other_weights))
    label = state["labels"][0]
    assert other_state["tasks"][label]["log"] != state["tasks"][label]["log"]


# ---- fingerprint -------------------------------------------------------------------------------
def _fingerprint_case(tmp_path):
    """A loaded config whose input files are copies in tmp_path, and a spare file of each kind."""
    import shutil

    from tfplace.formats.config import load_train_config
    for name in ("tiny_mlp_b16_sgd.json", "tiny_mlp_b16_sgd.pb"):
        shutil.copy(os.path.join(REPO, "graph_defs", "zoo", name), tmp_path / name)
    shutil.copy(os.path.join(REPO, "clusters", "two_kind_4gpu.json"), tmp_path / "cluster.json")
    shutil.copy(os.path.join(REPO, "clusters", "heterog_testbed.json"), tmp_path / "other_cluster.json")
    cfg = json.loads(open(_config(tmp_path, 2)).read())
    cfg["graphs"][0]["graph"] = str(tmp_path / "tiny_mlp_b16_sgd.json")
    cfg["clusters"] = [str(tmp_path / "cluster.json")]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "other.json").write_text('{"another": "file"}')
    return load_train_config(tmp_path / "config.json", workdir=str(tmp_path))


# TrainConfig field -> (a change of it, the fingerprint part it must change or None: resumable)
FIELD_CHANGES = {
    "graphs": (lambda c, d: (dataclasses.replace(c.graphs[0], batch_size=24),), "graphs[0]"),
    "clusters": (lambda c, d: (str(d / "other_cluster.json"),), "clusters[0]"),
    "profiles": (lambda c, d: (str(d / "other.json"),), "profiles[0]"),
    "overheads": (lambda c, d: (str(d / "other.json"),), "overheads[0]"),
    "max_groups": (lambda c, d: 8, "max_groups"),
    "seed": (lambda c, d: 4, "seed"),
    "network": (lambda c, d: dataclasses.replace(c.network, hidden_size=32), "network"),
    "rl": (lambda c, d: dataclasses.replace(c.rl, oom_penalty=3.0), "rl"),
    "simulator": (lambda c, d: dataclasses.replace(c.simulator, allreduce_algorithm="tree"), "simulator"),
    "init_policy": (lambda c, d: str(d / "other.json"), "init_policy"),  # its contents, like the files above
    "budget": (lambda c, d: dataclasses.replace(c.budget, steps=500), None),
    "checkpoint_every_steps": (lambda c, d: 7, None),
    "output_dir": (lambda c, d: str(d / "elsewhere"), None),
    "accept_infeasible": (lambda c, d: True, None),
    "source": (lambda c, d: str(d / "copy.json"), None),
}


def test_every_config_field_is_in_the_fingerprint_or_declared_resumable():
    from tfplace.formats.config import RESUMABLE_FIELDS, TrainConfig
    assert sorted(FIELD_CHANGES) == sorted(f.name for f in dataclasses.fields(TrainConfig))
    assert sorted(k for k, (_, part) in FIELD_CHANGES.items() if part is None) == sorted(RESUMABLE_FIELDS)


@pytest.mark.parametrize("field", sorted(FIELD_CHANGES))
def test_a_changed_field_changes_its_fingerprint_part_only(field, tmp_path):
    from tfplace.policy import train_state
    config = _fingerprint_case(tmp_path)
    change, part = FIELD_CHANGES[field]
    changed = dataclasses.replace(config, **{field: change(config, tmp_path)})
    before = train_state.run_fingerprint(config, [config.graphs[0].graph])
    after = train_state.run_fingerprint(changed, [changed.graphs[0].graph])
    assert [p for p in after if after[p] != before[p]] == ([part] if part else [])
    assert train_state.first_difference(before, after) == part


@pytest.mark.parametrize("graph_keys,simulator", [
    ({"optimizer": "sgd"}, {}),                            # the zoo's default optimizer
    ({"image_size": 16}, {}),                              # tiny_cnn's own image size
    ({}, {"straggler_seed": 3}),                           # the config's seed, which it defaults to
])
def test_a_default_spelled_out_is_the_same_run(graph_keys, simulator, tmp_path):
    """Writing out a default names the same problem: same task label (output folder), same
    fingerprint, so a run resumes; a value other than the default is another problem."""
    from tfplace.formats.config import load_train_config
    from tfplace.graph_defs.export import resolve_options
    from tfplace.policy import train_state

    def load(name, graph_extra, sim):
        cfg = json.loads(open(_config(tmp_path, 2)).read())
        cfg["graphs"] = [dict({"model": "tiny_cnn", "batch_size": 16}, **graph_extra)]
        cfg["simulator"] = sim
        (tmp_path / name).write_text(json.dumps(cfg))
        config = load_train_config(str(tmp_path / name), check_model=resolve_options)
        bundle = str(tmp_path / "bundle.json")  # one stand-in file: the options are what differ
        return config.graphs[0].label, train_state.run_fingerprint(config, [bundle])

    (tmp_path / "bundle.json").write_text("{}")
    plain = load("plain.json", {}, {})
    assert load("spelled.json", graph_keys, simulator) == plain
    other = {k: ("adam" if k == "optimizer" else v + 1) for k, v in graph_keys.items()}
    other_sim = {k: v + 1 for k, v in simulator.items()}
    assert load("other.json", other, other_sim) != plain


@pytest.mark.parametrize("edit,part", [
    ("graph file bytes", "graphs[0]"),   # the GraphDef the bundle names, not only the bundle
    ("cluster value", "clusters[0]"),
    ("cluster comment and layout", None),  # the cluster it describes, not the file's bytes
    ("files moved", None),               # contents, not paths: a moved checkout still resumes
])
def test_the_fingerprint_follows_file_contents_not_paths(edit, part, tmp_path):
    import shutil

    from tfplace.policy import train_state
    config = _fingerprint_case(tmp_path)
    before = train_state.run_fingerprint(config, [config.graphs[0].graph])
    bundle = config.graphs[0].graph
    if edit == "graph file bytes":
        with open(bundle[:-len(".json")] + ".pb", "ab") as f:
            f.write(b"\0")
    elif edit.startswith("cluster"):
        with open(config.clusters[0]) as f:
            cluster = json.load(f)
        if edit == "cluster value":
            cluster["devices"][0]["memory_bytes"] += 1
        else:
            cluster["comment"] = "edited"
            cluster["devices"][0]["comment"] = "this one too"
        with open(config.clusters[0], "w") as f:
            json.dump(cluster, f, indent=4, sort_keys=True)
    else:
        moved = tmp_path / "moved"
        shutil.copytree(tmp_path, moved, ignore=lambda d, names: ["moved"])
        entry = dataclasses.replace(config.graphs[0], graph=str(moved / os.path.basename(bundle)))
        config = dataclasses.replace(config, graphs=(entry,), clusters=(str(moved / "cluster.json"),))
    after = train_state.run_fingerprint(config, [config.graphs[0].graph])
    assert train_state.first_difference(before, after) == part


def test_a_run_reports_and_writes_the_fastest_strategy_that_fits_not_a_faster_one_over_memory(tmp_path):
    """The pool ranks by penalised time, so a fast strategy slightly over memory can rank first
    (an oom_penalty near 1). The run's best (progress, summary, best_strategy.json, speed-up) is
    the fastest that fits; it is the pool's best again once nothing over memory ranks above it."""
    from tfplace.formats.strategy import load_strategy
    from tfplace.policy import train_lib
    from tfplace.policy.environment import PlacementEnvironment
    from tfplace.policy.testing_fixtures import tiny_task
    task = tiny_task("cnn", "four", batch_size=16)
    pool = train_lib.seed_pool(task, 8)
    run = train_lib.TaskRun(task, PlacementEnvironment(task), pool)
    fitting = min((e for e in pool.entries + pool.baselines if not e.oom), key=lambda e: e.time_s)
    assert run.best is pool.best is fitting and run.passed_over is None  # nothing over memory yet: one best
    fast = fitting.time_s * 0.9
    over = dataclasses.replace(fitting, source="fast_but_over", oom=True, time_s=fast, effective_time_s=fast * 1.01,
                               strategy=dataclasses.replace(fitting.strategy, bucket_bytes=12345))
    assert pool.add(over) and pool.best is over
    assert run.best is fitting and pool.best_fitting is fitting and run.passed_over is over
    assert run.speedup() == pytest.approx(pool.best_baseline().effective_time_s / fitting.effective_time_s)
    train_lib.write_outputs(run, str(tmp_path))
    written = load_strategy(str(tmp_path / "best_strategy.json"))
    assert written.to_json() == dataclasses.replace(fitting.strategy, source=written.source).to_json()
    with open(tmp_path / "best_time.log") as f:
        logged = json.load(f)
    assert logged["source"] == fitting.source and logged["simulator_seed"] == task.sim_options.seed
    assert not run.best_report.oom


@pytest.mark.parametrize("passed_over, shows, hides", [
    (None, ["best 2.000 ms (local search); best baseline"], ["penalised"]),
    ({"source": "fast_but_over", "time_s": 1e-3},
     ["best 2.000 ms (local search, the fastest that fits; fast_but_over (1.000 ms) ranks above it by penalised "
      "time but runs out of memory); best baseline"], []),
])
def test_the_summary_line_says_when_a_faster_strategy_over_memory_was_passed_over(passed_over, shows, hides):
    from tfplace.cli import train as train_cli
    line = train_cli._summary_line("t", {"best_time_s": 2e-3, "best_source": "local search", "feasible": True,
                                         "passed_over": passed_over, "best_baseline": "dp",
                                         "best_baseline_time_s": 3e-3, "best_baseline_feasible": True,
                                         "speedup_over_best_baseline": 1.5})
    assert all(s in line for s in shows) and not any(s in line for s in hides), line


def test_a_bare_steps_fingerprint_is_its_own_file_not_the_cached_import(tmp_path, monkeypatch):
    """The cached bundle a bare step is imported into records how long the import took: a cache
    made again (another machine, a cleared cache) must not make a run unresumable."""
    from tfplace.formats.config import GraphEntry, TrainConfig
    from tfplace.policy import train_state
    step = tmp_path / "step.pb"
    step.write_bytes(b"step bytes")
    imported = tmp_path / "cache" / "step_0123456789ab.json"
    imported.parent.mkdir()
    config = TrainConfig(graphs=(GraphEntry(8, graph=str(step), train_ops=("a",)),), clusters=(), profiles=(None,),
                         output_dir=str(tmp_path / "run"))
    parts = []
    for seconds in (0.1, 0.2):  # the same import, made twice
        imported.write_text(json.dumps({"model": "step", "export_seconds": seconds}))
        parts.append(train_state.run_fingerprint(config, [str(imported)])["graphs[0]"])
    assert parts[0] == parts[1]
    step.write_bytes(b"other step bytes")
    assert train_state.run_fingerprint(config, [str(imported)])["graphs[0]"] != parts[0]
    roles = dataclasses.replace(config, graphs=(dataclasses.replace(config.graphs[0], train_ops=("b",)),))
    assert train_state.run_fingerprint(roles, [str(imported)])["graphs[0]"] != parts[0]



@pytest.mark.parametrize("relative_gap, carried", [
    (0.0, True),     # the encoded best baseline times as the baseline: the baseline's entry carries the action
    (1e-15, True),   # apart only by rounding: a tie in the pool's order (reports.same_time), so the same
    (1e-9, False),   # apart for real: not the baseline's action
])
def test_seed_pool_ties_the_best_baseline_and_its_action_as_the_pool_ranks(relative_gap, carried, monkeypatch):
    from tfplace.policy import train_lib
    from tfplace.policy.environment import Evaluation
    from tfplace.policy.testing_fixtures import tiny_task
    task = tiny_task("cnn", "four", batch_size=16)
    evaluate, calls = task.evaluate, []

    def encoded_at_the_gap(action):
        """The first action seed_pool times is the encoded best baseline (whose effective time it
        has just set as the task's reference): timed `relative_gap` slower."""
        calls.append(action)
        if len(calls) > 1:
            return evaluate(action)
        time_s = task.reference_time_s * (1 + relative_gap)
        return Evaluation(time_s, time_s, False, 0.0)
    monkeypatch.setattr(task, "evaluate", encoded_at_the_gap)
    pool = train_lib.seed_pool(task, 16)
    best = pool.best_baseline()
    (kept,) = [e for e in pool.entries if e.source == best.source]
    assert (kept.action is not None) == carried, kept


@pytest.mark.parametrize("lock_held_elsewhere, bad_input, folder_left", [
    (True, False, True),    # another run holds the folder (and may have just made it): never removed
    (False, True, False),   # this run made it, bad input before any checkpoint: removed
    (False, False, True),   # the run went well: kept
])
def test_only_a_run_that_holds_the_folder_removes_it_on_bad_input(tmp_path, lock_held_elsewhere, bad_input,
                                                                 folder_left):
    from tfplace.cli import common
    from tfplace.cli import train as train_cli
    from tfplace.formats.errors import InputError
    out = tmp_path / "run"
    out.mkdir()

    def work():
        if bad_input:
            raise InputError("c.json", "graphs[0]", "bad", "fix it")
        return 0
    other = common.OutputLock(str(out), "other.json", "output_dir")
    if lock_held_elsewhere:
        other.__enter__()
    try:
        with pytest.raises(InputError) if lock_held_elsewhere or bad_input else contextlib.nullcontext():
            train_cli.in_output_dir(str(out), True, "c.json", work)
    finally:
        other.__exit__(None, None, None)
    assert out.exists() == folder_left
