"""Measures what the TF runtime of a local CPU cluster adds beyond kernels and links, and writes
it as a runtime-overheads file (format tfplace.runtime_overheads, tfplace.overheads.model).

    python -m tfplace.cli.overheads --cluster clusters/local_cpu.json --out overheads.json
    python -m tfplace.cli.overheads --cluster clusters/local_cpu_hetero.json --out hetero.json \\
        --cpus-per-task "0;1;1" --cpu-fraction-per-task ",0.5,0.5" --client-cpus 1

Starts one TF server task per device of the cluster file on 127.0.0.1 (device i on task i), with
the emulation settings below, and times micro-benchmarks on them: the step's dispatch and feed,
per-op dispatch, messages and their CPU per pair of device kinds, all-reduces per group size and,
with --raw, the collective CPU curve over bytes and the per-byte figures
(tfplace.profiling.overheads_probe). Each of --passes passes runs on fresh server processes and
measures its own comm fit first (unless --comm gives one); the file holds each figure's median
over the passes, and the machine's quiet speed (machine_probe_s, tfplace.runtime.machine_speed),
so that a run on a faster or slower machine can say the figures are not its own. One pass took
about 35 s on a 2-core machine (3 tasks; --noraw: 10 s). The
simulator reads the file with `--overheads FILE` (simulate, compare, plan) or a config's
"overheads" key.

Emulation settings (they must match the runs the overheads will describe, and the profile's):
  --threads / --inter-threads   intra-op / inter-op threads of every server task (a server runs
                                its message handlers on its inter-op pool; the file records the
                                count as inter_op_threads)
  --cpus-per-task "0;1;1"       CPU ids each task is pinned to, tasks separated by ";", CPUs by
                                ","; an empty entry leaves that task unpinned
  --cpu-fraction-per-task ",0.5,0.5"  share of one CPU each task may use (a cgroup CPU quota,
                                tfplace.emulation.cpu_quota; needs writable cgroups, i.e. root);
                                an empty entry leaves that task unlimited
  --client-cpus 1               pins this process (the client that drives the steps)
Without the two per-task flags, each task is pinned and limited as its device's `emulation` in the
cluster file says (none: unpinned, unlimited); a flag given replaces the file's value for every
task. The emulated heterogeneous cluster clusters/local_cpu_hetero.json runs with the second
example's settings: task 0 alone on core 0, tasks 1 and 2 on core 1 at half of it each, the client
on core 1.

collective_s is measured against the comm fit in use (the fit the simulator charges for one
all-reduce): give the simulator a profile with that fit (raw.comm in the file; --comm PROFILE
makes it that profile's). Progress goes to stderr, a summary to stdout. Bad arguments and bad
input exit with status 2 and one line naming the argument (or the file and field) and the fix
(tfplace.cli.common); --out and the cluster file are checked before any server starts.
"""

from __future__ import annotations

import os
import sys
import time
import types
from typing import List, Optional

from absl import flags

from tfplace.cli import common
from tfplace.formats.errors import InputError


def _cpu_sets(text: str) -> List[Optional[List[int]]]:
    """'0;1;1' -> [[0], [1], [1]]; an empty entry (or '') is None (unpinned). Raises ValueError."""
    out: List[Optional[List[int]]] = []
    for entry in text.split(";"):
        cpus = [int(c) for c in entry.split(",") if c.strip()]
        if any(c < 0 for c in cpus):
            raise ValueError(f"CPU ids must be >= 0, got {entry!r}")
        out.append(cpus or None)
    return out


def _fractions(text: str) -> List[Optional[float]]:
    """',0.5,0.5' -> [None, 0.5, 0.5]; an empty entry is None (unlimited). Raises ValueError."""
    from tfplace.formats.cluster import cpu_fraction_problem
    out: List[Optional[float]] = []
    for entry in text.split(","):
        value = float(entry) if entry.strip() else None
        problem = None if value is None else cpu_fraction_problem(value)
        if problem:  # the range of the cluster file's emulation.cpu_fraction, which this flag replaces
            raise ValueError(f"{entry.strip()!r} is not a share of one CPU: {problem[0]}")
        out.append(value)
    return out


def _parses(parse, example: str):
    def check(text: Optional[str]) -> bool:
        if text:
            try:
                parse(text)
            except ValueError as err:
                raise flags.ValidationError(f"{err}. Fix: write e.g. {example}") from None
        return True
    return check


THREADS, INTER_THREADS = 1, 1  # the flags' defaults: the settings the bundled overheads files were measured with


