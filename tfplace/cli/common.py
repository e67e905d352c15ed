"""What every command line shares: absl flag parsing, one error contract, one output-path check.

Each command line `tfplace/cli/X.py` defines its flags in `define_flags()` (called when the
command runs, so importing it defines none and two commands can share flag names), reads them
in `main(argv)`, and starts with `run(main, define_flags, __doc__)`, which is absl's `app.run`
with this module's flag parser. The contract every command keeps:

  * `--help` (or -h, --helpshort, --helpfull) prints the docstring and the command's flags on
    stdout and exits 0;
  * a usage error (unknown flag, missing required flag, a value a validator rejects, a missing or
    stray positional argument) prints one line `error: ...` on stderr and exits 2;
  * bad input (`tfplace.formats.errors.InputError`: the file, the field, the fix) prints one line
    `error: <file>: <field>: ... Fix: ...` on stderr and exits 2; a failed run exits 1;
  * output paths are checked before any work starts: flags with `output_file_flag` /
    `output_dir_flag` (at parse time), paths from files with `check_output_file` /
    `check_output_dir`.

`call(module, argv)` runs a command in-process (for tests): it defines the module's flags, parses
argv, runs its main, removes the flags again and returns the exit status.
"""

from __future__ import annotations

import functools
import os
import sys
import types
from typing import Callable, List, Optional, Sequence, Tuple

from absl import app, flags

from tfplace.formats.errors import InputError

FLAGS = flags.FLAGS
USAGE_EXIT = 2  # usage errors and bad input
_HELP_ARGS = frozenset({"-h", "-help", "--help", "-?", "--helpshort", "--helpfull"})


# ------------------------------------------------------------------------------ shared inputs

def define_overheads_flag() -> None:
    """`--overheads FILE`: the runtime overheads measured on a CPU-emulated cluster (written by
    `python -m tfplace.cli.overheads`); simulated times then include what that runtime adds.
    GPU clusters need none."""
    flags.DEFINE_string("overheads", None, "runtime-overheads file of a CPU-emulated cluster "
                        "(python -m tfplace.cli.overheads); none for GPU clusters")


def load_overheads_arg(path: Optional[str]):
    """The RuntimeOverheads in `path`, or None without one (tfplace.overheads is imported only
    then: the simulator's path for GPU clusters never loads it)."""
    if not path:
        return None
    from tfplace.overheads.model import load_overheads
    return load_overheads(path)


# ------------------------------------------------------------------------------- output paths

def output_problem(path: str, folder: bool = False) -> Optional[Tuple[str, str]]:
    """(problem, fix) that stops writing the file (or folder) `path`, or None when it can be
    written. A file: its parent folder exists and is writable, and it is not a folder. A folder
    (made with its missing parents, like `mkdir -p`, e.g. runs/<config> on a fresh checkout): it
    and its existing ancestors are folders, the nearest existing one writable."""
    full = os.path.abspath(os.fspath(path))
    if not folder and os.path.isdir(full):
        return f"{path} is an existing folder, not a file", f"give a file name, e.g. {os.path.join(path, 'out.json')}"
    if folder and os.path.exists(full) and not os.path.isdir(full):
        return f"{path} is an existing file, not a folder", "give a folder path (new or existing)"
    target = full if folder and os.path.isdir(full) else os.path.dirname(full)
    if folder:
        while not os.path.exists(target) and os.path.dirname(target) != target:
            target = os.path.dirname(target)
        if not os.path.isdir(target):
            return f"{target} is a file, so the folder {path} cannot be made", "give a folder path under a folder"
    if not os.path.isdir(target):
        return f"folder {os.path.dirname(full)} does not exist", "create it first or write elsewhere"
    if not os.access(target, os.W_OK | os.X_OK):
        return f"folder {target} is not writable", "choose a folder you may write to"
    return None


def check_output_file(path: str, source: str, field: str = "") -> None:
    """Raises InputError (naming `source` and `field`) when the file `path` cannot be written."""
    problem = output_problem(path)
    if problem:
        raise InputError(source, field, *problem)


def check_output_dir(path: str, source: str, field: str = "") -> None:
    """Raises InputError (naming `source` and `field`) when the folder `path` cannot be made or written."""
    problem = output_problem(path, folder=True)
    if problem:
        raise InputError(source, field, *problem)


def _output_checker(folder: bool) -> Callable[[Optional[str]], bool]:
    def check(path: Optional[str]) -> bool:
        problem = None if path is None else output_problem(path, folder)
        if problem:
            raise flags.ValidationError(f"{problem[0]}. Fix: {problem[1]}")
        return True
    return check


