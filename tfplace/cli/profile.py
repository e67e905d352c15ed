"""`python -m tfplace.profile`: measure a graph's per-op costs, derive absent device kinds, and
measure communication on a local cluster.

    python -m tfplace.profile --graph graph_defs/zoo/resnet50_b64_s224_sgd.json --device CPU \
        --batch-sizes 2,4,8 --repeats 3 --warmup 1 --derive V100,P100,GTX1080Ti --out profile.json
    python -m tfplace.profile --comm-only --out profile.json      # add/replace the comm fits
    python -m tfplace.profile --graph G.json --roofline V100,T4 --batch-sizes 8,16 --out p.json

Writes profile.json (format: tfplace/profile.py). Progress goes to stderr, a summary to stdout.
Bad arguments exit with status 2 and one line naming the argument and the fix.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional, Sequence

from tfplace.formats.errors import InputError
from tfplace.profiling.profiler import STATISTICS


def _int_list(text: str, flag: str) -> List[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"argument {flag}", "", f"{text!r} is not a comma-separated list of integers",
                         "write e.g. 8,16,32") from None
    return values


def _kinds(text: str) -> List[str]:
    return [k.strip() for k in text.split(",") if k.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tfplace.profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--graph", help="bundle metadata JSON (<stem>.json beside <stem>.pb)")
    p.add_argument("--device", default="CPU", help="CPU, GPU or GPU:<k> (default CPU)")
    p.add_argument("--kind", default="", help="device kind that keys the profile (default CPU for CPUs)")
    p.add_argument("--batch-sizes", default="8,16,32", help="per-device batch sizes, comma-separated")
    p.add_argument("--repeats", type=int, default=5, help="traced steps per batch size (and as many untraced)")
    p.add_argument("--warmup", type=int, default=2, help="untraced steps before them")
    p.add_argument("--statistic", default="min", choices=STATISTICS,
                   help="per-op statistic over the repeats (default min: noise only adds time)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0 = TensorFlow's default)")
    p.add_argument("--inter-threads", type=int, default=1, help="inter-op threads (default 1: ops run one at a time)")
    p.add_argument("--cpus", default="", help="pin the measurement to these CPU ids, comma-separated "
                   "(as LocalCluster(cpus_per_task=...) pins a task)")
    p.add_argument("--cpu-fraction", type=float, default=0.0,
                   help="profile a kind limited to this share of one CPU (as LocalCluster(cpu_fraction_per_task="
                        "...) limits a task; needs writable cgroups): the ops are timed without the quota and "
                        "scaled by the slowdown a compute loop measures under it; 0 = unlimited")
    p.add_argument("--grappler", action="store_true", help="keep Grappler on (fused ops then vanish from the trace)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-trace-calibration", action="store_true",
                   help="keep the traced per-op times as they are (default on serial CPUs: remove the tracing cost "
                        "so the ops sum to the untraced step; tfplace.profiling.profiler rule 7)")
    p.add_argument("--derive", default="", help="kinds to derive from the measured one by the roofline device model")
    p.add_argument("--roofline", default="", help="kinds to estimate from the device model alone (nothing measured)")
    p.add_argument("--comm", action="store_true", help="also measure p2p/all-reduce on a local cluster")
    p.add_argument("--comm-only", action="store_true", help="only measure communication; merge into --out")
    p.add_argument("--comm-max-bytes", type=int, default=64 << 20, help="largest message of the comm sweep")
    p.add_argument("--merge", action="store_true", help="merge into an existing --out instead of replacing it")
    p.add_argument("--digits", type=int, default=4, help="significant digits kept in the file")
    p.add_argument("--compact", action="store_true", help="one op per line (smaller file, same format)")
    p.add_argument("--out", required=True, help="profile.json to write")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _run(args) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfplace.profiling import profiler
    from tfplace.emulation.allocator import steady_allocator
    from tfplace.formats.profile import Profile, load_profile, save_profile

    started = time.monotonic()
    allocator = steady_allocator()  # as the server tasks run (tfplace.runtime.worker, tfplace.emulation.allocator)
    emulation = _limit_self(args)  # before TensorFlow starts threads: they inherit the pinning
    progress = None if args.quiet else (lambda total: profiler.ProgressBar(total, "profile"))
    result: Optional[Profile] = None
    if args.comm_only:
        result = load_profile(args.out) if os.path.exists(args.out) else Profile(ops={})
    else:
        if not args.graph:
            raise InputError("arguments", "--graph", "is required", "give the bundle JSON, e.g. graph_defs/zoo/tiny_mlp_b16_sgd.json")
        batches = _int_list(args.batch_sizes, "--batch-sizes")
        if args.roofline and args.derive:
            raise InputError("arguments", "--roofline", "cannot be combined with --derive",
                             "use --roofline alone (nothing measured) or measure and --derive")
        if args.roofline:
            result = _roofline_only(args, batches)
        else:
            opts = profiler.ProfileOptions(device=args.device, kind=args.kind, batch_sizes=tuple(batches),
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
    if args.merge and not args.comm_only and os.path.exists(args.out):
        result = profiler.merge_profiles(load_profile(args.out), result)
    final = profiler.rounded(result, args.digits)
    if args.compact:
        profiler.save_compact(final, args.out)
    else:
        save_profile(final, args.out)
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1024:.0f} KiB) in {time.monotonic() - started:.1f} s")
    return 0


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
        cpus = _int_list(args.cpus, "--cpus")
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
    """Entry point for `python -m`."""
    sys.exit(main())


if __name__ == "__main__":
    run()
