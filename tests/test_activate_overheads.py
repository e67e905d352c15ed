"""Runtime overheads from the machine a run is on: an overheads file keeps the quiet speed of the
machine it was measured on (machine_probe_s), a run on a machine of another speed says so, and
activate's `"overheads": "measure"` measures them on the cluster before the simulated column
needs them (tfplace.cli.activate, tfplace.runtime.machine_speed)."""

import io
import json
import os

import pytest

from tfplace.runtime import machine_speed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCAL_CPU = os.path.join(ROOT, "clusters", "local_cpu.json")
OVERHEADS = os.path.join(ROOT, "clusters", "local_cpu.overheads.json")


@pytest.mark.parametrize("quiet, expected", [
    ({0: 1.0, 1: 3.0, 2: 2.0}, 2.0),   # the median core
    ({0: 1.0, 1: 3.0}, 2.0),           # an even count: the mean of the middle two
    ({5: 0.7}, 0.7),
    ({}, None),                        # nothing probed
])
def test_the_machine_probe_is_the_median_cores_quiet_seconds(quiet, expected):
    assert machine_speed.machine_probe_s(quiet) == expected


@pytest.mark.parametrize("measured_s, now_s, says", [
    (1.0, 1.0, None),
    (1.0, 1.29, None),                 # within the spread of one machine's cores
    (1.0, 1 / 1.29, None),
    (1.0, 2.0, "2.00x faster than this one: simulated times will read low"),
    (2.0, 1.0, "2.00x slower than this one: simulated times will read high"),
    (None, 2.0, None),                 # a file from before the stamp: nothing to compare
    (1.0, None, None),
])
def test_a_machine_of_another_speed_is_named(measured_s, now_s, says):
    note = machine_speed.speed_mismatch_note(measured_s, now_s, "the runtime overheads in F", "measure them here")
    if says is None:
        assert note is None
    else:
        assert note.startswith("note: the runtime overheads in F were measured on a machine whose cores ran " + says)
        assert note.endswith("; measure them here")


def _config(tmp_path, **keys):
    path = tmp_path / "activate_config.txt"
    path.write_text(json.dumps({"format": "tfplace.activate_config", "cluster": LOCAL_CPU, "baselines": ["single"],
                                "graphs": [{"model": "tiny_mlp", "batch_size": 16}], "steps": 2, "warmup_steps": 1,
                                "output_dir": str(tmp_path / "out"), "trace": False, **keys}))
    return str(path)


def _no_servers(monkeypatch, seen):
    """activate without TF servers: each entry's round records the overheads it was given."""
    from tfplace.cli import activate
    monkeypatch.setattr(activate, "_run_one", lambda job, cluster, lc, config, overheads, watch: seen.append(overheads)
                        or {"step_times_s": [1e-3], "simulated_s": 1e-3, "timeline": "", "probes_s": []})
    monkeypatch.setattr(activate, "_running_cluster", lambda lc, cluster, out: None)


@pytest.mark.parametrize("stamp_s, probe_s, says", [
    (0.5e-3, 1e-3, "2.00x faster than this one"),
    (2e-3, 1e-3, "2.00x slower than this one"),
    (1.1e-3, 1e-3, None),
    (None, 1e-3, None),
])
def test_activate_says_when_the_overheads_file_is_from_a_machine_of_another_speed(tmp_path, monkeypatch, stamp_s,
                                                                                  probe_s, says):
    with open(OVERHEADS) as f:
        data = json.load(f)
    data.pop("machine_probe_s", None)
    if stamp_s is not None:
        data["machine_probe_s"] = stamp_s
    overheads = tmp_path / "overheads.json"
    overheads.write_text(json.dumps(data))
    monkeypatch.setattr(machine_speed, "probe_core_s", lambda core, **_: probe_s)
    seen = []
    _no_servers(monkeypatch, seen)
    from tfplace.cli.activate import run
    text = io.StringIO()
    run(_config(tmp_path, overheads=str(overheads)), out=text)
    notes = [line for line in text.getvalue().splitlines() if "were measured on a machine" in line]
    if says is None:
        assert notes == []
    else:
        assert len(notes) == 1 and says in notes[0] and str(overheads) in notes[0], text.getvalue()
        assert '"overheads": "measure"' in notes[0]  # the fix
    assert seen and seen[0].machine_probe_s == stamp_s


