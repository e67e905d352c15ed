"""The one check every loader makes before it opens a user's file: the path names a regular file.

A folder, a named pipe (FIFO), a device or a socket given where a file is read would fail deep
inside a parser or, worse, block: opening a FIFO waits for a writer, reading /dev/zero never
ends. `require_regular_file` looks at the path with `os.stat` only (which never opens it), so
such a path is refused at once with an `InputError` naming the file and the fix.

    path = require_regular_file("cluster.json")                  # returns the path
    problem = input_problem("/tmp/fifo")                         # (problem, fix) or None
"""

from __future__ import annotations

import os
import stat
from typing import Optional, Tuple, Union

from tfplace.formats.errors import InputError

# Field named when the whole file is bad (tfplace.formats.jsonio re-exports it).
TOP_LEVEL = "(top level)"
# Suffixes of a bare training step (a GraphDef or MetaGraphDef, roles inferred: tfplace.ir.step_roles),
# as against a bundle's .json.
STEP_SUFFIXES = (".pb", ".pbtxt", ".meta")
_FIX = "give the path of a regular file (copy what the pipe or device would give into a file first)"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tfplace/formats/ -> tfplace/


def bundled_root(package_dir: str = _PACKAGE_DIR) -> str:
    """The folder that holds tfplace's bundled clusters/ (and, in a checkout, configs/ and
    examples/): the installed `tfplace` package, where setup.py ships clusters/ as package data
    (tfplace/clusters/), else the checkout's root, beside tfplace/. Not the checkout root alone:
    installed, that is site-packages, which has no clusters/. A config's relative paths resolve
    against it after the config's own folder, so "clusters/heterog_testbed.json" names the
    bundled file in a checkout and in an installed copy alike."""
    if os.path.isdir(os.path.join(package_dir, "clusters")):
        return package_dir
    return os.path.dirname(package_dir)


def _not_found_fix(path: str) -> str:
    """The fix for a missing `path`: a relative path that names a bundled file (a command run
    outside the checkout, or with tfplace installed, given "clusters/local_cpu.json") gets the
    bundled file's absolute path, which command-line flags need (they resolve against the current
    directory only)."""
    if not os.path.isabs(path):
        bundled = os.path.join(bundled_root(), path)
        if os.path.isfile(bundled):
            return f"tfplace's bundled copy is {os.path.normpath(bundled)}: give that path"
    return "check the path"


KERAS_SUFFIXES = (".h5", ".hdf5", ".keras")
_EXPORT_FIX = ("export the model's training step with tfplace.graph_defs.export_keras (a Keras model) or "
               "export_train_step (docs/your_own_model.md)")


def saved_model_problem(path: Union[str, os.PathLike]) -> Optional[Tuple[str, str]]:
    """(problem, fix) when `path` is a saved model rather than a training step: a SavedModel
    folder or its saved_model.pb, or a Keras .h5/.keras file; else None. Never opens the path."""
    path = os.fspath(path)
    name = os.path.basename(os.path.normpath(path))
    if name in ("saved_model.pb", "saved_model.pbtxt") or (
            os.path.isdir(path) and os.path.exists(os.path.join(path, "saved_model.pb"))):
        return "is a SavedModel, not a training step", _EXPORT_FIX
    if name.lower().endswith(KERAS_SUFFIXES):
        return "is a saved Keras model, not a training step", _EXPORT_FIX
    return None


def file_kind(mode: int) -> str:
    """What a non-regular st_mode is, in words ("a folder", "a named pipe (FIFO)", ...)."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def input_problem(path: Union[str, os.PathLike]) -> Optional[Tuple[str, str]]:
    """(problem, fix) that stops reading the file `path`, or None when it is a regular file
    (after symbolic links) this process may stat. Never opens the path."""
    try:
        mode = os.stat(os.fspath(path)).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "file not found", _not_found_fix(os.fspath(path))
    except PermissionError:
        return "cannot be read (permission denied)", "check the file's permissions"
    except (OSError, ValueError) as e:  # a name too long, a NUL byte, a symlink loop
        return f"cannot be read ({getattr(e, 'strerror', None) or e})", "check the path"
    if stat.S_ISREG(mode):
        if not os.access(os.fspath(path), os.R_OK):
            return "cannot be read (permission denied)", "check the file's permissions"
        return None
    kind = file_kind(mode)
    if stat.S_ISDIR(mode):
        return f"is {kind}, not a file", "give the path of a file inside it"
    return f"is {kind}, not a regular file", _FIX


def require_regular_file(path: Union[str, os.PathLike], source: Optional[str] = None,
                         field: str = TOP_LEVEL) -> str:
    """Returns `path` as a string when it names a regular file; raises InputError naming
    `source` (default: the path itself) and `field` otherwise."""
    path = os.fspath(path)
    problem = input_problem(path)
    if problem is None:
        return path
    source = path if source is None else source
    what = problem[0] if source == path else f"{path}: {problem[0]}"
    raise InputError(source, field, what, problem[1])
