"""`python -m tfplace.profile`: measure a graph's per-op costs, derive absent device kinds, and
measure communication on a local cluster.

    python -m tfplace.profile --graph graph_defs/zoo/resnet50_b64_s224_sgd.json --device CPU \\
        --batch-sizes 2,4,8 --repeats 3 --warmup 1 --derive V100,P100,GTX1080Ti --out profile.json
    python -m tfplace.profile --comm-only --out profile.json      # add/replace the comm fits
    python -m tfplace.profile --graph G.json --roofline V100,T4 --batch-sizes 8,16 --out p.json
    python -m tfplace.profile --graph tiny_mlp --cluster clusters/local_cpu_hetero.json --out p.json

With --cluster (a CPU-emulated cluster file whose hosts are all this machine's loopback, as
activate runs it; another host is refused), every device kind of the cluster is measured as
its devices run: pinned to the cores and under the CPU quota the kind's first device declares in
its `emulation` (one child `python -m tfplace.profile` per kind, merged into --out); what
activate runs on that cluster, simulated with that profile (activate's "profile": "measure").

Writes profile.json (format: tfplace.formats.profile). Progress goes to stderr, a summary to
stdout. Bad arguments and bad input exit with status 2 and one line naming the argument (or the
file and field) and the fix (tfplace.cli.common); --out, the numbers, device and kind names and
--graph (a regular file or a zoo model name, exported on demand) are checked before anything is
measured; with --merge, so is the profile already in --out (a profile of another graph is refused).
"""

from __future__ import annotations

import os
import sys
import time
from typing import List, Optional, Tuple

from absl import flags

from tfplace.cli import common
from tfplace.formats.config import SIZE_LIMIT
from tfplace.formats.errors import InputError
from tfplace.profiling.profiler import STATISTICS


def _kinds(text: str) -> List[str]:
    """The kinds of a comma-separated list, aliases as the device model names them (1080Ti ->
    GTX1080Ti): a profile's kinds must be the cluster files' kinds."""
    return [_kind(k) for k in text.split(",") if k.strip()]


def _kind(kind: Optional[str]) -> Optional[str]:
    """`kind` as the device model names it when it is one of its aliases, else as given."""
    from tfplace.profiling.device_model import ALIASES
    return ALIASES.get(kind.strip(), kind.strip()) if kind else kind