def default_settings(cluster_path: str, passes: int) -> types.SimpleNamespace:
    """The flags of `python -m tfplace.cli.overheads --cluster cluster_path --passes passes` with
    every other flag at its default (the cluster file's emulation, the client unpinned), for code
    that measures without the command line (activate's "overheads": "measure")."""
    return types.SimpleNamespace(cluster=cluster_path, passes=passes, threads=THREADS, inter_threads=INTER_THREADS,
                                 cpus_per_task="", cpu_fraction_per_task="", client_cpus=[], comm=None, raw=True)


def define_flags() -> None:
    """The command's flags (called when it runs; see tfplace.cli.common)."""
    from tfplace.profiling import overheads_probe as probe  # numpy only: the defaults the probe measures with
    flags.DEFINE_string("cluster", None, "cluster file whose hosts are all this machine (127.0.0.1 or "
                        "localhost); one server task per device", required=True)
    flags.DEFINE_string("out", None, "runtime-overheads file to write", required=True)
    flags.DEFINE_integer("passes", 3, "measurement passes, each on fresh server processes; the file holds "
                         "each figure's median over them", lower_bound=1)
    flags.DEFINE_integer("threads", THREADS, "intra-op threads per server task (0 = TensorFlow's default)",
                         lower_bound=0)
    flags.DEFINE_integer("inter-threads", INTER_THREADS, "inter-op threads per server task, which also run its "
                         "message handlers (0 = TensorFlow's default, one per core)", lower_bound=0)
    flags.DEFINE_string("cpus-per-task", "", "CPU ids per task, tasks separated by ';', CPUs by ',' "
                        "(\"0;1;1\"); an empty entry or flag: unpinned")
    flags.DEFINE_string("cpu-fraction-per-task", "", "share of one CPU per task, comma-separated "
                        "(\",0.5,0.5\"; a cgroup quota, needs root); an empty entry or flag: unlimited")
    flags.DEFINE_list("client-cpus", [], "pin this process, the client driving the steps, to these CPU ids")
    flags.DEFINE_string("comm", None, "a profile file whose comm fit (p2p and all-reduce per group size) the "
                        "overheads are measured against, instead of measuring one in each pass")
    flags.DEFINE_boolean("raw", True, "also measure the collective CPU curve and the per-byte figures (first "
                         "pass; the CPU bound of the step needs them); --noraw: quicker, without them")
    flags.DEFINE_integer("reps", probe.REPS, "timed steps per micro-benchmark (wall: their median)", lower_bound=1)
    flags.DEFINE_integer("cpu-reps", probe.CPU_REPS, "steps per micro-benchmark whose CPU is counted", lower_bound=1)
    flags.DEFINE_integer("fan", probe.FAN, "tensors per burst and hops / all-reduces per chain", lower_bound=1)
    common.output_file_flag("out")
    common.input_file_flag("cluster")
    common.input_file_flag("comm")
    common.int_list_flag("client-cpus", minimum=0)
    flags.register_validator("cpus-per-task", _parses(_cpu_sets, '"0;1;1"'))
    flags.register_validator("cpu-fraction-per-task", _parses(_fractions, '",0.5,0.5"'))


def check_local_cluster(cluster, source: str) -> None:
    """Raises InputError (naming the field) unless every host is loopback, every device a CPU kind
    on a task of its own (device i on task i), and there are at least two devices."""
    from tfplace.formats.cluster import is_cpu_kind
    from tfplace.runtime.local_cluster import require_loopback
    fix = "measure on a cluster of this machine's CPU tasks, e.g. clusters/local_cpu.json"
    require_loopback(cluster, source)
    if cluster.num_devices < 2:
        raise InputError(source, "devices", f"has {cluster.num_devices} device; messages and all-reduces need 2",
                         fix)
    for i, device in enumerate(cluster.devices):
        if not is_cpu_kind(device.kind):
            raise InputError(source, f"devices[{i}].kind", f"is {device.kind!r}, not a CPU kind: GPU clusters "
                             "need no runtime overheads", fix)
        if device.task != i:
            raise InputError(source, f"devices[{i}].task", f"is {device.task}; the command runs device i on "
                             f"task i (one task per device)", "give device i task i")


def _per_task(text: str, parse, n: int, flag: str) -> Optional[list]:
    """parse(text), one entry per task, or None when the flag is empty; InputError on a wrong count."""
    if not text:
        return None
    values = parse(text)
    if len(values) != n:
        raise InputError("arguments", f"--{flag}", f"has {len(values)} entries, the cluster {n} tasks",
                         "give one entry per device of the cluster file (empty entries allowed)")
    return values


