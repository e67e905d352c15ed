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
    `error: <file>: <field>: ... Fix: ...` on stderr and exits 2; a run tfplace stopped on purpose
    (any other TfplaceError: a dead worker, a failed rank, no private network) prints one line
    and exits 1; Ctrl-C exits 130 and SIGTERM 143, after the same clean-up (tfplace.runtime.signals);
  * a command that starts servers (`run(..., servers=True)`) enters a private network namespace
    first (tfplace.runtime.netns); one that writes a folder holds its `OutputLock`;
  * output paths are checked before any work starts: flags with `output_file_flag` /
    `output_dir_flag` (at parse time), paths from files with `check_output_file` /
    `check_output_dir`;
  * numbers and names are checked at parse time (absl bounds, `int_list_flag`, `names_flag`,
    `zoo_model_flag`, `device_kinds_flag`), input files too (`input_file_flag`, `graph_flag`:
    a regular file, never a folder, FIFO or device, which every loader refuses as well).

`call(module, argv)` runs a command in-process (for tests): it defines the module's flags, parses
argv, runs its main, removes the flags again and returns the exit status.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import signal
import sys
import types
from typing import Callable, List, Mapping, Optional, Sequence, Tuple, Union

from absl import app, flags

from tfplace.formats.errors import InputError, TfplaceError
from tfplace.runtime.signals import Terminated, stop_on_sigterm
from tfplace.formats.files import file_kind, require_regular_file

FLAGS = flags.FLAGS
USAGE_EXIT = 2  # usage errors and bad input
FAILED_EXIT = 1  # a run that failed (a dead worker, a failed rank): not the input's fault
_HELP_ARGS = frozenset({"-h", "-help", "--help", "-?", "--helpshort", "--helpfull"})


# ------------------------------------------------------------------------------ shared inputs

def define_overheads_flag(measure: bool = False) -> None:
    """`--overheads FILE`: the runtime overheads measured on a CPU-emulated cluster (written by
    `python -m tfplace.cli.overheads`); simulated times then include what that runtime adds.
    GPU clusters need none. `measure`: the command also takes `--overheads measure`."""
    flags.DEFINE_string("overheads", None, "runtime-overheads file of a CPU-emulated cluster "
                        "(python -m tfplace.cli.overheads)" +
                        ("; 'measure': measured on the cluster first" if measure else "") +
                        "; none for GPU clusters")


def load_overheads_arg(path: Optional[str], cluster=None, source: str = "argument", field: str = "--overheads",
                       fix: str = "leave out --overheads: a GPU cluster takes none"):
    """The RuntimeOverheads in `path`, or None without one (tfplace.overheads is imported only
    then: the simulator's path for GPU clusters never loads it). With `cluster`: an InputError
    naming `source` and `field` (with `fix`) when it has GPUs, which take no overheads."""
    if not path:
        return None
    from tfplace.overheads.model import check_cpu_cluster, load_overheads
    if cluster is not None:
        check_cpu_cluster(cluster, source, field, fix)
    return load_overheads(path)


def overheads_note(cluster, cluster_path: str, overheads_path: Optional[str],
                   give: str = "--overheads {}", fix: Optional[str] = None) -> Optional[str]:
    """A line to print when `cluster` (loaded from `cluster_path`) runs on CPU tasks and no
    overheads file was given (`give`: how this command takes one, {} for the path): the simulator
    then leaves out what TensorFlow's runtime adds per step and per message, and on such clusters
    ranks splits too high. Names the overheads file beside the cluster file when there is one
    (<stem>.overheads.json), else the command that measures one; `fix`, when given, is said
    first. None for GPU clusters or when overheads were given."""
    from tfplace.formats.cluster import is_cpu_kind
    if overheads_path or not all(is_cpu_kind(d.kind) for d in cluster.devices):
        return None
    beside = os.path.splitext(cluster_path)[0] + ".overheads.json"
    known = (f"give {give.format(beside)} (found beside the cluster file)" if os.path.isfile(beside) else
             f"measure them (python -m tfplace.cli.overheads --cluster {cluster_path} --out O), then give "
             f"{give.format('O')}")
    fix = f"{fix}, or {known}" if fix else known
    return (f"note: {cluster_path} runs on CPU tasks and no runtime-overheads file was given: simulated times "
            f"leave out the runtime's per-step and per-message costs, so splits look faster than they run; {fix}")