def define_flags() -> None:
    """The command's flags (called when it runs; see tfplace.cli.common)."""
    flags.DEFINE_string("graph", None, "bundle metadata JSON (<stem>.json beside <stem>.pb), a zoo model name, "
                        "or a training step .pb/.pbtxt/.meta (imported into a cached bundle)")
    common.define_step_flags()
    flags.DEFINE_string("cluster", None, "a CPU-emulated cluster file of this machine (loopback hosts): measure "
                        "each of its device kinds pinned and limited as its devices' emulation says (instead of "
                        "--kind/--cpus/--cpu-fraction)")
    flags.DEFINE_string("device", "CPU", "CPU, GPU or GPU:<k>")
    flags.DEFINE_string("kind", "", "device kind that keys the profile (empty: CPU for a CPU device)")
    flags.DEFINE_list("batch-sizes", ["8", "16", "32"], "per-device batch sizes, comma-separated")
    flags.DEFINE_integer("repeats", 5, "traced steps per batch size (and as many untraced)", lower_bound=1)
    flags.DEFINE_integer("warmup", 2, "untraced steps before them", lower_bound=0)
    flags.DEFINE_enum("statistic", "min", list(STATISTICS),
                      "per-op statistic over the repeats (min: noise only adds time)")
    flags.DEFINE_integer("threads", 0, "intra-op threads (0 = TensorFlow's default)", lower_bound=0)
    flags.DEFINE_integer("inter-threads", 1, "inter-op threads (1: ops run one at a time)", lower_bound=0)
    flags.DEFINE_list("cpus", [], "pin the measurement to these CPU ids, comma-separated "
                      "(as LocalCluster(cpus_per_task=...) pins a task)")
    flags.DEFINE_float("cpu-fraction", 0.0,
                       "profile a kind limited to this share of one CPU (as LocalCluster(cpu_fraction_per_task="
                       "...) limits a task; needs writable cgroups): the ops are timed without the quota and "
                       "scaled by the slowdown a compute loop measures under it; a share in (0, 1], 0 = unlimited",
                       lower_bound=0.0)
    flags.DEFINE_boolean("grappler", False, "keep Grappler on (fused ops then vanish from the trace)")
    flags.DEFINE_integer("seed", 0, "random seed of the feeds", lower_bound=0)
    flags.DEFINE_boolean("no-trace-calibration", False,
                         "keep the traced per-op times as they are (default on serial CPUs: remove the tracing "
                         "cost so the ops sum to the untraced step; tfplace.profiling.profiler rule 7)")
    flags.DEFINE_string("derive", "", "kinds to derive from the measured one by the roofline device model")
    flags.DEFINE_string("roofline", "", "kinds to estimate from the device model alone (nothing measured)")
    flags.DEFINE_boolean("comm", False, "also measure p2p/all-reduce on a local cluster")
    flags.DEFINE_boolean("comm-only", False, "only measure communication; merge into --out")
    flags.DEFINE_integer("comm-max-bytes", 64 << 20, "largest message of the comm sweep", lower_bound=1)
    flags.DEFINE_boolean("merge", False, "merge into an existing --out instead of replacing it")
    flags.DEFINE_integer("digits", 4, "significant digits kept in the file", lower_bound=1)
    flags.DEFINE_boolean("compact", False, "one op per line (smaller file, same format)")
    flags.DEFINE_string("out", None, "profile.json to write", required=True)
    flags.DEFINE_boolean("quiet", False, "no progress bar")
    common.output_file_flag("out")
    common.int_list_flag("batch-sizes", minimum=1, below=SIZE_LIMIT)
    common.int_list_flag("cpus", minimum=0)
    common.cpu_fraction_flag("cpu-fraction")
    common.graph_flag("graph")
    common.input_file_flag("cluster")
    flags.register_multi_flags_validator(
        ["cluster", "kind", "cpus", "cpu-fraction", "comm-only", "roofline", "derive", "device"],
        lambda v: not v["cluster"] or not (v["kind"] or v["cpus"] or v["cpu-fraction"] or v["comm-only"]
                                           or v["roofline"] or v["derive"] or v["device"].upper() != "CPU"),
        message="--cluster sets each kind, its cores and its quota from the cluster file. Fix: leave out --kind, "
                "--cpus, --cpu-fraction, --device, --comm-only, --roofline and --derive, or leave out --cluster")
    common.device_kinds_flag("derive")
    common.device_kinds_flag("roofline")
    common.flag_check("device", _check_device)
    flags.register_validator("batch-sizes", bool, message="give at least one batch size. Fix: write e.g. 8,16,32")
    flags.register_multi_flags_validator(["graph", "comm-only"], lambda v: bool(v["graph"]) or v["comm-only"],
                                         message="--graph is required (unless --comm-only). Fix: give the "
                                         "bundle JSON or a zoo model name, e.g. --graph tiny_mlp")
    flags.register_multi_flags_validator(
        ["comm-only", "graph", "derive", "roofline"],
        lambda v: not (v["comm-only"] and (v["graph"] or v["derive"] or v["roofline"])),
        message="--comm-only measures only the links and keeps --out's op costs, so --graph, --derive and "
                "--roofline would be ignored. Fix: leave them out, or drop --comm-only and give --comm to "
                "measure both")
    flags.register_multi_flags_validator(["derive", "roofline"], lambda v: not (v["derive"] and v["roofline"]),
                                         message="--roofline cannot be combined with --derive. Fix: use "
                                         "--roofline alone (nothing measured) or measure and --derive")
    flags.register_multi_flags_validator(["derive", "kind", "device"], _derives_another_kind,
                                         message="--derive names the kind that is measured, whose measured costs "
                                         "the derived ones would replace. Fix: leave that kind out of --derive")
    flags.register_multi_flags_validator(["derive", "kind", "device"], _derived_from_known_kind,
                                         message="--derive scales the measured kind, which the device model "
                                         "must know. Fix: give --kind one of its kinds (e.g. V100) or leave "
                                         "--derive out")


def _check_device(device: str) -> None:
    """Raises InputError unless `device` is CPU, GPU or GPU:<k> (tfplace.profiling.profiler.parse_device)."""
    from tfplace.profiling.profiler import parse_device
    parse_device(device, "argument --device")


def _measured_kind(values) -> str:
    """The kind the command measures: --kind, else CPU on a CPU device ("" when --kind is needed)."""
    return _kind(values["kind"]) or ("CPU" if str(values["device"]).upper().startswith("CPU") else "")


def _derives_another_kind(values) -> bool:
    """False when --derive lists the measured kind itself."""
    return _measured_kind(values) not in _kinds(values["derive"] or "")