def cluster_settings(args, cluster, source: str) -> dict:
    """LocalCluster keyword arguments for the cluster's tasks: the flags' threads, and the pinning
    and quotas of the per-task flags or else of the cluster file's emulation (device i is task i,
    check_local_cluster). Raises InputError, before any server starts, for a core this machine
    lacks or a quota it cannot set (tfplace.emulation.tasks.check_applicable), naming the flags or
    the cluster file's field. Emulated hosts (tfplace.emulation.links) go with the tasks as
    `host_links`, checked here too."""
    from tfplace.emulation.tasks import check_applicable
    from tfplace.formats.cluster import Emulation
    n = cluster.num_devices
    kwargs = dict(num_tasks=n, threads_per_task=[args.threads] * n, inter_threads_per_task=[args.inter_threads] * n)
    from_file = cluster.task_emulations
    flag_cpus = _per_task(args.cpus_per_task, _cpu_sets, n, "cpus-per-task")
    flag_fractions = _per_task(args.cpu_fraction_per_task, _fractions, n, "cpu-fraction-per-task")
    cpus = flag_cpus or [list(e.cpus) if e is not None and e.cpus else None for e in from_file]
    fractions = flag_fractions or [e.cpu_fraction if e is not None else None for e in from_file]
    where = (("arguments --cpus-per-task / --cpu-fraction-per-task", "tasks") if flag_cpus or flag_fractions
             else (source, "devices"))
    check_applicable([None if c is None and f is None else Emulation(None if c is None else tuple(c), f)
                      for c, f in zip(cpus, fractions)], *where)
    if any(c is not None for c in cpus):
        kwargs["cpus_per_task"] = cpus
    if any(f is not None for f in fractions):
        kwargs["cpu_fraction_per_task"] = fractions
    from tfplace.emulation import links
    layout = links.checked_layout(cluster, per="task")  # device i is task i (check_local_cluster)
    if layout is not None:
        kwargs["host_links"] = layout
    return kwargs


def comm_of_profile(path: str, num_tasks: int) -> dict:
    """The comm section of the profile file `path` ({"p2p": ..., "allreduce": {"2": ...}}),
    checked to have a point-to-point fit and an all-reduce fit for every group size up to num_tasks."""
    from tfplace.formats.profile import load_profile
    comm = load_profile(path).to_json().get("comm") or {}
    fix = "measure one with `python -m tfplace.profile --comm-only --out PROFILE`, or leave --comm out"
    if "p2p" not in comm:
        raise InputError(path, "comm.p2p", "is missing: the overheads need the point-to-point fit", fix)
    missing = [g for g in range(2, num_tasks + 1) if str(g) not in comm.get("allreduce", {})]
    if missing:
        raise InputError(path, "comm.allreduce", f"has no fit for group size {missing[0]} (the cluster has "
                         f"{num_tasks} tasks)", fix)
    return {"p2p": comm["p2p"], "allreduce": comm["allreduce"]}


def comm_from(args) -> str:
    """Where the comm fit came from, for `how`."""
    from tfplace.profiling import overheads_probe as probe
    return (f"the profile {args.comm}" if args.comm else
            f"measured on the same servers before each pass (comm_profiler up to "
            f"{probe.COMM_MAX_BYTES >> 20} MiB), median over the passes: raw.comm")


def how(args, kwargs: dict) -> str:
    """What was measured, for the file's `how` (the probe's own account follows it)."""
    n = kwargs["num_tasks"]
    where = "their emulated hosts" if "host_links" in kwargs else "127.0.0.1"
    parts = [f"python -m tfplace.cli.overheads on {os.path.basename(args.cluster)}: {n} server tasks on "
             f"{where}, {args.threads} intra-op + {args.inter_threads} inter-op thread(s) each"]
    if "cpus_per_task" in kwargs:
        parts.append(f"pinned to CPUs {kwargs['cpus_per_task']}")
    if "cpu_fraction_per_task" in kwargs:
        parts.append(f"CPU quotas {kwargs['cpu_fraction_per_task']}")
    if "host_links" in kwargs:
        layout = kwargs["host_links"]
        parts.append("each task on its emulated host (" + ", ".join(
            f"{name}: {link.to_json()}" for name, link in zip(layout.hosts, layout.links)) + ")")
    if args.client_cpus:
        parts.append(f"the client on CPUs {[int(c) for c in args.client_cpus]}")
    parts.append(f"comm fit: {comm_from(args)}")
    parts.append(f"{args.passes} pass(es), each on fresh servers{'' if args.raw else ', without raw figures'}")
    return "; ".join(parts)


def _us(x: float) -> str:
    return f"{x * 1e6:.0f} us"


