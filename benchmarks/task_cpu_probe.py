"""Each task's CPU for the runtime's work and for a model's step, on the local cluster.

    .venv/bin/python benchmarks/task_cpu_probe.py [--hetero] [--models tiny_cnn,tiny_transformer]
        [--record RECORD.json --strategies tiny_cnn:dp_even_allreduce] [--steps 100] [--repeats 2]

The runtime overheads (tfplace.profiling.overheads_probe) give the servers' CPU summed over the
tasks, and fidelity_bench's table each task's CPU per step of a whole strategy. This probe splits
the runtime's work by task, so that the simulator's per-device CPU demand
(tfplace.overheads.cpu_demand) can be checked term by term. Per pass it prints, for each item,
the wall per unit and each task's CPU per unit (the scheduler's counters,
overheads_probe.task_cpu_seconds), each the difference of two steps that differ only in it
(overheads_probe.step_costs):
  * further tasks: a step with a tiny op on tasks 1 and 2 as well, beyond a one-task step (each
    further task's column: its RunGraph; task 0's: what the master spends on both);
  * an all-reduce: a chain of 12 across all three tasks (and across tasks 0-1) at 16 bytes and
    64 KiB, beyond the same chain of Identity ops (overheads_probe.collective_chain);
  * a message: a chain of 24 dependent 16-byte hops between tasks 1-2 and 0-1, beyond the same
    chain on one task (overheads_probe.hop_chain);
  * an op: a chain of 1000 dependent adds of 4 floats on each task, beyond none.
With --record and --strategies, each named strategy of a fidelity_bench --record file, its step
as it is and with every all-reduce an Identity (without_collectives): the difference is what its
all-reduces cost each task in a real step, against the collective_cpu_s curve.
With --models, each model's whole step (rewrite_step of all samples on one device) on task 0,
1 and 2 alone, --steps steps each: its wall and each task's CPU per step. On the emulated
heterogeneous cluster (--hetero, fidelity_bench.HETERO) the tasks run the same kernels; what a
throttled task spends beyond task 0 is what the quota costs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from tfplace.profiling import overheads_probe as probe

import fidelity_bench as fb

COLLECTIVE_SIZES_BYTES = (16, 64 << 10)
CHAIN_COLLECTIVES, CHAIN_HOPS, CHAIN_OPS = 12, 24, 1000


def per_unit(lc, build, units: int, steps: int) -> tuple:
    """(wall seconds, CPU seconds per task [T]) per unit of what `build(True)` has beyond
    `build(False)`, `units` of it in a step (step_costs of each, `steps` steps). Every task's
    column is divided by `units`."""
    wall = []
    cpu = []
    for present in (True, False):
        w, c = probe.step_costs(lc, build(present), wall_steps=steps, cpu_steps=steps)
        wall.append(w)
        cpu.append(c)
    return (wall[0] - wall[1]) / units, (cpu[0] - cpu[1]) / units


def further_tasks(devs):
    def build(present: bool):
        return probe.every_task(devs) if present else (lambda x0: [x0])
    return build


def op_chain(devs, task: int):
    def build(present: bool):
        return probe.add_chain(devs, CHAIN_OPS if present else 0, task)
    return build


def runtime_rows(lc, steps: int) -> list:
    """(name, wall seconds per unit, CPU seconds per task per unit) of every runtime item."""
    devs = lc.device_names
    rows = [("a partition on tasks 1, 2 too", *per_unit(lc, further_tasks(devs), 1, steps))]
    for nbytes in COLLECTIVE_SIZES_BYTES:
        for group in (len(devs), 2):
            key = 5000 + 200 * group  # collective_chain adds a term per value size

            def build(present, group=group, nbytes=nbytes, key=key):
                return probe.collective_chain(devs, CHAIN_COLLECTIVES, group, present, nbytes // 4, key_base=key)
            rows.append((f"all-reduce, tasks 0-{group - 1}, {nbytes} B",
                         *per_unit(lc, build, CHAIN_COLLECTIVES, steps)))
    for a, b in ((1, 2), (0, 1)):
        def build(present, a=a, b=b):
            return lambda x0: [x0, probe.hop_chain(devs, a, b, CHAIN_HOPS, present)]
        rows.append((f"message, tasks {a}-{b}, 16 B", *per_unit(lc, build, CHAIN_HOPS, steps)))
    for task in range(len(devs)):
        rows.append((f"op on task {task}", *per_unit(lc, op_chain(devs, task), CHAIN_OPS, steps)))
    return rows


def model_rows(lc, cluster, model: str, steps: int) -> list:
    """(name, median wall seconds, CPU seconds per task [T]) per step of `model` on each task alone."""
    from tfplace.ir.loader import load_op_graph
    from tfplace.rewrite.graph_rewrite import rewrite_step
    from tfplace.formats.strategy import Strategy, decision
    graph = load_op_graph(os.path.join(fb.ROOT, fb.bundle_path(model)))
    batch = int(graph.reference_batch_size)
    rows = []
    for task, device in enumerate(cluster.device_names):
        strategy = Strategy(batch, fb.MAX_GROUPS, decision({device: batch}), {}, model)
        wall, cpu = rewritten_step_costs(lc, rewrite_step(graph, strategy, cluster), batch, steps)
        rows.append((f"{model} on task {task}", wall, cpu))
    return rows


def rewritten_step_costs(lc, step, batch: int, steps: int) -> tuple:
    """(median wall seconds, CPU seconds per task [T]) of `steps` steps of a RewrittenStep on `lc`
    (its variables initialised, a random feed of `batch` samples), after 5 warm-up steps."""
    from tfplace.runtime.step_runner import StepRunner, random_feed
    with initialized(StepRunner(lc, step, timeout_s=120)) as runner:
        feed = random_feed(step.inputs, batch, 0)
        probe.warm_up(lambda: runner.run_steps(1, feed), 5)
        c0 = probe.task_cpu_seconds(lc.pids)
        times = runner.run_steps(steps, feed)
        cpu = (probe.task_cpu_seconds(lc.pids) - c0) / steps
    return float(np.median(times)), cpu


def without_collectives(graph_def):
    """(a copy of `graph_def` with every CollectiveReduceV2 an Identity of its input, its other
    inputs and its control inputs as control inputs; how many were replaced on each device,
    {device name: count}). The step then does all its other work: what it loses is what its
    all-reduces cost (the gradients are no longer summed; only the timing is kept)."""
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    count = {}
    for node in out.node:
        if node.op != "CollectiveReduceV2":
            continue
        dtype = type(node.attr["T"])()
        dtype.CopyFrom(node.attr["T"])
        # the key and size inputs become control inputs: they carry the ordering of the
        # rewrite's priority chains (TensorFlow drops a control input those inputs imply)
        data = [i for i in node.input if not i.startswith("^")]
        kept = [data[0]] + ["^" + i.split(":")[0] for i in data[1:]] + [i for i in node.input if i.startswith("^")]
        node.ClearField("attr")
        node.attr["T"].CopyFrom(dtype)
        node.op = "Identity"
        del node.input[:]
        node.input.extend(kept)
        count[node.device] = count.get(node.device, 0) + 1
    return out, count


def recorded_rows(lc, cluster, record_path: str, pairs, steps: int) -> list:
    """(name, median wall seconds, CPU seconds per task [T], all-reduces per task [T]) of each
    (model, strategy) in `pairs` from a fidelity_bench --record file, its step as it is and
    without its all-reduces (without_collectives), `steps` steps each after warm-up."""
    import dataclasses
    from tfplace.baselines.problem import make_problem
    from tfplace.ir.loader import load_op_graph
    from tfplace.formats.jsonio import FieldReader
    from tfplace.formats.profile import profile_from_reader
    from tfplace.rewrite.graph_rewrite import rewrite_step
    from tfplace.formats.strategy import strategy_from_reader
    record = FieldReader.from_file(record_path, expected_format=fb.RECORD_FORMAT).data
    rows = []
    for model, name in pairs:
        entry = FieldReader(record["models"], record_path, "models").get(model, dict)
        by_name = {r["name"]: r for r in entry["rows"]}
        if name not in by_name:
            raise SystemExit(f"{record_path}: models.{model} has no strategy {name!r} (has {sorted(by_name)})")
        graph = load_op_graph(os.path.join(fb.ROOT, entry["bundle"]))
        # the overheads only feed the simulator: the grouping and the rewrite need the profile alone
        profile = profile_from_reader(FieldReader(entry["profile"], record_path, "profile"))
        batch = int(graph.reference_batch_size)
        grouping = make_problem(graph, cluster, profile, max_groups=fb.MAX_GROUPS, global_batch_size=batch).grouping
        strategy = strategy_from_reader(FieldReader(by_name[name]["strategy"], record_path, "strategy"))
        step = rewrite_step(graph, strategy, cluster, profile=profile, grouping=grouping)
        plain, on = without_collectives(step.graph_def)
        count = np.array([on.get(d, 0) for d in lc.device_names])
        for label, variant in (("as it is", step), ("without all-reduces", dataclasses.replace(step, graph_def=plain))):
            wall, cpu = rewritten_step_costs(lc, variant, batch, steps)
            rows.append((f"{model}/{name} {label}", wall, cpu, count))
    return rows


def initialized(runner):
    """`runner` (a StepRunner, a context manager that closes it) with its variables initialised."""
    runner.initialize()
    return runner


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hetero", action="store_true", help="the emulated heterogeneous cluster (needs root)")
    p.add_argument("--models", default="", help="comma-separated zoo models (fidelity_bench.MODELS) to run whole")
    p.add_argument("--record", default="", help="a fidelity_bench --record file, for --strategies")
    p.add_argument("--strategies", default="",
                   help="comma-separated model:strategy of --record, each run as it is and without its all-reduces")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    for name in ("steps", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(fb.MODELS))
    if unknown:
        p.error(f"--models: unknown {unknown}; choose from {sorted(fb.MODELS)}")
    pairs = [tuple(x.split(":", 1)) for x in args.strategies.split(",") if x]
    if pairs and not args.record:
        p.error("--strategies needs --record (a fidelity_bench --record file)")
    if any(len(x) != 2 for x in pairs):
        p.error("--strategies: each entry is model:strategy, e.g. tiny_cnn:dp_even_allreduce")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfplace.runtime.local_cluster import LocalCluster
    cluster, lc_kwargs = fb.local_cluster_setup(args.hetero)
    with LocalCluster(**lc_kwargs) as lc:
        tasks = " ".join(f"{'task ' + str(t):>8}" for t in range(lc.num_tasks))
        for r in range(args.repeats):
            t0 = time.perf_counter()
            print(f"pass {r + 1}: per unit, us (wall, then each task's CPU)\n  {'':34} {'wall':>8} {tasks}",
                  flush=True)
            for name, wall, cpu in runtime_rows(lc, args.steps):
                print(f"  {name:34} {wall * 1e6:8.1f} " + " ".join(f"{c * 1e6:8.1f}" for c in cpu), flush=True)
            if models:
                print(f"pass {r + 1}: a model's step on one task, ms\n  {'':34} {'wall':>8} {tasks}", flush=True)
            for model in models:
                for name, wall, cpu in model_rows(lc, cluster, model, args.steps):
                    print(f"  {name:34} {wall * 1e3:8.2f} " + " ".join(f"{c * 1e3:8.2f}" for c in cpu), flush=True)
            if pairs:
                print(f"pass {r + 1}: a recorded strategy's step, ms\n  {'':52} {'wall':>8} {tasks}", flush=True)
                rows = recorded_rows(lc, cluster, args.record, pairs, args.steps)
                for name, wall, cpu, _ in rows:
                    print(f"  {name:52} {wall * 1e3:8.2f} " + " ".join(f"{c * 1e3:8.2f}" for c in cpu), flush=True)
                for (name, wall, cpu, count), (_, wall0, cpu0, _) in zip(rows[::2], rows[1::2]):
                    per = np.maximum(count, 1)  # each task's all-reduces per step
                    label = name.rsplit(" as it is", 1)[0]
                    print(f"  {label}: per all-reduce {(wall - wall0) / per.max() * 1e3:.3f} ms "
                          "wall, CPU per participant " + " ".join(f"{c * 1e3:.3f}" for c in (cpu - cpu0) / per)
                          + " ms", flush=True)
            print(f"pass {r + 1}: {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