def output_file_flag(name: str) -> None:
    """Validates flag `name` at parse time as a file this command will write."""
    flags.register_validator(name, _output_checker(folder=False))


def output_dir_flag(name: str) -> None:
    """Validates flag `name` at parse time as a folder this command will write into."""
    flags.register_validator(name, _output_checker(folder=True))


def int_list_flag(name: str, minimum: int) -> None:
    """Validates the list flag `name` at parse time: every item an integer >= minimum."""
    def check(items: Optional[List[str]]) -> bool:
        for item in items or ():
            try:
                value = int(item)
            except ValueError:
                raise flags.ValidationError(f"{item!r} is not an integer. Fix: write e.g. 8,16,32") from None
            if value < minimum:
                raise flags.ValidationError(f"{value} is not >= {minimum}. Fix: give integers >= {minimum}")
        return True
    flags.register_validator(name, check)


# ------------------------------------------------------------------------------- parsing

def args() -> types.SimpleNamespace:
    """The parsed flags as attributes, hyphens as underscores (`--max-groups` -> `.max_groups`)."""
    return types.SimpleNamespace(**{k.replace("-", "_"): v for k, v in FLAGS.flag_values_dict().items()})


def _define(define_flags: Callable[[], None]) -> List[str]:
    """Calls define_flags; returns the names of the flags it defined, in order."""
    before = set(FLAGS)
    define_flags()
    return [name for name in FLAGS if name not in before]


def _help(doc: str, names: Sequence[str], positional: Sequence[str]) -> str:
    lines = [(doc or "").strip(), ""]
    if positional:
        lines.append("arguments: " + " ".join(positional))
    lines.append("flags:" if names else "flags: none")
    for name in names:
        flag = FLAGS[name]
        shown = f"--[no]{name}" if flag.boolean else f"--{name}"
        default = "" if flag.default is None else f" (default: {flag.default_as_str})"
        lines.append(f"  {shown}: {flag.help}{default}")
    return "\n".join(lines)


def _usage_error(message: str) -> None:
    print("error: " + " ".join(str(message).split()) + " (see --help)", file=sys.stderr)
    sys.exit(USAGE_EXIT)


def _parse(argv: Sequence[str], names: Sequence[str], doc: str, positional: Sequence[str]) -> List[str]:
    """Parses argv into FLAGS under the contract above; returns [program, positional...]."""
    options = list(argv[1:argv.index("--")] if "--" in argv else argv[1:])
    if any(a in _HELP_ARGS for a in options):
        print(_help(doc, names, positional))
        sys.exit(0)
    try:
        rest = FLAGS(list(argv))
    except flags.Error as err:
        _usage_error(str(err))
    if len(rest) - 1 != len(positional):
        got = " ".join(rest[1:]) or "none"
        usage = " ".join([os.path.basename(argv[0]), "[flags]", *positional])
        _usage_error(f"expected {' '.join(positional) or 'no positional arguments'}, got {got}. usage: {usage}")
    return rest


def guarded(main: Callable[[List[str]], Optional[int]]) -> Callable[[List[str]], int]:
    """main, with bad input (InputError) reported as one line `error: ...` and exit status 2."""
    @functools.wraps(main)
    def wrapped(argv: List[str]) -> int:
        try:
            return main(argv) or 0
        except InputError as err:
            print(f"error: {err}", file=sys.stderr)
            return USAGE_EXIT
    return wrapped


def run(main: Callable[[List[str]], Optional[int]], define_flags: Callable[[], None], doc: str,
        positional: Sequence[str] = ()) -> None:
    """`app.run(main)` for a command line: defines its flags, parses them under the contract,
    runs main and exits with its status. `positional` names the required positional arguments."""
    def parser(argv: List[str]) -> List[str]:
        return _parse(argv, _define(define_flags), doc, positional)
    app.run(guarded(main), flags_parser=parser)


def _status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def call(module: types.ModuleType, argv: Sequence[str]) -> int:
    """Runs the command line `module` (its define_flags, main and POSITIONAL, if any) in-process on
    argv (without the program name) and returns its exit status; its flags are removed afterwards."""
    names = _define(module.define_flags)
    try:
        rest = _parse([module.__name__, *argv], names, module.__doc__, getattr(module, "POSITIONAL", ()))
        return _status(guarded(module.main)(rest))
    except SystemExit as exit_:
        return _status(exit_.code)
    finally:
        for name in names:
            if name in FLAGS:
                delattr(FLAGS, name)