def summary_lines(overheads) -> List[str]:
    """A few lines on the main figures of a RuntimeOverheads."""
    def table(value):
        if not hasattr(value, "items"):
            return _us(value)
        return ", ".join(f"{k} {_us(v)}" for k, v in sorted(value.items()))
    lines = [f"dispatch: step {_us(overheads.step_s)}, per further task {_us(overheads.worker_s)}, "
             f"per op {_us(overheads.op_s)}; inter-op threads {overheads.inter_op_threads}",
             f"per message: transfer beyond the link {table(overheads.transfer_s)}; "
             f"CPU {table(overheads.message_cpu_s)}"]
    if overheads.collective_s is not None:
        lines.append(f"per all-reduce beyond the comm fit (by group size): {table(overheads.collective_s)}")
    if overheads.machine_probe_s:
        lines.append(f"machine: quiet speed probe {overheads.machine_probe_s * 1e3:.2f} ms "
                     "(tfplace.runtime.machine_speed)")
    for size, curve in sorted(overheads.collective_cpu_s.items()):
        lines.append(f"all-reduce CPU per participant, {size} tasks: {_us(curve['seconds'][0])} at "
                     f"{curve['bytes'][0]} B .. {_us(curve['seconds'][-1])} at {curve['bytes'][-1]} B")
    return lines


def main(argv) -> int:
    """Measures and writes the overheads of the parsed flags (absl main: argv holds the program name only)."""
    del argv
    args = common.args()
    from tfplace.formats.cluster import load_cluster
    cluster = load_cluster(args.cluster)
    check_local_cluster(cluster, args.cluster)
    kwargs = cluster_settings(args, cluster, args.cluster)
    comm = comm_of_profile(args.comm, cluster.num_devices) if args.comm else None
    from tfplace.overheads.model import save_overheads
    from tfplace.runtime import machine_speed
    started = time.monotonic()
    watch = machine_speed.SpeedWatch(machine_speed.cores_of(cluster))

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - started:5.0f} s] {line}", file=sys.stderr, flush=True)
    # Ctrl-C and SIGTERM: no file, common.guarded's line and 130 / 143
    overheads = measure(cluster, args.cluster, kwargs, how(args, kwargs), passes=args.passes,
                        comm=comm, reps=args.reps, fan=args.fan, cpu_reps=args.cpu_reps, raw=args.raw,
                        client_cpus=[int(c) for c in args.client_cpus], progress=progress, watch=watch)
    save_overheads(overheads, args.out)
    for line in summary_lines(overheads):
        print(line)
    print(f"wrote {args.out} ({time.monotonic() - started:.0f} s){machine_speed.slow_note(watch.slowdown_since(0))}")
    return 0



def measure(cluster, source: str, lc_kwargs: dict, how_text: str, progress=None, watch=None, **probe_kwargs):
    """The RuntimeOverheads of `cluster` (loaded from `source`) on server tasks started with
    `lc_kwargs` (LocalCluster arguments), measured by tfplace.profiling.overheads_probe with
    `probe_kwargs` (passes, comm, reps, ...). Stamped with the machine's quiet speed
    (machine_probe_s) on the cores a run on `cluster` probes (machine_speed.cores_of, as the
    commands that compare against the stamp do), probed before, at every progress line and for 2 s
    after, so that a slow phase of a shared core is not taken for the machine; the probes at
    progress lines are not kept in `watch.probes` (the servers may load the cores then). `watch`: the run's
    SpeedWatch of those cores, else a new one. `how_text` opens the file's `how`."""
    from tfplace.overheads.model import overheads_from_json
    from tfplace.profiling import overheads_probe as probe
    from tfplace.runtime import machine_speed
    if watch is None:
        watch = machine_speed.SpeedWatch(machine_speed.cores_of(cluster))
    watch.calibrate()

    def probing(line: str) -> None:
        # between micro-benchmarks: the servers may still be busy (an idle machine read 1.9-2.1x
        # slow here), so these probes only help find the quiet speed, never mark the machine slow
        watch.probe(keep=False)
        if progress is not None:
            progress(line)
    measured, _ = probe.measure_runtime_overheads(cluster, lc_kwargs, progress=probing, **probe_kwargs)
    watch.probe_spaced()
    measured["how"] = how_text + "; " + measured["how"]
    measured["machine_probe_s"] = machine_speed.machine_probe_s(watch.reference_s)
    return overheads_from_json(measured, f"overheads measured on {source}")


def run() -> None:
    """Entry point for `python -m`: `app.run(main)` under tfplace.cli.common's contract."""
    common.run(main, define_flags, __doc__, servers=True)


if __name__ == "__main__":
    run()