@pytest.mark.multiprocess
def test_activate_measures_the_overheads_it_simulates_with(tmp_path, monkeypatch):
    """"overheads": "measure": the overheads are measured on the cluster's servers (for real, one
    short pass), written into the output folder, stamped with this machine's speed, named in
    results.json, and they are what every simulated entry gets."""
    from tfplace.cli import activate
    from tfplace.overheads.model import load_overheads
    from tfplace.profiling import overheads_probe
    real_measure = overheads_probe.measure_runtime_overheads

    def short(cluster, lc_kwargs, **kw):  # one quick pass: the settings, not the precision, are tested
        short.kwargs, short.passes = lc_kwargs, kw["passes"]
        return real_measure(cluster, lc_kwargs, **dict(kw, passes=1, reps=3, cpu_reps=5, fan=2, raw=False))
    monkeypatch.setattr(overheads_probe, "measure_runtime_overheads", short)
    seen = []
    _no_servers(monkeypatch, seen)
    text = io.StringIO()
    activate.run(_config(tmp_path, overheads="measure"), out=text)
    path = tmp_path / "out" / "overheads.json"
    measured = load_overheads(path)
    assert measured.machine_probe_s > 0 and measured.step_s > 0 and set(measured.collective_s) == {"2", "3"}
    assert short.kwargs["num_tasks"] == 3 and short.kwargs["threads_per_task"] == [1, 1, 1] and short.passes == 2
    assert "measured by activate" in measured.how and "python -m tfplace.cli.overheads on local_cpu.json" in measured.how
    assert seen and all(o.to_json() == measured.to_json() for o in seen)
    assert "measured the runtime overheads in" in text.getvalue() and str(path) in text.getvalue()
    assert "s] pass 1 of 1: starting 3 server tasks" in text.getvalue()  # progress while it measures
    assert "s] pass 1 done in" in text.getvalue()
    with open(tmp_path / "out" / "results.json") as f:
        assert json.load(f)["overheads"] == str(path)


def _local_cpu_with(change):
    with open(LOCAL_CPU) as f:
        data = json.load(f)
    change(data)
    return data


