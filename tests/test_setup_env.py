"""scripts/setup_env.sh: every checkout gets its own `.venv` on the one cached stack.

Two checkouts on one machine share the cached TensorFlow/Horovod environment, but each imports
its own code, whichever of them ran the set-up last (the script used to install tfplace into
the shared environment, so the checkout set up last won for both). A `.venv` the script did not
make is refused with a fix, never overwritten.
"""

import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
MARKER = os.path.join(REPO, ".venv", ".tfplace-stack")  # the shared stack this checkout's .venv reads

pytestmark = pytest.mark.skipif(
    not os.path.isfile(MARKER) or shutil.which("git") is None or not os.path.isdir(os.path.join(REPO, ".git")),
    reason="needs a git checkout whose .venv scripts/setup_env.sh made")


def _copy_checkout(dest):
    """The checkout's tracked files, as they are in the working tree, copied to `dest`."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = os.path.join(REPO, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))
    return dest


def _setup(checkout):
    with open(MARKER) as f:
        stack = f.read().strip()
    env = dict(os.environ, TFPLACE_CACHE=os.path.dirname(stack))  # the same cached stack, never a new build
    return subprocess.run(["bash", os.path.join(checkout, "scripts", "setup_env.sh")], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=600)


def _imported_from(checkout, module):
    code = f"import {module}; print({module}.__file__)"
    out = subprocess.run([os.path.join(checkout, ".venv", "bin", "python"), "-c", code], cwd="/",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return os.path.realpath(out.stdout.strip().splitlines()[-1])


def test_two_checkouts_import_their_own_code(tmp_path):
    other = _copy_checkout(str(tmp_path / "other"))
    done = _setup(other)
    assert done.returncode == 0, done.stderr[-3000:]
    # set up last, the other checkout must not take this checkout's .venv with it
    for module, folder in (("tfplace", "tfplace"), ("tfplace.simulator", "simulator"), ("tfplace.policy", "policy")):
        assert _imported_from(other, module).startswith(os.path.realpath(os.path.join(other, folder)) + os.sep)
        assert _imported_from(REPO, module).startswith(os.path.join(REPO, folder) + os.sep)
    with open(os.path.join(other, ".venv", ".tfplace-stack")) as mine, open(MARKER) as theirs:
        assert mine.read() == theirs.read()  # one shared stack


def test_a_foreign_venv_is_refused(tmp_path):
    other = _copy_checkout(str(tmp_path / "other"))
    os.makedirs(os.path.join(other, ".venv"))
    keep = os.path.join(other, ".venv", "mine.txt")
    with open(keep, "w") as f:
        f.write("a user's file")
    done = _setup(other)
    assert done.returncode == 2
    assert ".venv exists and was not made by scripts/setup_env.sh" in done.stderr and "fix:" in done.stderr
    assert os.path.isfile(keep)


def test_a_second_set_up_waits_for_the_build_in_progress(tmp_path):
    """While another set-up holds the environment's lock (building it), a set-up waits instead of
    deleting and rebuilding the same folder under it; once the lock is released it goes on."""
    import fcntl
    import time
    with open(MARKER) as f:
        stack = f.read().strip()
    other = _copy_checkout(str(tmp_path / "other"))
    env = dict(os.environ, TFPLACE_CACHE=os.path.dirname(stack))
    with open(stack + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.Popen(["bash", os.path.join(other, "scripts", "setup_env.sh")], cwd=other, env=env,
                                stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(3)
            assert proc.poll() is None, "the set-up did not wait for the lock: " + proc.stderr.read()[-2000:]
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "waiting for another set-up" in err and "ready: .venv" in err
