"""Fault injection that starts processes: TF servers, Horovod ranks, whole command lines.

Table-driven by category:
  * port: every listening socket of a real `activate.py` run (TF servers, Horovod rendezvous and
    Gloo) accepts connections through loopback only, looked at from the machine's own network
    namespace, and the run leaves no temporary folder; a port taken between choosing and binding
    is retried on new ports.
  * process: SIGTERM / SIGINT to `activate.py` (or to `plan --confirm_real`, the overheads
    command, `profile --cluster`) while TF servers, Horovod ranks or measurements run leaves no
    process and no temporary folder, exits 143 / 130, and keeps the results written so far;
    after a SIGKILL the Horovod ranks end and remove their folder; a worker that dies in one entry
    is replaced for the next; a second run on the same output folder stops with exit 2 naming the
    run that holds it.
The unit-level faults (bad files, paths, values, resume) are in test_faults_unit_*.py.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tfplace.runtime import netns

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "clusters", "local_cpu.json")
PYTHON = sys.executable


def _write(path, obj) -> str:
    with open(path, "w") as f:
        json.dump(obj, f)
    return str(path)


def _activate_config(tmp_path, baselines, steps=3, out="out") -> str:
    return _write(tmp_path / "activate_config.txt", {
        "format": "tfplace.activate_config", "cluster": CLUSTER, "graphs": [{"model": "tiny_mlp", "batch_size": 12}],
        "baselines": list(baselines), "steps": steps, "warmup_steps": 1, "output_dir": str(tmp_path / out),
        "trace": False})


def _in_machine_namespace():
    """preexec_fn: the child starts in the namespace this test process started in (the conftest
    moved this process into a private one), so the command makes its own as a user's would."""
    fd = netns.original_namespace_fd()

    def preexec():
        # SIGINT as a terminal delivers it, even when this test runs with SIGINT ignored (a shell
        # starts background jobs so, and a child would inherit that: the signal would go unseen)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if fd is not None:
            netns.join_namespace(fd)
    return preexec