@pytest.mark.parametrize("name, change, says", [
    # a GPU kind where TensorFlow has no GPU: the cluster cannot run here at all, measured or not
    ("gpu", lambda c: c["devices"][0].update(kind="V100"), ["gpu.json: devices[0].kind: 'V100' is a GPU kind"]),
    ("one_device", lambda c: c.update(devices=c["devices"][:1]),
     ['activate_config.txt: overheads: is "measure", but ', "devices has 1 device"]),
])
def test_measuring_the_overheads_of_a_cluster_that_cannot_run_here_is_refused(tmp_path, monkeypatch, capsys, name,
                                                                               change, says):
    import tensorflow as tf
    from tfplace.cli import activate, common
    from tfplace.runtime import local_cluster
    monkeypatch.setattr(local_cluster.subprocess, "Popen", lambda *a, **k: pytest.fail("a server was started"))
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])  # as here: no GPU
    cluster = tmp_path / f"{name}.json"
    cluster.write_text(json.dumps(_local_cpu_with(change)))
    status = common.call(activate, [_config(tmp_path, cluster=str(cluster), overheads="measure")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert all(text in err for text in says) and "Fix:" in err, err
    assert not (tmp_path / "out").exists()


def test_an_overheads_value_that_is_neither_a_file_nor_measure_names_the_field(tmp_path):
    from tfplace.formats.config import load_activate_config
    from tfplace.formats.errors import InputError
    with pytest.raises(InputError, match="overheads") as err:
        load_activate_config(_config(tmp_path, overheads="measured"))
    assert 'or write "measure"' in str(err.value)
    assert load_activate_config(_config(tmp_path, overheads="measure")).overheads == "measure"


@pytest.mark.parametrize("stamp_s, probes_s, remote, says, probes", [
    (0.5e-3, [1e-3], False, "2.00x faster than this one", 13),  # this machine slower all along: probed again
    (1e-3, [1e-3], False, None, 3),
    (1e-3, [2e-3] * 3 + [1e-3], False, None, 13),  # a slow phase at first: probed again, the quiet speed agrees
    (2e-3, [1e-3], False, "2.00x slower than this one", 3),  # this machine faster: more probes cannot change it
    (None, [1e-3], False, None, 0),              # no stamp: nothing to compare
    (0.5e-3, [1e-3], True, None, 0),             # the cluster runs on other hosts: this machine says nothing
])
def test_the_commands_note_names_the_measuring_command(monkeypatch, stamp_s, probes_s, remote, says, probes):
    import dataclasses
    from tfplace.cli.common import overheads_machine_note
    from tfplace.formats.cluster import load_cluster
    from tfplace.overheads.model import load_overheads
    calls = []
    monkeypatch.setattr(machine_speed, "probe_core_s", lambda core, **_: calls.append(core) or
                        probes_s[min(len(calls), len(probes_s)) - 1])
    monkeypatch.setattr(machine_speed.time, "sleep", lambda s: None)
    monkeypatch.setattr(machine_speed, "cores_of", lambda cluster: [0])  # one core: 3 probes calibrate it
    cluster = load_cluster(LOCAL_CPU)
    if remote:
        cluster = dataclasses.replace(cluster, hosts=tuple(dataclasses.replace(h, address="10.0.0.7")
                                                           for h in cluster.hosts))
    overheads = dataclasses.replace(load_overheads(OVERHEADS), machine_probe_s=stamp_s)
    note = overheads_machine_note(cluster, LOCAL_CPU, overheads, "O.json")
    if says is None:
        assert note is None
    else:
        assert note.startswith("note: the runtime overheads in O.json were measured on a machine") and says in note
        assert note.endswith(f"measure them on this machine (python -m tfplace.cli.overheads --cluster {LOCAL_CPU} "
                             "--out O), then give --overheads O")
    assert len(calls) == probes


@pytest.mark.slow
def test_plan_says_its_overheads_file_is_from_another_machine(tmp_path):
    """A file stamped with a machine a thousand times slower than any: plan says so, and still plans."""
    import subprocess
    import sys
    with open(OVERHEADS) as f:
        data = json.load(f)
    data["machine_probe_s"] = 1000.0
    stale = tmp_path / "stale.overheads.json"
    stale.write_text(json.dumps(data))
    done = subprocess.run([sys.executable, "-m", "tfplace.plan", "--model", "tiny_mlp", "--batch_size", "16",
                           "--cluster", LOCAL_CPU, "--overheads", str(stale), "--samples", "0",
                           "--out", str(tmp_path / "s.json")], capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path), env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stderr[-2000:]
    notes = [line for line in done.stderr.splitlines() if "were measured on a machine" in line]
    assert len(notes) == 1 and "x slower than this one: simulated times will read high" in notes[0], done.stderr
    assert (tmp_path / "s.json").exists()


def test_an_overheads_file_that_cannot_be_written_stops_the_run_before_any_work(tmp_path, monkeypatch, capsys):
    from tfplace.cli import activate, common
    from tfplace.runtime import local_cluster
    monkeypatch.setattr(local_cluster.subprocess, "Popen", lambda *a, **k: pytest.fail("a server was started"))
    (tmp_path / "out" / "overheads.json").mkdir(parents=True)  # a folder where the file would go
    status = common.call(activate, [_config(tmp_path, overheads="measure")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "output_dir" in err and "overheads.json" in err and "Fix:" in err, err


@pytest.mark.parametrize("probes_s, says", [
    ([1.0, 1.0, 1.0, 1.0, 1.0, 1.0], None),                 # quiet all along
    ([2.2, 2.2, 1.0, 1.0, 2.2, 2.2], "ran 2.20x slower"),   # slow around the measurement
    ([1.0, 1.0, 1.0, 1.0, 2.0, 2.0], "ran 1.50x slower"),   # slow after it: the median of the four kept
    ([1.0, 1.0, 1.0, 1.0, 1.0, 1.8], None),                 # one probe's spike, as an idle machine shows
    ([1.0, 1.0, 2.2, 2.2, 1.0, 1.0], None),                 # slow between steps: the servers' own load
    ([1.0, 1.1, 1.0, 1.0, 1.0, 1.0], None),                 # within one machine's quiet spread
])
def test_measuring_says_when_the_machine_ran_slow_around_it(tmp_path, monkeypatch, probes_s, says):
    """The line that ends the measurement judges the median of the probes before and after it;
    those between the steps (the 3rd and 4th here) only help find the quiet speed: an idle machine
    read 1.9-2.1x slow there while the servers still loaded the cores."""
    from tfplace.cli import activate
    from tfplace.cli import overheads as overheads_cli
    from tfplace.formats.cluster import load_cluster
    from tfplace.overheads.model import load_overheads
    seconds = iter(probes_s)
    watch = machine_speed.SpeedWatch([0], probe_fn=lambda core: next(seconds))

    def fake_measure(cluster, source, lc_kwargs, how_text, progress=None, watch=None, **kw):
        for i in range(len(probes_s)):  # as the real one: probes before, at progress lines (not kept), after
            watch.probe(keep=i not in (2, 3))
        return load_overheads(OVERHEADS)
    monkeypatch.setattr(overheads_cli, "measure", fake_measure)
    text = io.StringIO()
    activate.measure_cluster_overheads(load_cluster(LOCAL_CPU), LOCAL_CPU, str(tmp_path / "o.json"), "a test",
                                       watch=watch, out=text)
    (last,) = [line for line in text.getvalue().splitlines() if line.startswith("measured the runtime overheads")]
    if says is None:
        assert "slower" not in last, last
    else:
        assert says in last and "they may be high" in last, last
    assert watch.reference_s[0] == 1.0 and len(watch.probes) == len(probes_s) - 2
    assert (tmp_path / "o.json").exists()


def test_measuring_outside_activate_refuses_what_cannot_be_measured(tmp_path):
    """measure_cluster_overheads (also hetero_bench's) checks the cluster before any server starts."""
    from tfplace.cli.activate import measure_cluster_overheads
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.errors import InputError
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(_local_cpu_with(lambda c: c["devices"][0].update(kind="V100"))))
    with pytest.raises(InputError, match=r"devices\[0\]\.kind"):
        measure_cluster_overheads(load_cluster(str(path)), str(path), str(tmp_path / "o.json"), "a test")
    assert not (tmp_path / "o.json").exists()


def test_without_overheads_activate_suggests_measuring_them(tmp_path, monkeypatch):
    seen = []
    _no_servers(monkeypatch, seen)
    monkeypatch.setattr(machine_speed, "probe_core_s", lambda core, **_: 1e-3)
    from tfplace.cli.activate import run
    text = io.StringIO()
    run(_config(tmp_path), out=text)
    (note,) = [line for line in text.getvalue().splitlines() if "no runtime-overheads file was given" in line]
    assert 'write "overheads": "measure" in the config' in note and "local_cpu.overheads.json" in note


@pytest.mark.parametrize("argv, starts", [
    ([], False),
    (["--confirm_real", "2"], True),
    (["--confirm_real=2"], True),
    (["--confirm_real", "0"], False),       # no real check: no servers
    (["--overheads", "measure"], True),
    (["--overheads=measure"], True),
    (["-overheads", "measure"], True),
    (["--overheads", OVERHEADS], False),
    (["--out", "measure.json", "--overheads", OVERHEADS], False),
    (["--flagfile", "{flagfile}"], True),   # flags from a file count as on the command line
])
def test_plan_knows_from_its_parsed_flags_whether_it_starts_servers(tmp_path, argv, starts):
    """plan.starts_servers, asked once the flags are parsed (here through common.call, with a main
    that reports the answer as its exit status)."""
    import types
    from tfplace.cli import common, plan
    flagfile = tmp_path / "flags.txt"
    flagfile.write_text("--overheads=measure\n")
    probe = types.SimpleNamespace(__name__="plan", __doc__=plan.__doc__, define_flags=plan.define_flags,
                                  main=lambda rest: 10 + plan.starts_servers())
    base = ["--model", "tiny_mlp", "--cluster", LOCAL_CPU, "--out", str(tmp_path / "s.json")]
    assert common.call(probe, base + [a.format(flagfile=flagfile) for a in argv]) == 10 + starts


@pytest.mark.parametrize("argv, enters", [
    ([], False),
    (["--overheads", "measure"], True),
    (["--confirm_real", "1"], True),
])
def test_plan_enters_a_private_network_when_it_starts_servers(tmp_path, argv, enters):
    """The command line itself (common.run, in a child process): the private network is entered
    once the flags are parsed, only when they ask for servers (planning is replaced by a main that
    does nothing, and entering the network by a marker line)."""
    import subprocess
    import sys
    code = ("import sys; from tfplace.cli import common, plan\n"
            "common._enter_private_network = lambda: print('ENTERED', flush=True)\n"
            "plan.main = lambda argv: 0\n"
            "sys.argv = ['plan'] + sys.argv[1:]; plan.run()")
    argv = ["--model", "tiny_mlp", "--cluster", LOCAL_CPU, "--out", str(tmp_path / "s.json"), *argv]
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("ENTERED" in done.stdout.splitlines()) == enters, done.stdout


@pytest.mark.parametrize("argv, says", [
    (["--overheads", "missing.json"], "or give --overheads measure"),
    (["--overheads", "measure", "--cluster", os.path.join(ROOT, "clusters", "heterog_testbed.json")],
     'argument: --overheads: is "measure", but '),  # measuring needs this machine's tasks: refused first
    (["--overheads", "measure", "--cluster", os.path.join(ROOT, "clusters", "heterog_testbed.json")],
     "hosts[0].address"),
    (["--overheads", "measure", "--cluster", os.path.join(ROOT, "clusters", "heterog_testbed.json")],
     "Fix: leave out --overheads measure (GPU clusters need none) or give a measured overheads file"),
])
def test_plan_overheads_bad_input_exits_2_naming_the_fix(tmp_path, argv, says):
    import subprocess
    import sys
    base = ["--model", "tiny_mlp", "--batch_size", "16", "--cluster", LOCAL_CPU, "--out", str(tmp_path / "s.json")]
    done = subprocess.run([sys.executable, "-m", "tfplace.plan", *base, *argv], capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path), env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "s.json").exists() and not (tmp_path / "s.overheads.json").exists()