def overheads_machine_note(cluster, cluster_path: str, overheads, overheads_path: Optional[str],
                           give: str = "--overheads {}", watch=None, fix: Optional[str] = None) -> Optional[str]:
    """A line to print when the runtime overheads `overheads` (loaded from `overheads_path`) were
    measured on a machine whose cores ran more than 1.3x faster or slower than this one's
    (tfplace.runtime.machine_speed.speed_mismatch_note): their CPU figures then misstate every
    simulated time of a run here. Only for a cluster that runs here (every host loopback) and a
    file that records its machine (machine_probe_s). `watch`: the SpeedWatch of a run that probed
    the cores all along; else they are probed now: 3 probes of each core a run uses (about 12 ms
    each: under 0.3 s for up to machine_speed.MAX_UNPINNED_CORES cores), and 10 more spread over
    2-3 s only when the first find this machine slower than the file's (a core in a slow phase must
    not pass for a slow machine).
    `fix` replaces the default, which names the measuring command and `give` (as in overheads_note)."""
    if overheads is None or overheads.machine_probe_s is None or not all(h.is_loopback for h in cluster.hosts):
        return None
    from tfplace.runtime import machine_speed

    def note(w):
        return machine_speed.speed_mismatch_note(
            overheads.machine_probe_s, machine_speed.machine_probe_s(w.reference_s),
            f"the runtime overheads in {overheads_path}", fix or (
                f"measure them on this machine (python -m tfplace.cli.overheads --cluster {cluster_path} --out O), "
                f"then give {give.format('O')}"))
    if watch is not None:
        return note(watch)
    watch = machine_speed.SpeedWatch(machine_speed.cores_of(cluster))
    watch.calibrate()
    now_s = machine_speed.machine_probe_s(watch.reference_s)
    if now_s and now_s > overheads.machine_probe_s * machine_speed.MACHINE_MISMATCH:
        watch.probe_spaced()  # more probes can only find this machine faster: only then can they help
    return note(watch)


def print_profile_note(profile, graph_source: str, profile_path: Optional[str], op_names=()) -> None:
    """Prints to stderr tfplace.profiling.profiler.profile_graph_note's line when the profile read
    from `profile_path` (None: the device model's, nothing to say) was measured on another graph
    (`op_names`: the graph's ops, see profile_graph_note)."""
    if profile_path:
        from tfplace.profiling.profiler import profile_graph_note
        note = profile_graph_note(profile, graph_source, profile_path, op_names)
        if note:
            print(note, file=sys.stderr)


def whole_groups_note(lowerer) -> Optional[str]:
    """The line that says which groups every strategy runs as one replica (Lowerer.whole_groups:
    they deduplicate a sparse gradient), or None: the planners' strategies keep them so without
    being asked, and a user reading a plan should know why."""
    whole = [(lowerer.index.group_names[g], var) for g, (_, var) in sorted(lowerer.whole_groups.items())]
    if not whole:
        return None
    names = ", ".join(repr(name) for name, _ in whole)
    tables = ", ".join(sorted({repr(var) for _, var in whole}))
    return (f"note: group(s) {names} run whole on one device in every strategy here: they make values whose shape "
            f"depends on the ids the samples hold, feeding the update of {tables} (a sparse gradient that Momentum or "
            "Adam deduplicates), which replicas cannot sum; plain SGD for that table, or a dense gradient, lets them "
            "split")