def _derived_from_known_kind(values) -> bool:
    """True unless --derive is given and the measured kind (--kind, else CPU on a CPU) is
    unknown to the device model: derive_profile would refuse it after the measurement."""
    from tfplace.profiling.device_model import device_spec
    if not _kinds(values["derive"] or ""):
        return True
    kind = _measured_kind(values)
    if not kind:
        return True  # ProfileOptions.validated asks for --kind, before anything is measured
    try:
        device_spec(kind)
    except InputError:
        return False
    return True


def main(argv) -> int:
    """Profiles as the parsed flags say (absl main: argv holds the program name only)."""
    del argv
    return _run(common.args())  # Ctrl-C and SIGTERM: common.guarded's line and 130 / 143


def cluster_kind_settings(cluster) -> List[Tuple[str, Optional[List[int]], Optional[float]]]:
    """(kind, cores, CPU quota) per device kind of `cluster`, in device order, from the kind's first
    device's emulation. Raises InputError naming the cluster file for a kind that is not a CPU
    (a GPU kind is profiled on a GPU: --device GPU:k --kind K), whose devices declare different
    quotas (one profile per kind cannot describe both), or, checked after the kinds, for a host
    that is not this machine's loopback (its devices run there: a measurement here under their
    emulation would describe this machine, not them)."""
    from tfplace.formats.cluster import is_cpu_kind
    from tfplace.runtime.local_cluster import require_loopback
    source = cluster.source or cluster.name
    out, quota = [], {}
    for i, d in enumerate(cluster.devices):
        fraction = d.emulation.cpu_fraction if d.emulation else None
        if not is_cpu_kind(d.kind):
            raise InputError(source, f"devices[{i}].kind", f"{d.kind!r} is not a CPU kind: --cluster measures "
                             "CPU-emulated clusters", "profile a GPU kind on its GPU with --device GPU:k --kind K")
        if d.kind in quota:
            if quota[d.kind] != fraction:
                raise InputError(source, f"devices[{i}].emulation.cpu_fraction",
                                 f"{fraction} differs from {quota[d.kind]} of another {d.kind!r} device",
                                 "give devices of one kind the same quota, or different kind names")
            continue
        quota[d.kind] = fraction
        out.append((d.kind, list(d.emulation.cpus) if d.emulation and d.emulation.cpus else None, fraction))
    require_loopback(cluster, source)  # after the kinds: a GPU cluster's fix is its GPU, wherever it is
    return out


def profile_cluster(graph: str, cluster, out: str, batch_sizes, *, repeats: int = 5, warmup: int = 2,
                    statistic: str = "min", threads: int = 0, inter_threads: int = 1, quiet: bool = True,
                    stdout=None, source: Optional[str] = None) -> str:
    """Measures every kind of `cluster` (cluster_kind_settings) for the bundle `graph` into the
    profile file `out`, one child `python -m tfplace.profile` per kind (a process is pinned for
    good, so each kind gets its own), the first writing a file beside `out`, the others merging
    into it, renamed to `out` once every kind is in: a run that fails or is stopped leaves no
    profile of some kinds only, and an earlier `out` as it was. Raises InputError for an unusable
    cluster or a step that needs feeds beyond the batch (before anything runs; `source`: the file
    it names, default `graph`), RuntimeError naming the kind when a child fails. Returns out."""
    from tfplace.profiling.profiler import check_bundle_feedable
    settings = cluster_kind_settings(cluster)
    check_bundle_feedable(graph, source)  # a step the children cannot feed: one error line, before any child
    partial = f"{out}.partial{os.getpid()}"
    try:
        _profile_kinds(graph, cluster, partial, batch_sizes, settings, [
            "--repeats", str(repeats), "--warmup", str(warmup), "--statistic", statistic, "--threads", str(threads),
            "--inter-threads", str(inter_threads)] + (["--quiet"] if quiet else []), stdout, out)
        os.replace(partial, out)
    finally:
        if os.path.lexists(partial):
            os.remove(partial)
    return out