def _descendants(pid: int):
    """pids of every live descendant of `pid` (walks /proc's parent links)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stop_and_check(proc, sig, status: int, tmp) -> str:
    """Sends `sig` to `proc` and checks it exits `status` with common.guarded's line and no
    traceback, leaving no process of its family (within the servers' and ranks' SIGKILL grace,
    with margin) and no temporary folder in `tmp`; returns its output."""
    family = [proc.pid, *_descendants(proc.pid)]
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == status, out
    assert "stopped by" in out and "Traceback" not in out, out
    deadline = time.monotonic() + 15
    while [p for p in family if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in family if _alive(p)], [(p, _cmdline(p)) for p in family if _alive(p)]
    assert os.listdir(tmp) == [], f"temporary folders left: {os.listdir(tmp)}"
    return out


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, ended but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start_activate(tmp_path, config):
    """`python activate.py config` in the machine's namespace, with its own TMPDIR (so its
    temporary folders can be counted) and its own process group (so the test can sweep it)."""
    return _start(tmp_path, [os.path.join(ROOT, "activate.py"), config])


def _start(tmp_path, args):
    """`python *args` as _start_activate starts activate.py."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, TMPDIR=str(tmp), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop(netns.ALLOW_OPEN_PORTS_ENV, None)
    return subprocess.Popen([PYTHON, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_in_machine_namespace(), start_new_session=True), tmp


def _sweep(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


# ------------------------------------------------------------------------------------- port

@pytest.mark.multiprocess
def test_port_every_listener_of_an_activate_run_is_loopback_only(tmp_path):
    """A real run with TF servers and Horovod ranks; every socket any of its processes listens on,
    seen while it runs, accepts loopback connections only."""
    proc, tmp = _start_activate(tmp_path, _activate_config(tmp_path, ["dp_even_allreduce", "horovod_even"], steps=4))
    seen, beyond, kinds = set(), set(), set()
    try:
        while proc.poll() is None:
            for pid in [proc.pid, *_descendants(proc.pid)]:
                found = netns.listeners(pid)
                if found:
                    kinds.add("horovod" if "horovod_worker" in _cmdline(pid) else
                              "tf" if "tfplace.runtime.worker" in _cmdline(pid) else "launcher")
                for address, reachable in found:
                    seen.add((pid, address))
                    if reachable:
                        beyond.add((pid, _cmdline(pid)[:80], address))
            time.sleep(0.05)
        out = proc.stdout.read()
    finally:
        _sweep(proc)
    assert proc.returncode == 0, out
    assert {"tf", "horovod"} <= kinds, f"the check saw listeners of {kinds} only: {seen}\n{out}"
    assert not beyond, f"listening beyond loopback: {beyond}"
    assert os.listdir(tmp) == [], f"temporary folders left: {os.listdir(tmp)}"


@pytest.mark.multiprocess
def test_port_the_check_sees_an_open_server():
    """The control for the test above: a TF server allowed onto every interface of a namespace
    with a non-loopback interface is reported (so an empty report means something)."""
    fd = netns.original_namespace_fd()
    if fd is None:
        pytest.skip("this test process did not leave the machine's namespace (see conftest.py)")
    probe = subprocess.run([PYTHON, "-c", "import socket; print(len(socket.if_nameindex()))"],
                           preexec_fn=_in_machine_namespace(), capture_output=True, text=True)
    if probe.stdout.strip() == "1":
        pytest.skip("this machine has no interface besides loopback: nothing to expose a server on")
    script = ("import sys, time; from tfplace.runtime.local_cluster import LocalCluster\n"
              "with LocalCluster(1) as lc:\n    print(lc.pids[0], flush=True); sys.stdin.read()\n")
    env = dict(os.environ, **{netns.ALLOW_OPEN_PORTS_ENV: "1"}, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen([PYTHON, "-c", script], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_in_machine_namespace(), start_new_session=True)
    try:
        worker = int(proc.stdout.readline())
        assert netns.non_loopback_listeners(worker), netns.listeners(worker)
        assert "every interface" in proc.stderr.readline()
    finally:
        proc.stdin.close()
        proc.wait(60)
        _sweep(proc)


@pytest.mark.multiprocess
def test_port_taken_between_choice_and_bind_is_retried(monkeypatch):
    from tfplace.runtime import local_cluster
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    calls = []
    choose = local_cluster._free_ports

    def first_taken(host, n):
        calls.append(n)
        return [port] * n if len(calls) == 1 else choose(host, n)

    monkeypatch.setattr(local_cluster, "_free_ports", first_taken)
    try:
        with local_cluster.LocalCluster(num_tasks=1) as lc:
            assert len(calls) == 2, "the taken port was not retried"
            assert lc.task_addresses[0] != f"127.0.0.1:{port}"
            assert not lc.dead_tasks()
    finally:
        held.close()


# ---------------------------------------------------------------------------------- process

@pytest.mark.multiprocess
@pytest.mark.parametrize("sig, status, phase", [
    (signal.SIGTERM, 143, "horovod"),                # while Horovod ranks run
    (signal.SIGINT, 130, "horovod"),
    (signal.SIGTERM, 143, "tfplace.runtime.worker"),  # while TF servers run
    (signal.SIGTERM, 143, "measure"),                 # while "overheads": "measure" runs its servers
], ids=["sigterm-horovod", "sigint-horovod", "sigterm-tf-servers", "sigterm-overheads-measure"])
def test_process_a_stopped_activate_leaves_nothing_behind(tmp_path, sig, status, phase):
    baselines = ["dp_even_allreduce", "horovod_even"] if phase == "horovod" else ["dp_even_allreduce"]
    steps = 2000 if phase == "horovod" else 5000  # the signal comes long before the entry ends (with 400
    # Horovod steps a full-suite run saw activate finish before the signal, exit 0 instead of 130)
    config = _activate_config(tmp_path, baselines, steps=steps)
    if phase == "measure":
        with open(config) as f:
            _write(config, dict(json.load(f), overheads="measure"))
    proc, tmp = _start_activate(tmp_path, config)
    try:
        marker = {"horovod": "horovod_worker", "measure": "tfplace.runtime.worker"}.get(phase, phase)
        _wait_for(lambda: [p for p in _descendants(proc.pid) if marker in _cmdline(p)], 240, marker)
        if phase == "horovod":
            # the entry before it finished: its row must survive the interrupt
            _wait_for(lambda: os.path.exists(tmp_path / "out" / "results.json"), 60, "results.json")
        time.sleep(1.0)
        _stop_and_check(proc, sig, status, tmp)
        assert not (tmp_path / "out" / "overheads.json").exists()  # never a half-measured file
        if phase == "horovod":
            with open(tmp_path / "out" / "results.json") as f:
                results = json.load(f)
            assert results["complete"] is False
            assert [r["name"] for r in results["results"]] and results["results"][0]["error"] is None
    finally:
        _sweep(proc)


@pytest.mark.multiprocess
def test_process_a_killed_activate_leaves_no_rank_behind(tmp_path):
    """SIGKILL to activate.py while Horovod ranks run: it cannot stop them, so each rank watches
    it and ends, removing the run's temporary folder, instead of training on to the end."""
    proc, tmp = _start_activate(tmp_path, _activate_config(tmp_path, ["horovod_even"], steps=100000))
    family = []
    try:
        def all_ranks():  # they start one after another: the check waits for the third
            ranks = [p for p in _descendants(proc.pid) if "horovod_worker" in _cmdline(p)]
            return ranks if len(ranks) == 3 else None
        ranks = _wait_for(all_ranks, 240, "the 3 Horovod ranks")
        time.sleep(1.0)
        family.extend(_descendants(proc.pid))
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        _wait_for(lambda: not [p for p in family if _alive(p)], 15, "every rank to end")
        _wait_for(lambda: os.listdir(tmp) == [], 15, f"the temporary folders to go: {os.listdir(tmp)}")
        assert len(ranks) == 3 and set(ranks) <= set(family)
    finally:
        _sweep(proc)
        for p in family:  # a rank that outlived the check: not left to train on
            if _alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.multiprocess
@pytest.mark.parametrize("servers_of", [
    ["--confirm_real", "1", "--confirm_steps", "100000"],  # the real check's
    ["--overheads", "measure"],                            # the overheads measurement's, before planning
], ids=["confirm-real", "overheads-measure"])
def test_process_a_stopped_plan_check_leaves_nothing_behind(tmp_path, servers_of):
    """SIGTERM to `python -m tfplace.plan --confirm_real` (or `--overheads measure`) while its TF
    servers run: exit 143, no server left, no temporary folder, and no strategy file (nothing was
    chosen) nor overheads file (nothing was measured to the end)."""
    out = tmp_path / "s.json"
    proc, tmp = _start(tmp_path, ["-m", "tfplace.plan", "--model", "tiny_mlp", "--batch_size", "12", "--cluster",
                                  CLUSTER, "--out", str(out), "--samples", "0", *servers_of])
    try:
        _wait_for(lambda: [p for p in _descendants(proc.pid) if "tfplace.runtime.worker" in _cmdline(p)], 240,
                  "TF servers")
        time.sleep(1.0)
        _stop_and_check(proc, signal.SIGTERM, 143, tmp)
        assert not out.exists() and not (tmp_path / "s.overheads.json").exists()
    finally:
        _sweep(proc)


HETERO = os.path.join(ROOT, "clusters", "local_cpu_hetero.json")


@pytest.mark.multiprocess
@pytest.mark.parametrize("sig, status, args, marker", [
    (signal.SIGTERM, 143, ["-m", "tfplace.cli.overheads", "--cluster", HETERO, "--passes", "3", "--out", "{out}"],
     "tfplace.runtime.worker"),
    (signal.SIGINT, 130, ["-m", "tfplace.cli.overheads", "--cluster", HETERO, "--passes", "3", "--out", "{out}"],
     "tfplace.runtime.worker"),
    # a child per kind (`--kind K`); the signal comes while the first measures
    (signal.SIGTERM, 143, ["-m", "tfplace.profile", "--graph", "tiny_mlp", "--cluster", HETERO, "--repeats", "100000",
                           "--out", "{out}"], "--kind"),
], ids=["sigterm-overheads", "sigint-overheads", "sigterm-profile-cluster"])
def test_process_a_stopped_measurement_exits_as_the_signal_says(tmp_path, sig, status, args, marker):
    """SIGTERM / SIGINT to `python -m tfplace.cli.overheads` or `python -m tfplace.profile
    --cluster` while it measures: exit 143 / 130 with common.guarded's one line, no process nor
    temporary folder left."""
    out = tmp_path / "measured.json"
    proc, tmp = _start(tmp_path, [a.replace("{out}", str(out)) for a in args])
    try:
        _wait_for(lambda: [p for p in _descendants(proc.pid) if marker in _cmdline(p)], 240, marker)
        time.sleep(1.0)
        _stop_and_check(proc, sig, status, tmp)
    finally:
        _sweep(proc)


@pytest.mark.multiprocess
def test_process_a_dead_worker_is_replaced_for_the_next_entry(tmp_path, monkeypatch):
    from tfplace.cli import activate
    config = _activate_config(tmp_path, ["dp_even_allreduce", "dp_proportional_allreduce"], steps=2)
    run_one, clusters = activate._run_one, []

    def kill_in_first(job, cluster, lc, config, overheads, watch):
        clusters.append(lc)
        if len(clusters) == 1:
            lc.kill_task(1)
        return run_one(job, cluster, lc, config, overheads, watch)

    monkeypatch.setattr(activate, "_run_one", kill_in_first)
    rows = activate.run(config, out=open(os.devnull, "w"))
    assert rows[0]["error"] and "worker task 1" in rows[0]["error"], rows[0]
    assert rows[1]["error"] is None, rows[1]["error"]
    assert clusters[1] is not clusters[0] and not clusters[0].running


@pytest.mark.multiprocess
def test_process_a_second_run_on_the_same_output_folder_stops(tmp_path):
    from tfplace.cli import common
    config = _activate_config(tmp_path, ["dp_even_allreduce"])
    os.makedirs(tmp_path / "out")
    holder = subprocess.Popen([PYTHON, "-c", "import sys; from tfplace.cli.common import OutputLock\n"
                               f"with OutputLock({str(tmp_path / 'out')!r}, 'x'):\n"
                               "    print('held', flush=True); sys.stdin.read()"],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = subprocess.run([PYTHON, os.path.join(ROOT, "activate.py"), config], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert f"in use by another run (pid {holder.pid})" in proc.stderr and "Fix:" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not os.path.exists(tmp_path / "out" / "results.json")
    finally:
        holder.stdin.close()
        holder.wait(30)
    with common.OutputLock(str(tmp_path / "out"), "x"):  # released when its holder ended
        pass


SCRIPT_UNDER_SIGTERM = """
import atexit, sys, time
from tfplace.runtime.signals import stop_on_sigterm
atexit.register(lambda: print("exit handler ran", flush=True))
stop_on_sigterm(replace=False)  # as a LocalCluster installs it when it starts
try:
    print("ready", flush=True)
    time.sleep(60)
finally:
    print("finally ran", flush=True)
"""


def test_process_a_script_stopped_by_sigterm_cleans_up_and_exits_143(tmp_path):
    """A user's script with a LocalCluster (which makes SIGTERM raise, so that `with` blocks stop
    the servers): SIGTERM runs its `finally` blocks and exit handlers, then ends it with status
    143 and one line, not a traceback and status 1."""
    proc = subprocess.Popen([PYTHON, "-c", SCRIPT_UNDER_SIGTERM], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, (out, err)
    assert out.split() == ["finally", "ran", "exit", "handler", "ran"], out
    assert err.strip() == "stopped by SIGTERM", err