def print_overheads_notes(cluster, cluster_path: str, overheads, overheads_path: Optional[str],
                          give: str = "--overheads {}", fix: Optional[str] = None,
                          machine_fix: Optional[str] = None) -> None:
    """Prints to stderr overheads_note (with `fix` first) and overheads_machine_note (`machine_fix`
    replacing its default fix), those that apply."""
    for note in (overheads_note(cluster, cluster_path, overheads_path, give, fix),
                 overheads_machine_note(cluster, cluster_path, overheads, overheads_path, give, fix=machine_fix)):
        if note:
            print(note, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- output paths

def output_problem(path: str, folder: bool = False) -> Optional[Tuple[str, str]]:
    """(problem, fix) that stops writing the file (or folder) `path`, or None when it can be
    written. A file: its parent folder exists and is writable, and it is not a folder. A folder
    (made with its missing parents, like `mkdir -p`, e.g. runs/<config> on a fresh checkout): it
    and its existing ancestors are folders, the nearest existing one writable."""
    full = os.path.abspath(os.fspath(path))
    if not folder and os.path.isdir(full):
        return f"{path} is an existing folder, not a file", f"give a file name, e.g. {os.path.join(path, 'out.json')}"
    if not folder and os.path.exists(full) and not os.path.isfile(full):  # writing would block or hit a device
        return f"{path} is {file_kind(os.stat(full).st_mode)}, not a regular file", "give the path of a regular file"
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


def check_outputs_in(folder: str, names: Sequence[str], source: str, field: str = "") -> None:
    """`check_output_dir(folder)`, then, when the folder exists, `check_output_file` on each
    of `names` inside it (a file a run writes at its end must not turn out to be a folder then)."""
    check_output_dir(folder, source, field)
    if os.path.isdir(folder):
        for name in names:
            check_output_file(os.path.join(folder, name), source, f"{field}/{name}" if field else name)


class OutputLock:
    """Holds `<folder>/.tfplace.lock` (an flock) while a run writes into `folder`, so two runs
    given the same folder do not overwrite each other's results: the second stops at once with an
    InputError naming `source`, `field` and the pid of the run holding it. The kernel releases the
    lock when the process ends, however it ends; the empty lock file stays."""

    def __init__(self, folder: str, source: str, field: str = ""):
        self.path = os.path.join(folder, ".tfplace.lock")
        self.source, self.field = source, field
        self._fd: Optional[int] = None

    def __enter__(self) -> "OutputLock":
        import fcntl
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise InputError(self.source, self.field,
                             f"{os.path.dirname(self.path)} is in use by another run (pid {holder})",
                             "wait for that run to end, or give this run another output folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None


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


def flag_check(name: str, check: Callable[[object], None]) -> None:
    """Validates flag `name` at parse time with `check(value)` (not called for None, nor for the
    items of an empty list), which raises InputError: its problem and fix become the one line of
    the usage error, e.g. `error: flag --model=tiny_mpl: unknown model ... Fix: ...`."""
    def validate(value) -> bool:
        if value is None:
            return True
        try:
            check(value)
        except InputError as err:
            raise flags.ValidationError(f"{err.problem}. Fix: {err.fix}") from None
        return True
    flags.register_validator(name, validate)


def check_input_file(path: str, source: Optional[str] = None, field: str = "") -> None:
    """Raises InputError (naming `source`, default the path, and `field`) unless `path` is a
    regular file this process may read (tfplace.formats.files; the path is never opened)."""
    require_regular_file(path, source, field)


def _each_path(value, check: Callable[[str], None]) -> None:
    """check(path) on the path `value`, or on each path of the list `value`; the problem of a list's
    path names that path (the flag's value in the message is the whole list)."""
    for path in [value] if isinstance(value, str) else value:
        try:
            check(path)
        except InputError as err:
            if isinstance(value, str) or path in err.problem:
                raise
            raise InputError(err.source, err.field, f"{path}: {err.problem}", err.fix) from None


def input_file_flag(name: str) -> None:
    """Validates flag `name` (a path, or a list of paths) at parse time as a regular file this
    command reads: not missing, not a folder, FIFO or device (tfplace.formats.files; never opened)."""
    flag_check(name, lambda v: _each_path(v, check_input_file))


def check_zoo_model(name: str, source: str = "argument --model") -> None:
    """Raises InputError (naming `source`, the known names and the closest one) unless `name`
    is a zoo model (tfplace.graph_defs; its registry imports no TensorFlow)."""
    from tfplace.graph_defs.models import MODELS, unknown_model
    if name not in MODELS:
        raise InputError(source, "", unknown_model(name), "give one of the zoo model names")


def zoo_model_flag(name: str) -> None:
    """Validates flag `name` at parse time as a zoo model name."""
    flag_check(name, lambda v: check_zoo_model(v, f"argument --{name}"))


def check_zoo_options(model: str, option_flags: Mapping[str, str], batch_size: Optional[int] = None,
                      **options) -> None:
    """Raises InputError naming the flag of the option at fault unless the zoo model `model` takes
    `batch_size` and `options` (tfplace.graph_defs.export.resolve_options' keywords; it imports no
    TensorFlow). `option_flags`: resolve_options' option name -> this command's flag, e.g.
    {"image_size": "--image_size"}; an option it does not map is named as --model."""
    from tfplace.graph_defs.export import option_field, resolve_options
    try:
        resolve_options(model, batch_size, **options)
    except ValueError as err:
        given = [k for k, v in options.items() if v is not None] + (["batch_size"] if batch_size else [])
        flag = option_flags.get(option_field(str(err), given), "--model")
        fix = getattr(err, "fix", "give options this model takes")  # export.OptionError's
        raise InputError(f"argument {flag}", "", str(err), fix) from None


def _bare_name(spec: str) -> bool:
    """True for a spec that reads as a name, not a path: no folder part and no extension."""
    return os.sep not in spec and "/" not in spec and "." not in spec


def check_graph_arg(spec: str, flag: str, zoo: bool = True) -> None:
    """Raises InputError naming `flag` unless `spec` is a readable regular file (a bundle .json
    or a GraphDef) or, with `zoo`, a zoo model name (a bare name: no folder, no extension)."""
    if os.path.lexists(spec) or not _bare_name(spec):
        from tfplace.formats.files import saved_model_problem
        problem = saved_model_problem(spec)
        if problem:
            raise InputError(flag, "", f"{spec} {problem[0]}", problem[1])
        check_input_file(spec)
        return
    from tfplace.graph_defs.models import MODELS, unknown_model
    if not zoo:
        if spec in MODELS:
            raise InputError(flag, "", f"{spec!r} is a zoo model name, not a file", f"give --model {spec}")
        raise InputError(flag, "", f"{spec!r}: file not found", "give the path of a bundle .json or a .pb/.pbtxt/.meta step")
    if spec not in MODELS:
        raise InputError(flag, "", f"{spec!r} is neither a file nor a zoo model: {unknown_model(spec)}",
                         "give a bundle .json, a .pb/.pbtxt/.meta training step or a zoo model name")


def graph_flag(name: str, zoo: bool = True) -> None:
    """Validates flag `name` (a path or a list of them) at parse time with `check_graph_arg`."""
    flag_check(name, lambda v: _each_path(v, lambda p: check_graph_arg(p, f"argument --{name}", zoo)))


STEP_FLAGS = ("train_op", "loss", "loss_reduction", "inputs")


def define_step_flags(skip: Sequence[str] = ()) -> None:
    """`--train_op`, `--loss`, `--loss_reduction`, `--inputs`: the roles of a bare training step
    (a .pb/.pbtxt GraphDef or .meta MetaGraphDef given as --graph) when inference cannot tell
    them (tfplace.ir.step_roles says which one to give). `skip`: names the command defines itself."""
    defs = {"train_op": lambda: flags.DEFINE_list("train_op", None, "train op name(s) of a bare GraphDef "
                                                   "(default: inferred: the op that runs the variable updates)"),
            "loss": lambda: flags.DEFINE_string("loss", None, "loss op name of a bare GraphDef (default: inferred "
                                                "from the gradient seed)"),
            "loss_reduction": lambda: flags.DEFINE_enum("loss_reduction", None, ["mean", "sum"],
                                                        "how the loss reduces over the batch (default: detected)"),
            "inputs": lambda: flags.DEFINE_list("inputs", None, "batched input placeholders of a bare GraphDef, "
                                                "NAME[:BATCH_AXIS],... (default: every placeholder of rank >= 1)")}
    for name in STEP_FLAGS:
        if name not in skip:
            defs[name]()


def step_options(values) -> dict:
    """The step-role flags of parsed `values` (common.args()) as keyword options of resolve_graph."""
    get = lambda name: getattr(values, name, None)
    return {"train_ops": get("train_op"), "loss": get("loss"), "loss_reduction": get("loss_reduction"),
            "inputs": get("inputs")}


def resolve_graph(spec: str, flag: str, batch_size: Optional[int] = None, bundle: bool = False, **step) -> str:
    """The graph file of a --graph value: the path itself (a bundle .json, or a bare training step
    .pb/.pbtxt/.meta, which tfplace.ir.loader reads with its roles inferred), or the bundle of a zoo
    model name, exported on demand at `batch_size` (default: the model's) into the zoo cache
    (tfplace.graph_defs.export.ensure_bundle). With `bundle`, a bare step becomes a cached bundle
    at `batch_size` with the roles `step` names (train_ops, loss, loss_reduction, inputs;
    tfplace.graph_defs.user_step.import_step), for commands that need an init op and input specs
    (profile, plan, the runtime). Raises InputError naming `flag` (or the file) for anything else."""
    check_graph_arg(spec, flag)
    if os.path.lexists(spec) or not _bare_name(spec):
        from tfplace.graph_defs.user_step import import_step, is_step_file
        if bundle and is_step_file(spec):
            return import_step(spec, batch_size=batch_size, **{k: v for k, v in step.items() if v is not None})
        return spec
    from tfplace.graph_defs.export import ensure_bundle
    try:
        return ensure_bundle(spec, batch_size=batch_size) if batch_size else ensure_bundle(spec)
    except ValueError as err:  # an option the model does not take, e.g. its batch size
        raise InputError(flag, "", f"zoo model {spec!r}: {err}", "give options the model takes") from None


def load_graph_arg(spec: str, flag: str, values, batch_size: Optional[int] = None):
    """The OpGraph of a --graph value (resolve_graph) at `batch_size`, with the step-role flags of
    parsed `values` (define_step_flags; a bundle's own roles give way to the flags given)."""
    from tfplace.ir.loader import load_op_graph
    step = step_options(values)
    return load_op_graph(resolve_graph(spec, flag, batch_size), sinks=step["train_ops"], loss=step["loss"],
                         loss_reduction=step["loss_reduction"], inputs=step["inputs"], batch_size=batch_size)


def device_kinds_flag(name: str) -> None:
    """Validates flag `name` (comma-separated kinds, or a list of them) at parse time: every kind
    known to the device model (tfplace.profiling.device_model.DEVICES; aliases allowed)."""
    def check(value) -> None:
        from tfplace.profiling.device_model import device_spec
        for kind in value.split(",") if isinstance(value, str) else value:
            if kind.strip():
                device_spec(kind.strip(), f"argument --{name}")
    flag_check(name, check)


def names_flag(name: str, known: Callable[[], Sequence[str]], what: str) -> None:
    """Validates flag `name` (comma-separated names, or a list) at parse time: at least one name,
    each one of known(), with the closest known name in the message."""
    def check(value) -> None:
        items = [x.strip() for x in (value.split(",") if isinstance(value, str) else value) if x.strip()]
        choices = list(known())
        if not items:
            raise InputError(f"argument --{name}", "", "names nothing", f"give {what} names, e.g. {choices[0]}")
        for item in items:
            if item not in choices:
                close = difflib.get_close_matches(item, choices, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise InputError(f"argument --{name}", "", f"unknown {what} {item!r}{hint}",
                                 f"use one of {choices}")
    flag_check(name, check)


def int_list_flag(name: str, minimum: int, below: Optional[int] = None) -> None:
    """Validates the list flag `name` at parse time: every item an integer >= minimum (and < below)."""
    def check(items: Optional[List[str]]) -> bool:
        for item in items or ():
            try:
                value = int(item)
            except ValueError:
                raise flags.ValidationError(f"{item!r} is not an integer. Fix: write e.g. 8,16,32") from None
            if value < minimum:
                raise flags.ValidationError(f"{value} is not >= {minimum}. Fix: give integers >= {minimum}")
            if below is not None and value >= below:
                raise flags.ValidationError(f"{value} is not below {below}. Fix: give integers below {below}")
        return True
    flags.register_validator(name, check)


def cpu_fraction_flag(name: str) -> None:
    """Validates the float flag `name` at parse time as a CPU quota, a share of one core in (0, 1]
    as the cluster format takes it (tfplace.formats.cluster.cpu_fraction_problem); 0 is the
    flag's "no quota"."""
    def check(value: float) -> None:
        from tfplace.formats.cluster import cpu_fraction_problem
        problem = cpu_fraction_problem(value) if value != 0 else None
        if problem:
            raise InputError(f"argument --{name}", "", *problem)
    flag_check(name, check)


def batch_size_flag(name: str, default: Optional[int], help_text: str, minimum: int = 1) -> None:
    """An integer flag of a batch size: at least `minimum` and below SIZE_LIMIT (TensorFlow's
    shapes are int32), checked at parse time."""
    from tfplace.formats.config import SIZE_LIMIT
    flags.DEFINE_integer(name, default, help_text, lower_bound=minimum, upper_bound=SIZE_LIMIT - 1)


# ------------------------------------------------------------------------------- parsing

def args() -> types.SimpleNamespace:
    """The parsed flags as attributes, hyphens as underscores (`--max-groups` -> `.max_groups`)."""
    return types.SimpleNamespace(**{k.replace("-", "_"): v for k, v in FLAGS.flag_values_dict().items()})


def _define(define_flags: Callable[[], None]) -> List[str]:
    """Calls define_flags; returns the names of the flags it defined, in order."""
    before = set(FLAGS)
    define_flags()
    return [name for name in FLAGS if name not in before]


def _library_flag(name: str) -> bool:
    """Whether flag `name` belongs to an installed library (TensorFlow, absl's test flags), defined
    when define_flags imported it: not the command's, so its help leaves it out."""
    module = sys.modules.get(FLAGS.find_module_defining_flag(name) or "")
    return "site-packages" in (getattr(module, "__file__", None) or "")


def _help(doc: str, names: Sequence[str], positional: Sequence[str]) -> str:
    lines = [(doc or "").strip(), ""]
    if positional:
        lines.append("arguments: " + " ".join(positional))
    names = [name for name in names if not _library_flag(name)]
    lines.append("flags:" if names else "flags: none")
    for name in names:
        flag = FLAGS[name]
        # a boolean whose name is already a negation (no-plot) is shown as it is typed, not as --[no]no-plot
        shown = f"--[no]{name}" if flag.boolean and not name.startswith("no") else f"--{name}"
        default = "" if flag.default is None else f" (default: {flag.default_as_str})"
        lines.append(f"  {shown}: {flag.help}{default}")
    return "\n".join(lines)


# absl's own usage messages (bounds, enums, unknown or missing flags) -> the fix they imply
_ABSL_FIXES = (("is not a positive integer", "give an integer >= 1"),
               ("is not an integer in the range", "give an integer in that range"),
               ("is not a non-negative integer", "give an integer >= 0"),
               ("is not a positive number", "give a number > 0"),
               ("is not a non-negative number", "give a number >= 0"),
               ("value should be one of", "give one of the listed values"),
               ("Unknown command line flag", "remove it or use a flag that --help lists"),
               ("must have a value other than None", "give the flag"),
               ("expected ", "give the arguments the usage line shows"))


# absl's line for each required flag left out: "flag --graph=None: Flag --graph must have a value other than None."
_MISSING_FLAG = re.compile(r"flag --(\S+)=None: Flag --\S+ must have a value other than None\.?")


# absl's line for flags of which one (or at most one) may be given:
# "flags graph=None, model=None: Exactly one of (graph, model) must have a value other than None."
_ONE_OF = re.compile(r"flags (.*?): (?:Exactly|At most) one of \(([^)]*)\) must have a value other than None\.?")


# absl joins the messages of every flag a validator refused with newlines, each starting "flag --x=..:"
# or "flags x=.., y=..:"; the first says what to fix first
_NEXT_FLAG_MESSAGE = re.compile(r"\n(?=flags? )")


def _usage_error(message: str) -> None:
    """Prints absl's usage `message` as one line `error: ... Fix: ...` and exits USAGE_EXIT: every
    required flag left out together, else the first flag a validator refused."""
    text = " ".join(str(message).split())
    problems, fixes = [], []
    missing = _MISSING_FLAG.findall(text)
    if missing:
        problems.append(", ".join(f"--{name}" for name in missing) + (" is" if len(missing) == 1 else " are")
                        + " required")
        fixes.append("give " + ("it" if len(missing) == 1 else "them"))
    for flags_given, group in _ONE_OF.findall(text):
        names = [name.strip() for name in group.split(",")]
        given = [name for name in names if not re.search(rf"(^|, ){re.escape(name)}=None(,|$)", flags_given)]
        if given:
            problems.append(" and ".join(f"--{name}" for name in given) + " were given together")
            fixes.append("keep one of them")
        else:
            problems.append("one of " + " or ".join(f"--{name}" for name in names) + " is required")
            fixes.append("give one")
    if problems:
        text = "; ".join(problems) + ". Fix: " + "; ".join(fixes)
    else:
        text = " ".join(_NEXT_FLAG_MESSAGE.split(str(message))[0].split())
    if "Fix:" not in text:  # every error line says how to fix it
        fix = next((f for phrase, f in _ABSL_FIXES if phrase in text), "give a value that --help describes")
        text = f"{text.rstrip('.')}. Fix: {fix}"
    print("error: " + text + " (see --help)", file=sys.stderr)
    sys.exit(USAGE_EXIT)


def either_spelling(argv: Sequence[str], names: Sequence[str]) -> List[str]:
    """argv with every flag of `names` written with "_" where the command spells it "-", or the
    other way round, rewritten to the command's spelling (--batch_size and --batch-size both
    reach a flag named either way; --no... of a boolean too). Only options before "--" change,
    and only names that are not flags as written."""
    known = set(names)
    booleans = {n for n in names if FLAGS[n].boolean}
    out = [argv[0]] if argv else []
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--":
            return out + list(argv[i:])
        dashes = len(arg) - len(arg.lstrip("-"))
        name, eq, value = arg[dashes:].partition("=")
        if 1 <= dashes <= 2 and name and name not in FLAGS:
            for other in (name.replace("_", "-"), name.replace("-", "_")):
                bare = other[2:] if other.startswith("no") and not eq else None
                if other in known or bare in booleans:
                    arg = "-" * dashes + other + eq + value
                    break
        out.append(arg)
    return out


def _parse(argv: Sequence[str], names: Sequence[str], doc: str, positional: Sequence[str]) -> List[str]:
    """Parses argv into FLAGS under the contract above (either_spelling of each flag);
    returns [program, positional...]."""
    argv = either_spelling(argv, names)
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


def not_a_command(module: str, fix: str) -> None:
    """`python -m` on a module of tfplace/cli that is a library of the commands, not one of them:
    one line `error: <module> is not a command. Fix: <fix>` and exit status 2 (not silence and 0)."""
    print(f"error: {module} is not a command. Fix: {fix}", file=sys.stderr)
    sys.exit(USAGE_EXIT)


def guarded(main: Callable[[List[str]], Optional[int]]) -> Callable[[List[str]], int]:
    """main, with bad input (InputError) reported as one line `error: ...` and exit status 2, and
    a run that tfplace stopped on purpose (any other TfplaceError: a dead worker, a failed Horovod
    rank, no private network) or that the machine stopped (an OSError the writers do not turn into
    an InputError) as `error: ...` and exit status 1. An output file the file system refuses (a
    full disk, a folder that takes no files) is an InputError naming it, exit status 2
    (tfplace.formats.jsonio.atomic_write, which the writers use)."""
    @functools.wraps(main)
    def wrapped(argv: List[str]) -> int:
        try:
            return main(argv) or 0
        except InputError as err:
            print(f"error: {err}", file=sys.stderr)
            return USAGE_EXIT
        except TfplaceError as err:
            print(f"error: {err}", file=sys.stderr)
            return FAILED_EXIT
        except OSError as err:  # the machine refused, not the input (a writer's refusal is an InputError)
            print(f"error: {err}", file=sys.stderr)
            return FAILED_EXIT
        except KeyboardInterrupt as err:
            terminated = isinstance(err, Terminated)
            print(f"error: stopped by {'SIGTERM' if terminated else 'Ctrl-C (SIGINT)'}; what was written so far is kept",
                  file=sys.stderr)
            return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    return wrapped


def run(main: Callable[[List[str]], Optional[int]], define_flags: Callable[[], None], doc: str,
        positional: Sequence[str] = (), servers: Union[bool, Callable[[], bool]] = False,
        private_tmp: bool = False) -> None:
    """`app.run(main)` for a command line: defines its flags, parses them under the contract,
    runs main and exits with its status. `positional` names the required positional arguments.
    `servers`: the command starts local servers, so it enters a private network namespace first,
    while the process is still single-threaded (tfplace.runtime.netns); a callable decides once
    the flags are parsed (still single-threaded), for a command that starts servers only with
    some flags. `private_tmp`: a long-running command keeps Python's and TensorFlow's temporary
    files (autograph's) in a folder of its own, removed at its end or, after a SIGKILL, by the next
    such command (tfplace.runtime.tmpdir)."""
    if private_tmp:
        from tfplace.runtime.tmpdir import private_tmpdir
        with private_tmpdir():
            run(main, define_flags, doc, positional, servers)
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up lines say nothing to the user

    def parser(argv: List[str]) -> List[str]:
        rest = _parse(argv, _define(define_flags), doc, positional)
        if callable(servers) and servers():
            _enter_private_network()
        return rest
    stop_on_sigterm()  # servers, ranks and temporary folders are cleaned up as on Ctrl-C
    if servers is True:
        _enter_private_network()
    app.run(guarded(main), flags_parser=parser)


def _enter_private_network() -> None:
    """tfplace.runtime.netns.enter_private_network, unless TFPLACE_ALLOW_OPEN_PORTS=1; where it
    cannot be entered, --help and bad input still answer and the first server start says why."""
    from tfplace.runtime import netns
    if os.environ.get(netns.ALLOW_OPEN_PORTS_ENV) != "1":
        try:
            netns.enter_private_network()
        except netns.NetworkIsolationError:
            pass  # the first server start says why (exit 1)


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


if __name__ == "__main__":
    not_a_command("tfplace.cli.common", "run a command, e.g. python -m tfplace.plan --help")