def _profile_kinds(graph: str, cluster, out: str, batch_sizes, settings, options: List[str], stdout,
                   shown_as: str) -> None:
    """One child `python -m tfplace.profile ... options` per (kind, cores, quota) of `settings`
    (cluster_kind_settings), the first writing `out`, the others merging into it; their summaries
    go to `stdout` with `out` named `shown_as` (the file it becomes)."""
    import subprocess
    for i, (kind, cpus, fraction) in enumerate(settings):
        cmd = [sys.executable, "-m", "tfplace.profile", "--graph", graph, "--kind", kind, "--out", out,
               "--batch-sizes", ",".join(str(b) for b in batch_sizes), *options]
        cmd += ["--cpus", ",".join(map(str, cpus))] if cpus else []
        cmd += ["--cpu-fraction", str(fraction)] if fraction else []
        cmd += ["--merge"] if i else []
        # the child's progress (stderr) shows as it goes; its summary (stdout) is passed on after
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if stdout is not None:
            stdout.write(done.stdout.replace(out, shown_as))
        if done.returncode != 0:
            raise RuntimeError(f"profiling kind {kind} of {cluster.source or cluster.name} failed "
                               f"(exit {done.returncode}; its error is above):\n{done.stdout[-2000:]}")


def _run(args) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.cluster:
        from tfplace.formats.cluster import load_cluster
        cluster = load_cluster(args.cluster)
        graph = common.resolve_graph(args.graph, "argument --graph", bundle=True, **common.step_options(args))
        started = time.monotonic()
        profile_cluster(graph, cluster, args.out, [int(b) for b in args.batch_sizes], repeats=args.repeats,
                        warmup=args.warmup, statistic=args.statistic, threads=args.threads,
                        inter_threads=args.inter_threads, quiet=args.quiet, stdout=sys.stdout, source=args.graph)
        print(f"profiled {len(cluster.kinds)} kinds of {args.cluster} into {args.out} "
              f"in {time.monotonic() - started:.1f} s")
        return 0
    from tfplace.profiling import profiler
    from tfplace.emulation.allocator import steady_allocator
    from tfplace.formats.profile import Profile, load_profile, save_profile

    started = time.monotonic()
    allocator = steady_allocator()  # as the server tasks run (tfplace.runtime.worker, tfplace.emulation.allocator)
    emulation = _limit_self(args)  # before TensorFlow starts threads: they inherit the pinning
    progress = None if args.quiet else (lambda total: profiler.ProgressBar(total, "profile"))
    result: Optional[Profile] = None
    existing: Optional[Profile] = None
    if args.comm_only:
        result = load_profile(args.out) if os.path.exists(args.out) else Profile(ops={})
    else:
        if not args.graph:
            raise InputError("arguments", "--graph", "is required", "give the bundle JSON, e.g. graph_defs/zoo/tiny_mlp_b16_sgd.json")
        # a zoo name or a bare step (.pb/.pbtxt/.meta): its bundle
        args.graph = common.resolve_graph(args.graph, "argument --graph", bundle=True, **common.step_options(args))
        existing = merged_into(args.out, args.graph) if args.merge else None  # before anything is measured
        batches = [int(b) for b in args.batch_sizes]
        if args.roofline:  # (never with --derive: refused at parse time)
            result = _roofline_only(args, batches)
        else:
            opts = profiler.ProfileOptions(device=args.device, kind=_kind(args.kind), batch_sizes=tuple(batches),
                                           repeats=args.repeats, warmup=args.warmup, statistic=args.statistic,
                                           intra_threads=args.threads, inter_threads=args.inter_threads,
                                           grappler=args.grappler, seed=args.seed,
                                           trace_calibration=not args.no_trace_calibration)
            opts = opts.validated("arguments")
            measured = profiler.profile_bundle(args.graph, opts, progress=progress)
            result = measured.profile
            throttle = emulation.get("throttle_wall_per_cpu_s", 1.0)
            if throttle != 1.0:
                result = profiler.scaled_kind(result, opts.kind, throttle)
            print(f"measured {len(result.ops)} ops on {opts.device} as {opts.kind} at batch sizes "
                  f"{list(opts.batch_sizes)} in {measured.elapsed_s:.1f} s; "
                  f"{len(result.missing_ops)} ops not in the trace" +
                  (f"; op times x {throttle:.3f}, the slowdown under the quota" if throttle != 1.0 else ""))
            for b, w in sorted(measured.step_wall_s.items()):
                total = sum(result.seconds(op, opts.kind, b) for op in result.ops)
                print(f"  batch {b:>4}: step {w * 1e3:9.2f} ms wall traced, "
                      f"{measured.untraced_step_wall_s[b] * 1e3:9.2f} ms untraced, sum of ops {total * 1e3:9.2f} ms")
            if _kinds(args.derive):
                result = _derive(args, result, opts.kind, _kinds(args.derive), batches)
    if args.comm or args.comm_only:
        from tfplace.profiling import comm_profiler
        comm = comm_profiler.measure_comm(max_bytes=args.comm_max_bytes, progress=progress)
        comm_profiler.print_fits(comm)
        result = profiler.merge_profiles(result, Profile(ops={}, comm=comm.model))
        result = _with_conditions(result, comm=comm.conditions)
    if emulation:
        result = _with_conditions(result, emulation=emulation)
    if allocator and not args.comm_only:
        result = _with_conditions(result, allocator=allocator)
    if existing is not None:
        result = profiler.merge_profiles(existing, result)
    final = profiler.rounded(result, args.digits)
    if args.compact:
        profiler.save_compact(final, args.out)
    else:
        save_profile(final, args.out)
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1024:.0f} KiB) in {time.monotonic() - started:.1f} s")
    return 0


