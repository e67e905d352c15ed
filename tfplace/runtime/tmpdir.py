"""A private temporary folder per command: `tfplace-<pid>-<pid namespace>-<random>` under the system's
temp folder.

TensorFlow's autograph writes each function it converts to `__autograph_generated_file*.py` in
the temp folder and removes it only at a normal exit; a run killed with SIGKILL (or by the
out-of-memory killer) leaves them all behind. The long-running command lines (train, pretrain,
plan) run inside `private_tmpdir()` (tfplace.cli.common.run's `private_tmp`): Python's `tempfile` (which TensorFlow uses) and the processes
the command starts (TMPDIR) write into a folder of this process, removed when the command ends.
A folder whose process is gone, however it ended, is removed by the next command that starts. The
name holds the process's pid namespace (/proc/self/ns/pid): a temp folder shared with a container
holds folders of pids this process cannot see, and those are left alone.

    with tmpdir.private_tmpdir():
        ...  # the command's work
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from typing import Iterator, List, Optional

from tfplace.emulation.cpu_quota import pid_alive

PREFIX = "tfplace-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-(\d+)-")


def pid_namespace() -> int:
    """The inode of this process's pid namespace ("pid:[4026531836]" -> 4026531836); 0 without /proc."""
    try:
        return int(os.readlink("/proc/self/ns/pid").strip("pid:[]"))
    except (OSError, ValueError):
        return 0


def remove_stale(base: str) -> List[str]:
    """Removes the private folders in `base` (PREFIX<pid>-<pid namespace>-...) of this user and pid
    namespace whose process is gone; returns their paths. Folders of running processes, of other
    users or pid namespaces, and this process's own, stay."""
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    namespace = pid_namespace()
    for name in names:
        match = _NAME.match(name)
        if not match or int(match.group(1)) == os.getpid() or int(match.group(2)) != namespace:
            continue
        path = os.path.join(base, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or pid_alive(int(match.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


@contextlib.contextmanager
def private_tmpdir(base: Optional[str] = None) -> Iterator[Optional[str]]:
    """Removes the stale private folders in `base` (default: the system's temp folder), makes this
    process's own there and makes it the temp folder of this process (tempfile.tempdir) and of the
    processes it starts (TMPDIR) until the block ends; then removes it and restores both. Yields its
    path, or None where it cannot be made (the temp folder as it was then stays in use)."""
    saved_tempdir, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")  # before gettempdir() caches one
    try:
        base = base or tempfile.gettempdir()
        remove_stale(base)
        path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{pid_namespace()}-", dir=base)
    except OSError:  # no temp folder, or a full or read-only one: what the command writes there fails as it would
        tempfile.tempdir = saved_tempdir
        yield None
        return
    tempfile.tempdir = os.environ["TMPDIR"] = path
    try:
        yield path
    finally:
        tempfile.tempdir = saved_tempdir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(path, ignore_errors=True)
