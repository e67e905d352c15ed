"""tmpdir: a command's private temporary folder, removed at its end, or by the next command once
its process is gone (SIGKILL leaves it behind); a running process's folder is never removed."""

import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tfplace.runtime import tmpdir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A process that makes its private folder in argv[1], writes a file there as TensorFlow would,
# says where on stdout, and waits to be killed.
_CHILD = """
import sys, tempfile, time
from tfplace.runtime.tmpdir import private_tmpdir
with private_tmpdir(sys.argv[1]) as path:
    tempfile.NamedTemporaryFile(prefix="__autograph_generated_file", suffix=".py", delete=False).close()
    print(path, flush=True)
    time.sleep(300)
"""


def _dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("killed, removed", [(True, True), (False, False)])
def test_the_next_start_removes_the_folder_of_a_killed_process_only(tmp_path, killed, removed):
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             cwd=REPO)
    try:
        path = child.stdout.readline().strip()
        assert os.path.basename(path).startswith(f"tfplace-{child.pid}-{tmpdir.pid_namespace()}-"), path
        assert any(n.startswith("__autograph_generated_file") for n in os.listdir(path))
        if killed:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=60)
        with tmpdir.private_tmpdir(str(tmp_path)) as mine:  # the next command's start
            assert os.path.isdir(path) != removed and os.path.isdir(mine)
        assert not os.path.exists(mine)  # the command's own: removed at its end
    finally:
        child.kill()
        child.wait(timeout=60)


def test_the_folder_is_the_temp_folder_of_the_process_and_its_children_until_the_end(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    with tmpdir.private_tmpdir() as path:
        assert os.path.dirname(path) == str(tmp_path)
        assert tempfile.gettempdir() == path and os.environ["TMPDIR"] == path
        made = tempfile.mkdtemp()
        assert os.path.dirname(made) == path
    assert not os.path.exists(path) and tempfile.tempdir is None and os.environ["TMPDIR"] == str(tmp_path)


def test_only_folders_of_ended_processes_of_this_pid_namespace_are_stale(tmp_path):
    dead, ns = _dead_pid(), tmpdir.pid_namespace()
    keep = [f"tfplace-{os.getpid()}-{ns}-own", f"tfplace-{os.getppid()}-{ns}-parent", f"tfplace-x-{ns}-odd",
            f"other-{dead}-{ns}-x", f"tfplace-{dead}-{ns + 1}-another_namespace", f"tfplace-{dead}-no_namespace"]
    for name in keep + [f"tfplace-{dead}-{ns}-gone"]:
        (tmp_path / name).mkdir()
    (tmp_path / f"tfplace-{dead}-{ns}-file").write_text("not a folder")
    assert tmpdir.remove_stale(str(tmp_path)) == [str(tmp_path / f"tfplace-{dead}-{ns}-gone")]
    assert sorted(os.listdir(tmp_path)) == sorted(keep + [f"tfplace-{dead}-{ns}-file"])


@pytest.mark.parametrize("command", ["tfplace.train", "tfplace.pretrain", "tfplace.plan"])
def test_the_long_running_commands_clean_up_at_start_and_at_the_end(tmp_path, command):
    stale = tmp_path / f"tfplace-{_dead_pid()}-{tmpdir.pid_namespace()}-abc"
    stale.mkdir()
    (stale / "__autograph_generated_filexyz.py").write_text("")
    done = subprocess.run([sys.executable, "-m", command, "--help"], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert os.listdir(tmp_path) == []  # the stale folder, and the command's own


def test_a_temp_folder_that_takes_no_folder_leaves_the_temp_folder_as_it_was(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    before = tempfile.tempdir
    with tmpdir.private_tmpdir(str(not_a_folder)) as path:
        assert path is None and tempfile.tempdir == before


def test_an_ended_process_its_parent_has_not_reaped_yet_is_not_running():
    from tfplace.emulation.cpu_quota import pid_alive
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        assert pid_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        for _ in range(200):  # until it is a zombie: ended, not waited for
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    break
            time.sleep(0.05)
        assert not pid_alive(child.pid)
    finally:
        child.kill()
        child.wait(timeout=60)
    assert not pid_alive(child.pid)
