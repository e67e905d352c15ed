"""Every command line keeps one contract (tfplace.cli.common), checked on the real processes:
`--help` exits 0 and lists the command's flags; an unknown flag exits 2; a missing input file
exits 2 with one line naming the file and no traceback; an output path in a missing folder
exits 2 before any work, naming the path."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
CLUSTER = os.path.join(REPO, "clusters", "local_cpu.json")
TINY = os.path.join(REPO, "graph_defs", "zoo", "tiny_mlp_b16_sgd.json")
# {missing} is a file that does not exist, {nodir} a folder that does not exist, {tmp} a scratch folder.
# name -> (command, a flag --help must list, argv with a missing input file, argv with an output in {nodir})
COMMANDS = {
    "train": (["-m", "tfplace.train"], "--output_dir",
              ["--config", "{missing}"], ["--config", "{missing}", "--output_dir", "{nodir}/run"]),
    "plan": (["-m", "tfplace.plan"], "--search_seconds",
             ["--checkpoint", "{missing}", "--model", "tiny_mlp", "--cluster", CLUSTER, "--out", "{tmp}/s.json"],
             ["--checkpoint", "{tmp}", "--model", "tiny_mlp", "--cluster", CLUSTER, "--out", "{nodir}/s.json"]),
    "pretrain": (["-m", "tfplace.pretrain"], "--search_seconds",
                 ["--out", "{tmp}/w.json", "--split", "{missing}"], ["--out", "{nodir}/w.json"]),
    "simulate": (["-m", "tfplace.simulate"], "--trace",
                 ["--graph", TINY, "--cluster", "{missing}", "--strategy", "{missing}"],
                 ["--graph", TINY, "--cluster", CLUSTER, "--strategy", "s.json", "--trace", "{nodir}/t.json"]),
    "compare": (["-m", "tfplace.compare"], "--max-groups",
                ["--graph", TINY, "--cluster", "{missing}", "--out", "{tmp}/cmp"],
                ["--graph", TINY, "--cluster", CLUSTER, "--out", "{nodir}/cmp"]),
    "profile": (["-m", "tfplace.profile"], "--batch-sizes",
                ["--graph", "{missing}", "--out", "{tmp}/p.json"], ["--graph", TINY, "--out", "{nodir}/p.json"]),
    "groups": (["-m", "tfplace.cli.groups"], "--max-groups",
               ["--graph", "{missing}", "--max-groups", "3"],
               ["--graph", TINY, "--max-groups", "3", "--json", "{nodir}/g.json"]),
    "grappler_check": (["-m", "tfplace.cli.grappler_check"], "--by-type", ["--graph", "{missing}"], None),
    "kernel_replay": (["-m", "tfplace.cli.kernel_replay"], "--batch-sizes",
                      ["to-profile", "--replay", "{missing}", "--kind", "H100", "--out", "{tmp}/p.json"],
                      ["export", "--graph", TINY, "--out", "{nodir}/ops.json"]),
    "export": (["-m", "tfplace.cli.export"], "--num-layers", None,
               ["--model", "tiny_mlp", "--out", "{nodir}/zoo"]),
    "activate": ([os.path.join(REPO, "activate.py")], "CONFIG", ["{missing}"], ["{tmp}/bad_out.txt"]),
}


# modules of tfplace/cli that are no command (the commands' shared library), run with python -m
NOT_COMMANDS = ("common", "real_check")


def _run(command, argv, tmp_path):
    values = {"missing": str(tmp_path / "missing.json"), "nodir": str(tmp_path / "no_such_folder"),
              "tmp": str(tmp_path)}
    args = [a.format(**values) for a in argv]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, *command, *args], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path), env=env)


def _error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_exits_0_and_lists_the_flags(name, tmp_path):
    command, flag, _, _ = COMMANDS[name]
    result = _run(command, ["--help"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert flag in result.stdout
    # flags TensorFlow and absl's test module define when imported are not the command's
    assert "--test_srcdir" not in result.stdout and "--tt_check_filter" not in result.stdout, result.stdout


@pytest.mark.parametrize("name", ["train", "pretrain", "plan", "simulate", "compare", "profile"])
def test_help_of_the_cli_module_matches_the_shim(name, tmp_path):
    shim = _run(["-m", f"tfplace.{name}"], ["--help"], tmp_path)
    module = _run(["-m", f"tfplace.cli.{name}"], ["--help"], tmp_path)
    assert module.returncode == 0 and module.stdout == shim.stdout


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_unknown_flag_exits_2_with_one_line(name, tmp_path):
    result = _run(COMMANDS[name][0], ["--no_such_flag=1"], tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = _error_lines(result.stderr)
    assert len(errors) == 1 and "no_such_flag" in errors[0], result.stderr


@pytest.mark.parametrize("name", sorted(n for n, c in COMMANDS.items() if c[2] is not None))
def test_missing_input_file_exits_2_naming_it(name, tmp_path):
    result = _run(COMMANDS[name][0], COMMANDS[name][2], tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = _error_lines(result.stderr)
    assert len(errors) == 1 and str(tmp_path / "missing.json") in errors[0], result.stderr


# commands whose output is a folder: made with its missing parents (runs/<config> on a fresh
# checkout), so only a file in the way stops them
FOLDER_OUTPUTS = {"train", "compare", "export", "activate"}


@pytest.mark.parametrize("name", sorted(n for n, c in COMMANDS.items() if c[3] is not None))
def test_output_that_cannot_be_written_exits_2_before_any_work(name, tmp_path):
    nodir = tmp_path / "no_such_folder"
    with open(tmp_path / "bad_out.txt", "w") as f:  # activate's output_dir comes from its config
        json.dump({"format": "tfplace.activate_config", "cluster": CLUSTER, "baselines": ["single"],
                   "graphs": [{"model": "tiny_mlp", "batch_size": 16}], "output_dir": str(nodir / "run")}, f)
    if name in FOLDER_OUTPUTS:
        nodir.write_text("a file where the output folder's parent should be")
    result = _run(COMMANDS[name][0], COMMANDS[name][3], tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = _error_lines(result.stderr)
    assert len(errors) == 1 and str(nodir) in errors[0], result.stderr
    left = ["bad_out.txt"] + (["no_such_folder"] if name in FOLDER_OUTPUTS else [])
    assert sorted(os.listdir(tmp_path)) == left and (name not in FOLDER_OUTPUTS or nodir.is_file())


def test_an_output_folder_is_made_with_its_missing_parents(tmp_path):
    from tfplace.cli.common import check_output_dir, output_problem
    deep = tmp_path / "runs" / "a" / "b"
    assert output_problem(str(deep), folder=True) is None
    check_output_dir(str(deep), "config.json", "output_dir")
    assert output_problem(str(deep / "x.json")) is not None  # a file still needs its folder


def test_activate_without_a_config_prints_usage_and_exits_2(tmp_path):
    result = _run(COMMANDS["activate"][0], [], tmp_path)
    assert result.returncode == 2 and "usage: activate.py" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("name,argv,flag", [
    ("compare", ["--graph", TINY, "--cluster", CLUSTER, "--max-groups", "0"], "--max-groups"),
    ("profile", ["--graph", TINY, "--out", "p.json", "--batch-sizes", "4,-2"], "--batch-sizes"),
    ("plan", ["--checkpoint", ".", "--model", "m", "--cluster", CLUSTER, "--search_seconds", "-1"], "--search_seconds"),
    ("groups", ["--graph", TINY, "--max-groups", "3", "--batch-size", "0"], "--batch-size"),
    ("plan", ["--model", "tiny_mlp", "--cluster", CLUSTER, "--batch_size", str(10 ** 12)], "--batch_size"),  # int32
    ("compare", ["--graph", TINY, "--cluster", CLUSTER, "--batch-size", str(2 ** 31)], "--batch-size"),
    ("profile", ["--graph", TINY, "--out", "p.json", "--device", "CPU", "--batch-sizes", str(3 * 10 ** 9)],
     "--batch-sizes"),
])
def test_a_number_out_of_range_is_a_usage_error_naming_the_flag(name, argv, flag, tmp_path):
    result = _run(COMMANDS[name][0], argv, tmp_path)
    errors = _error_lines(result.stderr)
    assert result.returncode == 2 and len(errors) == 1 and flag in errors[0], result.stderr


@pytest.mark.parametrize("name,argv,expected", [
    ("groups", [], "error: --graph, --max-groups are required. Fix: give them (see --help)"),
    ("groups", ["--graph", TINY], "error: --max-groups is required. Fix: give it (see --help)"),
    ("plan", ["--cluster", CLUSTER, "--out", "s.json"], "error: one of --graph or --model is required. Fix: give one "
                                                        "(see --help)"),
    ("plan", [], "error: --cluster is required; one of --graph or --model is required. Fix: give it; give one "
                 "(see --help)"),
    ("plan", ["--model", "tiny_mlp", "--graph", TINY, "--cluster", CLUSTER, "--out", "s.json"],
     "error: --graph and --model were given together. Fix: keep one of them (see --help)"),
    ("plan", ["--model", "tiny_mlp", "--checkpoint", ".", "--policy", "p.json", "--cluster", CLUSTER, "--out",
              "s.json"], "error: --checkpoint and --policy were given together. Fix: keep one of them (see --help)"),
])
def test_a_required_flag_left_out_is_one_line_naming_it(name, argv, expected, tmp_path):
    result = _run(COMMANDS[name][0], argv, tmp_path)
    assert result.returncode == 2 and _error_lines(result.stderr) == [expected], result.stderr


def test_a_usage_message_ending_in_a_full_stop_gets_one_before_its_fix(capsys):
    from tfplace.cli.common import _usage_error
    with pytest.raises(SystemExit):
        _usage_error("Unknown command line flag 'x'.")
    assert capsys.readouterr().err.strip() == ("error: Unknown command line flag 'x'. Fix: remove it or use a flag "
                                               "that --help lists (see --help)")


@pytest.mark.parametrize("name,argv,flag", [
    ("plan", ["--model", "tiny_mlp", "--cluster", CLUSTER, "--batch-size", "0"], "--batch_size"),
    ("plan", ["--model", "tiny_mlp", "--cluster", CLUSTER, "--search-seconds=-1"], "--search_seconds"),
    ("compare", ["--graph", TINY, "--cluster", CLUSTER, "--max_groups", "0"], "--max-groups"),
    ("groups", ["--graph", TINY, "--max_groups", "3", "--batch_size", "0"], "--batch-size"),
])
def test_a_flag_reaches_the_command_spelled_with_dashes_or_underscores(name, argv, flag, tmp_path):
    """Commands spell multi-word flags one way each (plan --batch_size, compare --batch-size); the
    other spelling reaches the same flag (here: its range check names the flag)."""
    result = _run(COMMANDS[name][0], argv, tmp_path)
    errors = _error_lines(result.stderr)
    assert result.returncode == 2 and len(errors) == 1 and flag in errors[0], result.stderr
    assert "Unknown command line flag" not in result.stderr


@pytest.mark.parametrize("argv, expected", [
    (["p", "--batch-size", "8"], ["p", "--batch_size", "8"]),
    (["p", "--batch-size=8"], ["p", "--batch_size=8"]),
    (["p", "-batch-size=8"], ["p", "-batch_size=8"]),
    (["p", "--max_groups", "3"], ["p", "--max-groups", "3"]),
    (["p", "--no_plot"], ["p", "--no-plot"]),           # a flag whose own name starts with "no"
    (["p", "--no_trace"], ["p", "--no_trace"]),         # not a flag either way: absl names it
    (["p", "--nodry-run"], ["p", "--nodry_run"]),       # a boolean's negation
    (["p", "--batch_size", "8"], ["p", "--batch_size", "8"]),  # the command's own spelling
    (["p", "--seed", "-1"], ["p", "--seed", "-1"]),     # a value, not a flag
    (["p", "--", "--batch-size"], ["p", "--", "--batch-size"]),  # after "--": positional
])
def test_either_spelling_rewrites_only_the_other_spelling_of_a_flag(argv, expected):
    from absl import flags

    from tfplace.cli import common

    def define():
        flags.DEFINE_integer("batch_size", 1, "b")
        flags.DEFINE_integer("max-groups", 1, "m")
        flags.DEFINE_integer("seed", 0, "s")
        flags.DEFINE_boolean("no-plot", False, "p")
        flags.DEFINE_boolean("dry_run", False, "d")
    names = common._define(define)
    try:
        assert common.either_spelling(argv, names) == expected
    finally:
        for name in names:
            delattr(flags.FLAGS, name)


def test_a_write_the_machine_refuses_is_one_line_and_tensorflow_stays_quiet(tmp_path):
    """A trace path under /proc passes the checks (root may write anywhere) and fails when written:
    one error line naming the file with the system's reason, exit 2 (the atomic writer's InputError:
    tfplace.formats.jsonio.atomic_write), no traceback; and without TF_CPP_MIN_LOG_LEVEL set,
    TensorFlow's start-up log lines are not shown (common.run)."""
    strategy = os.path.join(REPO, "examples", "formats", "strategy_local_cpu.json")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([sys.executable, "-m", "tfplace.simulate", "--graph", TINY, "--cluster", CLUSTER,
                             "--strategy", strategy, "--trace", "/proc/tfplace_trace.json"],
                            capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=env)
    errors = _error_lines(result.stderr)
    assert result.returncode == 2 and len(errors) == 1 and "/proc/tfplace_trace.json: cannot be written" in errors[0], \
        result.stderr
    assert "Traceback" not in result.stderr and "tensorflow/core" not in result.stderr, result.stderr