def merged_into(out: str, graph: str):
    """The profile in `out` that --merge adds to (None when there is none yet), read before
    anything is measured: a file that is no profile, or a profile of another graph than the
    bundle `graph` (tfplace.formats.profile.graph_name; the graph's other batch sizes and kinds
    merge), raises InputError naming both graphs."""
    if not os.path.exists(out):
        return None
    from tfplace.formats.profile import graph_name, load_profile
    existing = load_profile(out)
    given = graph_name(graph)
    if existing.graph and existing.ops and existing.graph != given:
        raise InputError(out, "graph", f"--merge would add graph {given!r} to a profile of graph {existing.graph!r}",
                         "give --out another file for this graph, or leave out --merge to replace the file")
    return existing


def _limit_self(args) -> dict:
    """Applies --cpus to this process and measures the slowdown of --cpu-fraction; returns both
    for the profile's conditions (`emulation`; empty when neither is given).

    A quota kind's ops are timed without the quota and scaled by the slowdown (wall seconds per
    CPU second) a compute loop measures under it on the same CPUs (tfplace.emulation.cpu_quota
    .measure_throttle), rather than timed under it. Timed under a 0.5 quota (and a 2 ms period),
    the kind's ops summed to 3.6x the unlimited kind's for ResNet-50 and 4.1x for the tiny
    transformer (2.1x for the MLP and the CNN; the largest batch of one run), where a compute
    loop slows down 2.0-2.4x; most likely the profiler's own work between the timed steps
    (reading each trace) draws on the same quota and stalls the next timed step. The
    simulator put ResNet-50's model-parallel steps at 1.27-1.50x the real ones."""
    out = {}
    if args.cpus:
        cpus = [int(c) for c in args.cpus]
        try:
            os.sched_setaffinity(0, cpus)
        except (OSError, ValueError) as e:
            raise InputError("arguments", "--cpus", f"cannot pin to {cpus} ({e})",
                             f"give CPU ids this machine has (0..{os.cpu_count() - 1})") from e
        out["cpus"] = cpus
    if args.cpu_fraction:
        from tfplace.emulation.cpu_quota import measure_throttle, period_for
        throttle = measure_throttle(args.cpu_fraction, cpus=out.get("cpus"))
        out.update(cpu_fraction=float(args.cpu_fraction), cpu_period_us=period_for(args.cpu_fraction),
                   throttle_wall_per_cpu_s=round(throttle, 4), effective_cpu_fraction=round(1.0 / throttle, 4),
                   op_times="timed without the quota, times throttle_wall_per_cpu_s")
    return out


def _with_conditions(profile, **extra):
    import dataclasses
    conditions = dict(profile.conditions)
    conditions.update(extra)
    return dataclasses.replace(profile, conditions=conditions)


def _load_graph(path: str):
    from tfplace.ir.loader import load_op_graph
    return load_op_graph(path)


def _derive(args, profile, from_kind: str, to_kinds: List[str], batches):
    from tfplace.profiling import device_model, profiler
    graph = _load_graph(args.graph)
    derived = device_model.derive_profile(profile, graph, from_kind, to_kinds, batches)
    b = max(batches)
    for kind in to_kinds:
        print(f"derived {kind} from {from_kind}: sum of ops at batch {b} = "
              f"{sum(derived.seconds(op, kind, b) for op in derived.ops) * 1e3:.2f} ms")
    return profiler.merge_profiles(profile, derived)


def _roofline_only(args, batches):
    from tfplace.profiling import device_model
    graph = _load_graph(args.graph)
    prof = device_model.roofline_profile(graph, _kinds(args.roofline), batches)
    print(f"roofline profile of {len(prof.ops)} ops for {list(prof.kinds)} at batch sizes {batches}")
    return prof


def run() -> None:
    """Entry point for `python -m`: `app.run(main)` under tfplace.cli.common's contract."""
    common.run(main, define_flags, __doc__, servers=True)


if __name__ == "__main__":
    run()