@pytest.mark.parametrize("cluster", ["local_cpu_hetero.json", "local_cpu_hetero_shaped.json"])
def test_the_bundled_emulated_clusters_need_no_profile(cluster, tmp_path):
    """Without --profile, compare, simulate and plan take the device model's costs on a cluster of
    quota-emulated kinds too (CPU_half: the CPU over its quota), as activate does."""
    path = os.path.join(REPO, "clusters", cluster)
    done = _run(["-m", "tfplace.compare"], ["--graph", TINY, "--cluster", path, "--out", "{tmp}/cmp", "--no-plot"],
                tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "CPU_half = CPU at a 0.5 quota" in done.stdout
    assert f"note: {path} runs on CPU tasks and no runtime-overheads file was given" in done.stderr
    done = _run(["-m", "tfplace.simulate"], ["--graph", TINY, "--cluster", path, "--strategy",
                                             "{tmp}/cmp/strategies/dp_even_allreduce.json"], tmp_path)
    assert done.returncode == 0 and "iteration time" in done.stdout, done.stderr[-2000:]
    done = _run(["-m", "tfplace.plan"], ["--graph", TINY, "--cluster", path, "--samples", "0", "--out", "{tmp}/s.json"],
                tmp_path)
    assert done.returncode == 0 and "strategy written to" in done.stdout, done.stderr[-2000:]
    assert "so splits look faster than they run; give --overheads measure to measure them first, or give" in done.stderr


@pytest.mark.parametrize("cluster, overheads, expected", [
    ("local_cpu_hetero.json", None, "give --overheads {dir}/local_cpu_hetero.overheads.json (found beside"),
    ("local_cpu.json", None, "give --overheads {dir}/local_cpu.overheads.json (found beside"),
    ("copy of local_cpu.json", None, "measure them (python -m tfplace.cli.overheads --cluster {dir}/local_cpu.json "
                                     "--out O), then give --overheads O"),   # no file beside it
    ("local_cpu_hetero.json", "clusters/local_cpu_hetero.overheads.json", None),  # given: nothing to say
    ("two_kind_4gpu.json", None, None),                                            # GPUs: no runtime-overheads model
    ("copy of local_cpu.json", "", 'then give "overheads": "O" in the config'),    # activate's wording
])
def test_a_cpu_cluster_without_overheads_gets_a_note_naming_the_fix(cluster, overheads, expected, tmp_path):
    import shutil
    from tfplace.cli.common import overheads_note
    from tfplace.formats.cluster import load_cluster
    folder = os.path.join(REPO, "clusters")
    if cluster.startswith("copy of "):
        cluster, folder = cluster[len("copy of "):], str(tmp_path)
        shutil.copy(os.path.join(REPO, "clusters", cluster), tmp_path / cluster)
    path = os.path.join(folder, cluster)
    give = '"overheads": "{}" in the config' if overheads == "" else "--overheads {}"
    note = overheads_note(load_cluster(path), path, overheads, give=give)
    if expected is None:
        assert note is None
    else:
        assert note.startswith(f"note: {path} runs on CPU tasks") and expected.format(dir=folder) in note, note


def test_training_on_a_bundled_emulated_cluster_needs_no_profile_and_notes_the_overheads(tmp_path):
    """The main job on clusters/local_cpu_hetero.json without profiles: it trains (the quota kind
    is the CPU over its quota) and says which overheads file its config could name."""
    path = os.path.join(REPO, "clusters", "local_cpu_hetero.json")
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"format": "tfplace.train_config", "version": 1,
                                  "graphs": [{"model": "tiny_mlp", "batch_size": 12}], "clusters": [path],
                                  "budget": {"steps": 1}, "output_dir": str(tmp_path / "run")}))
    done = _run(["-m", "tfplace.train"], ["--config", str(config)], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    beside = os.path.join(REPO, "clusters", "local_cpu_hetero.overheads.json")
    assert f'give "{beside}" as "overheads"[0] in the config' in done.stderr, done.stderr[-2000:]
    assert (tmp_path / "run" / "tiny_mlp_b12" / "best_strategy.json").exists()


@pytest.mark.parametrize("module", NOT_COMMANDS)
@pytest.mark.parametrize("argv", [[], ["--help"]])
def test_a_cli_module_that_is_no_command_says_so(module, argv, tmp_path):
    result = _run(["-m", f"tfplace.cli.{module}"], argv, tmp_path)
    errors = _error_lines(result.stderr)
    assert result.returncode == 2 and len(errors) == 1, (result.returncode, result.stderr)
    assert f"tfplace.cli.{module} is not a command. Fix: " in errors[0] and "Traceback" not in result.stderr


def test_every_cli_module_runs_as_a_command_or_says_it_is_none():
    folder = os.path.join(REPO, "tfplace", "cli")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py") and name != "__init__.py":
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                source = f.read()
            assert 'if __name__ == "__main__":' in source, name
            main_block = source.split('if __name__ == "__main__":')[-1]
            assert (name[:-3] in NOT_COMMANDS) == ("not_a_command(" in main_block), name


def test_kernel_replay_without_pytorch_is_one_line_naming_the_fix(tmp_path):
    """The replay times ops with PyTorch on a GPU; where PyTorch is missing (as in this project's
    CPU environment) the command says so in one line and exits 2, with no traceback."""
    ops = tmp_path / "ops.json"
    exported = _run(COMMANDS["kernel_replay"][0], ["export", "--graph", TINY, "--out", str(ops)], tmp_path)
    assert exported.returncode == 0, exported.stderr[-2000:]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    code = "import sys; sys.modules['torch'] = None; from tfplace.cli.kernel_replay import run; run()"
    result = subprocess.run([sys.executable, "-c", code, "replay", "--ops", str(ops), "--batch-sizes", "8",
                             "--out", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=120,
                            cwd=str(tmp_path), env=env)
    errors = _error_lines(result.stderr)
    assert result.returncode == 2 and len(errors) == 1 and "PyTorch" in errors[0], result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "r.json").exists()


def test_simulate_reports_the_expected_step_over_stragglers_unless_asked_for_one_draw(tmp_path):
    """examples/formats/cluster.json: p100_0 straggles 1.5x in 5% of the steps. The default step is
    the expected one over both cases; --stragglers off and draw give single steps."""
    cluster = os.path.join(REPO, "examples", "formats", "cluster.json")
    (tmp_path / "s.json").write_text(json.dumps({
        "format": "tfplace.strategy", "version": 1, "graph": "tiny_mlp", "global_batch_size": 16, "max_groups": 64,
        "default": {"shares": {"v100_0": 6, "v100_1": 6, "p100_0": 4}, "sync": "allreduce"}}))
    times = {}
    for mode in ("expected", "off", "draw"):
        done = _run(["-m", "tfplace.simulate"], ["--graph", TINY, "--cluster", cluster, "--strategy", "{tmp}/s.json",
                                                 "--stragglers", mode, "--json", f"{{tmp}}/{mode}.json"], tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        assert ("expected over 2 straggler cases" in done.stdout) == (mode == "expected"), done.stdout
        times[mode] = json.loads((tmp_path / f"{mode}.json").read_text())["iteration_time_s"]
    # seed 0 draws p100_0 slow (numpy's default_rng(0).random(3)[2] = 0.04 < 0.05)
    assert times["off"] < times["expected"] < times["draw"]
    assert times["expected"] == pytest.approx(0.95 * times["off"] + 0.05 * times["draw"], rel=1e-9)


GPU_CLUSTER = os.path.join(REPO, "clusters", "two_kind_4gpu.json")
CPU_OVERHEADS = os.path.join(REPO, "clusters", "local_cpu.overheads.json")


@pytest.mark.parametrize("name,argv,names", [
    ("plan", ["--model", "tiny_mlp", "--cluster", GPU_CLUSTER, "--overheads", CPU_OVERHEADS, "--out", "{tmp}/s.json"],
     "argument: --overheads:"),
    ("compare", ["--graph", TINY, "--cluster", GPU_CLUSTER, "--overheads", CPU_OVERHEADS, "--out", "{tmp}/cmp"],
     "argument: --overheads:"),
    ("train", ["--config", "{tmp}/c.json"], "c.json: overheads[0]:"),
])
def test_runtime_overheads_for_a_gpu_cluster_are_refused_naming_the_field(name, argv, names, tmp_path):
    """Runtime overheads model a CPU-emulated cluster; given for a GPU cluster they are one error
    naming the flag or the config's field and the fix (not a missing pair of kinds in the file)."""
    (tmp_path / "c.json").write_text(json.dumps({
        "format": "tfplace.train_config", "version": 1, "graphs": [{"model": "tiny_mlp", "batch_size": 16}],
        "clusters": [GPU_CLUSTER], "overheads": [CPU_OVERHEADS], "output_dir": str(tmp_path / "run")}))
    done = _run(COMMANDS[name][0], argv, tmp_path)
    lines = _error_lines(done.stderr)
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    fix = "Fix: set overheads[0] to null" if name == "train" else "Fix: leave out --overheads"
    assert names in lines[0] and "V100" in lines[0] and fix in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("case", ["unknown device kind", "profile without the cluster's kinds"])
@pytest.mark.parametrize("folder_before", [False, True])
def test_train_on_bad_input_leaves_no_output_folder_it_made(case, folder_before, tmp_path):
    """Bad input found before the run (an unknown kind: before the folder is made) or inside it
    (a profile that lacks the cluster's kinds: the folder was made and locked) exits 2 and leaves
    no folder behind; a folder that was there before stays, with what it held."""
    cluster = json.loads(open(GPU_CLUSTER).read())
    if case == "unknown device kind":
        cluster["devices"][0]["kind"] = "H100X"
    (tmp_path / "c.json").write_text(json.dumps(cluster))
    (tmp_path / "p.json").write_text(json.dumps({"format": "tfplace.profile", "version": 1,
                                                 "ops": {"x": {"CPU": {"8": 0.1}}}}))
    config = {"format": "tfplace.train_config", "version": 1, "graphs": [{"model": "tiny_mlp", "batch_size": 16}],
              "clusters": [str(tmp_path / "c.json")], "budget": {"steps": 1}}
    if case != "unknown device kind":
        config["profiles"] = [str(tmp_path / "p.json")]
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    run = tmp_path / "run"
    if folder_before:
        run.mkdir()
        (run / "notes.txt").write_text("mine")
    done = _run(COMMANDS["train"][0], ["--config", str(tmp_path / "cfg.json"), "--output_dir", str(run)], tmp_path)
    lines = _error_lines(done.stderr)
    assert done.returncode == 2 and len(lines) == 1 and "Fix:" in lines[0], done.stderr[-2000:]
    assert ("H100X" if case == "unknown device kind" else "not in the profile") in lines[0]
    assert run.exists() == folder_before
    if folder_before:
        assert (run / "notes.txt").read_text() == "mine"
