"""`python activate.py activate_config.txt`: deploy strategies and baselines on a real cluster.

For every entry (strategy files, then baselines on every graph): rewrite (tfplace.rewrite.graph_rewrite),
warm-up, timed steps, mean ± std per-iteration time (with `"rounds": N`, every entry runs N
times, round by round on fresh servers, and the median round counts), a Chrome timeline of one FULL_TRACE step
(`<output_dir>/<entry>.timeline.json`), the simulated time of the same PlacedGraph, and a final
table with measured time, simulated time and their ratio, then per graph the entry that ran fastest
for real and whether the simulator ranked it first (verdict_lines), against the fastest Horovod row,
and the simulator's simulated / real range. An entry the simulator says runs out of device memory
(the cluster file's memory_bytes) is marked OOM in the table and `"simulated_oom": true` in
results.json, and has no ratio: it is left out of the ranking and the range. Every entry is checked
before any work (an unknown baseline, a strategy file that does not fit the cluster; a strategy
deciding groups its graph lacks, once the graph is exported and grouped: exit 2 before any server
starts); an entry that fails while it runs (out of memory, a graph that does not load) is reported
(its error in the table and in results.json) and the others still run; a worker that died is
replaced by a new cluster for the next entry. Results: `<output_dir>/results.json`, written empty when the run
starts (an earlier run's moved to results.previous.json, its timelines to
<entry>.timeline.previous.json) and rewritten after every entry ("complete": false until the last),
so what ran survives an interrupt. Each core the run uses is probed just before and after every
timed window (tfplace.runtime.machine_speed): a round during which the machine itself ran slow (a
shared host) is marked "disturbed" in results.json and left out of the row's median unless every
round of the row was; the table says how many were. With
`"overheads": "measure"` the runtime overheads are measured on the cluster first (into
<output_dir>/overheads.json); an overheads file measured on a machine whose cores ran more than
1.3x faster or slower than this one's did in the run is named in a closing note
(machine_speed.speed_mismatch_note). One run
at a time may use an output folder (a lock in it; a second run stops with exit 2). SIGTERM or
Ctrl-C stops every server and Horovod rank and removes their temporary folders.

Clusters whose hosts are all loopback run on a LocalCluster started here (one server process
per task, each pinned and CPU-limited as its device's `emulation` in the cluster file says);
horovod_* baselines call baselines/horovod_runner.py, rank i under device i's emulation. A
cluster file with a host that is not loopback is refused (exit 2) before anything starts: its
servers run on those hosts, never silently here. A graph entry's sizes (image_size, seq_len,
num_layers) shape its exported bundle; one the model does not take is an error naming it.
Config keys: examples/formats/README.md (loader: tfplace.formats.config.load_activate_config).
The output folder is checked before any work. Exit status: 0 when every entry ran, 1 when one
failed while running (the others ran), 2 on a usage error or bad input (one line naming the
file, the field and the fix).
"""

from __future__ import annotations

import dataclasses as dc
import json
import os
import statistics
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

from tfplace.cli import common
from tfplace.formats.cluster import Cluster, load_cluster
from tfplace.formats.config import MEASURE, ActivateConfig, GraphEntry, load_activate_config
from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import atomic_write
from tfplace.formats.reports import same_time
from tfplace.formats.strategy import load_strategy, validate_strategy
from tfplace.runtime import machine_speed


# The grouping level of baseline strategies: compare's default (`python -m tfplace.compare
# --max-groups`), so a baseline here is the very strategy compare and training evaluate.
BASELINE_MAX_GROUPS = 64


def baseline_plan(name: str, graph, cluster: Cluster, profile, batch: Optional[int] = None,
                  max_groups: int = BASELINE_MAX_GROUPS, overheads=None):
    """(strategy, grouping) of a non-Horovod baseline, from tfplace.baselines.registry:
    `make_problem` + `registry.generate(name, problem)`, exactly as compare and training build
    them (same profile, same grouping level, same runtime overheads)."""
    from tfplace.baselines import registry
    from tfplace.baselines.problem import make_problem
    problem = make_problem(graph, cluster, profile, max_groups=max_groups, global_batch_size=batch,
                           overheads=overheads)
    return registry.generate(name, problem), problem.grouping


def _speed_weights(cluster: Cluster) -> List[float]:
    from tfplace.profiling.device_model import device_speed
    return [float(device_speed(d)) for d in cluster.devices]


def _graph_path(entry: GraphEntry) -> str:
    """The entry's bundle: its `graph`, or its zoo model exported with every size it gives."""
    from tfplace.graph_defs.export import bundle_for_entry
    return bundle_for_entry(entry)


def _jobs(config: ActivateConfig) -> List[Dict[str, Any]]:
    """One dict per run: name, graph bundle path (or the error that stopped its export), strategy
    (or baseline name). Bad input is raised, before any server: a strategy file, and of a "graphs"
    entry a step whose roles are ambiguous, a batch its sizes cannot take or a bundle built for
    another batch (named as the config's field). A strategy entry's graph that fails to export (its
    roles are not the config's to name) is that entry's error, reported as the entries run."""
    from tfplace.graph_defs.user_step import is_step_file
    jobs, graphs = [], []
    for e in config.strategies:
        job = {"name": e.name, "kind": "strategy", "error": None}
        s = load_strategy(e.strategy)
        entry = GraphEntry(s.global_batch_size, model=e.model, graph=e.graph or None)
        try:
            job.update(strategy=s, graph=_graph_path(entry))
            graphs.append((job["graph"], s.global_batch_size, _row_name(entry, job["graph"])))
        except Exception as err:  # reported per entry
            job["error"] = err
        jobs.append(job)
    for i, g in enumerate(config.graphs):
        if g.graph is not None and not is_step_file(g.graph):
            check_bundle_batch(g.graph, g.batch_size, config.source or "activate config", f"graphs[{i}].batch_size")
        try:
            path = _graph_path(g)
            graphs.append((path, g.batch_size, _row_name(g, path)))
        except InputError as err:
            raise g.in_config(err, config.source or "activate config", f"graphs[{i}]") from None
        except Exception as err:
            jobs.append({"name": g.label, "kind": "graph", "error": err})
    for base in config.baselines:
        for path, batch, name in dict.fromkeys(graphs):
            jobs.append({"name": f"{base}.{name}", "kind": "baseline", "baseline": base, "graph": path,
                         "batch": batch, "error": None})
    return jobs


def _row_name(entry: GraphEntry, bundle: str) -> str:
    """What the rows of a graph call it: its bundle's file stem (a zoo model's names its sizes),
    or, for a bare step imported into a cached bundle, the entry's label (the step's name and
    batch), not the cache's hashed stem."""
    from tfplace.graph_defs.user_step import is_step_file
    if entry.graph is not None and is_step_file(entry.graph):
        return entry.label
    return os.path.splitext(os.path.basename(bundle))[0]


def check_bundle_batch(path: str, batch: int, source: str, field: str) -> None:
    """Raises InputError naming `field` of `source` when the bundle at `path` is built for another
    global batch than `batch`: a real step feeds the graph its own batch."""
    from tfplace.graph_defs.bundle import read_meta
    try:
        built = read_meta(path).get("global_batch_size")
    except ValueError:
        return  # a bundle that does not read is that entry's error, as a failed export is
    if built is not None and built != batch:
        raise InputError(source, field, f"is {batch}, but the bundle {path} is built for a global batch of {built}",
                         f"give {built}, or a graph exported at batch {batch}")


def check_groups(jobs: List[Dict[str, Any]], cluster: Cluster) -> None:
    """Raises InputError naming the strategy file's field when a strategy entry's groups are not
    its graph's at its max_groups (tfplace.formats.strategy.validate_strategy): loads each such
    graph and groups it, as the entry's run would, and keeps the grouping for its rounds
    (`job["grouping"]`); also when the graph is built for another global batch than the
    strategy's (tfplace.rewrite.graph_rewrite.check_batch). An entry whose graph failed to export
    or does not load gets that error (`job["error"]`), reported as the entries run."""
    from tfplace.ir.grouping import make_grouping
    from tfplace.rewrite.graph_rewrite import check_batch
    from tfplace.ir.loader import load_op_graph
    graphs: Dict[str, Any] = {}
    groupings: Dict[Any, Any] = {}
    for job in jobs:
        if job["kind"] != "strategy" or job.get("error") is not None or job.get("grouping") is not None:
            continue
        strategy = job["strategy"]
        if job["graph"] not in graphs:
            try:
                graphs[job["graph"]] = load_op_graph(job["graph"])
            except Exception as err:  # reported as the entry runs, as a failed export is
                graphs[job["graph"]] = err
        graph = graphs[job["graph"]]
        if isinstance(graph, Exception):
            job["error"] = graph
            continue
        key = (job["graph"], strategy.max_groups)
        if key not in groupings:
            groupings[key] = make_grouping(graph, strategy.max_groups)
        validate_strategy(strategy, groupings[key].group_names, cluster.device_names)
        check_batch(graph, strategy)  # a bundle built for another batch cannot run this strategy
        job["grouping"] = groupings[key]  # the one its rounds rewrite with: grouped once, as checked


def _is_horovod(job) -> bool:
    """A Horovod baseline entry: run by Horovod's own workers, not simulated."""
    return job["kind"] == "baseline" and job["baseline"].startswith("horovod")


def profile_batch_sizes(batch: int) -> List[int]:
    """The per-device batch sizes a graph of global batch `batch` is profiled at: the powers of
    two below it and the batch itself (a replica holds at most the global batch)."""
    return sorted({b for b in (1 << k for k in range(batch.bit_length())) if b <= batch} | {batch})


def measure_graph_profile(graph: str, batch: int, cluster: Cluster, path: str, overheads=None):
    """The Profile of the bundle `graph` measured on `cluster`'s kinds as their devices are
    emulated (tfplace.cli.profile.profile_cluster, at profile_batch_sizes(batch)), written to
    `path`; with `overheads`, its comm fit (raw.comm, the fit its collective_s was measured
    against) is the profile's."""
    from tfplace.cli.profile import profile_cluster
    from tfplace.formats.profile import comm_from_json, load_profile
    profile_cluster(graph, cluster, path, profile_batch_sizes(batch))
    profile = load_profile(path)
    comm = (overheads.raw or {}).get("comm") if overheads is not None else None
    if comm and profile.comm is None:
        profile = dc.replace(profile, comm=comm_from_json(comm, f"{overheads.source or 'overheads'}: raw"))
    return profile


MEASURE_FIX = 'measure them on this machine: write "overheads": "measure" in the config'
OVERHEADS_PASSES = 2  # as the bundled overheads files were measured
OVERHEADS_FILE = "overheads.json"  # in the output folder, with "overheads": "measure"


def check_measurable(cluster: Cluster, cluster_path: str, source: str, field: str, leave_out: str) -> None:
    """Raises InputError naming `source`'s `field` (where "measure" was asked for: a config's
    "overheads", or "argument" --overheads) when `cluster` (loaded from `cluster_path`) cannot have
    its runtime overheads measured here (tfplace.cli.overheads.check_local_cluster: loopback CPU
    tasks, one device each, at least two); the fix says to `leave_out` the request or give a file."""
    from tfplace.cli.overheads import check_local_cluster
    try:
        check_local_cluster(cluster, cluster_path)
    except InputError as err:
        raise InputError(source, field, f'is "measure", but {err.source}: {err.field} {err.problem}',
                         f"{leave_out} (GPU clusters need none) or give a measured overheads file") from None


def measure_cluster_overheads(cluster: Cluster, cluster_path: str, path: str, by: str, watch=None, out=None):
    """The runtime overheads of `cluster` (loaded from `cluster_path`) measured now, as `python -m
    tfplace.cli.overheads --cluster C --passes 2` measures them (the cluster file's emulation, one
    intra-op and one inter-op thread per task, the client unpinned), written to `path`; `by`
    names the caller in the file's `how`, `watch` is its SpeedWatch (a new one without).
    About a minute for 3 tasks. With `out`, says so first, prints a line for each step of the
    measurement (progress) and one at the end: how long it took, the file, and whether the machine
    ran slow around it (the median of `watch`'s probes just before and for 2 s after; those
    between the steps are not judged: the servers may still load the cores then). Raises
    InputError naming the cluster file's field, before any server starts, for a cluster that
    cannot be measured here (check_local_cluster)."""
    from tfplace.cli import overheads as overheads_cli
    from tfplace.overheads.model import save_overheads
    overheads_cli.check_local_cluster(cluster, cluster_path)
    args = overheads_cli.default_settings(cluster_path, OVERHEADS_PASSES)
    kwargs = overheads_cli.cluster_settings(args, cluster, cluster_path)
    say = (lambda line: print(line, file=out, flush=True)) if out is not None else (lambda line: None)
    say(f"measuring the runtime overheads of {cluster_path} ({OVERHEADS_PASSES} passes, about a minute)")
    started = time.monotonic()
    watch = watch or machine_speed.SpeedWatch(machine_speed.cores_of(cluster))
    mark = len(watch.probes)
    overheads = overheads_cli.measure(cluster, cluster_path, kwargs, f"measured by {by}, as " +
                                      overheads_cli.how(args, kwargs), watch=watch, passes=args.passes,
                                      progress=lambda line: say(f"  [{time.monotonic() - started:4.0f} s] {line}"))
    save_overheads(overheads, path)
    say(f"measured the runtime overheads in {time.monotonic() - started:.0f} s: {path}" +
        machine_speed.slow_note(watch.slowdown_since(mark)))
    return overheads


def measured_profiles(jobs, cluster: Cluster, config: ActivateConfig, overheads, out, watch) -> Dict[str, Any]:
    """With "profile": "measure": {bundle: Profile} of every graph a simulated entry runs
    (measure_graph_profile into <output_dir>/profiles/<stem>.profile.json, at the largest batch
    it runs with), before any server starts. Empty otherwise. The printed line says when the
    machine ran slow while a profile was measured (`watch`, a SpeedWatch)."""
    if config.profile != "measure":
        return {}
    batches: Dict[str, int] = {}
    for job in jobs:
        if job.get("error") is None and not _is_horovod(job):
            batch = job["batch"] if job["kind"] == "baseline" else job["strategy"].global_batch_size
            batches[job["graph"]] = max(batch, batches.get(job["graph"], 0))
    folder = os.path.join(config.output_dir, "profiles")
    os.makedirs(folder, exist_ok=True)
    profiles = {}
    for graph, batch in batches.items():
        path = os.path.join(folder, os.path.splitext(os.path.basename(graph))[0] + ".profile.json")
        started, before = time.monotonic(), watch.probe()
        profiles[graph] = measure_graph_profile(graph, batch, cluster, path, overheads)
        slow = watch.slowdown(before, watch.probe())
        print(f"profiled {os.path.basename(graph)} on {len(profiles[graph].kinds)} kinds in "
              f"{time.monotonic() - started:.1f} s: {path}" + machine_speed.slow_note(slow, "its costs"),
              file=out, flush=True)
    return profiles


def _run_one(job, cluster: Cluster, lc, config: ActivateConfig, overheads, watch) -> Dict[str, Any]:
    """One round of one entry: its step times, simulated time, timeline path and the machine
    speed probes just before and after its timed steps (`watch`, a SpeedWatch)."""
    from tfplace.baselines.problem import with_overheads
    from tfplace.profiling.device_model import cluster_profile
    from tfplace.simulator import simulate
    from tfplace.ir.loader import load_op_graph
    from tfplace.rewrite.graph_rewrite import rewrite_step
    from tfplace.runtime.step_runner import StepRunner, random_feed
    graph = load_op_graph(job["graph"])
    if _is_horovod(job):
        from tfplace.baselines.horovod_runner import even_batches, proportional_batches, run_horovod
        n, b = cluster.num_devices, job["batch"]
        per = even_batches(b, n) if job["baseline"] == "horovod_even" else \
            proportional_batches(b, _speed_weights(cluster))
        emulation = [d.emulation for d in cluster.devices] if cluster.has_emulation else None
        from tfplace.emulation.links import checked_layout
        before = watch.probe()  # the ranks start inside run_horovod: its window holds their start-up too
        res = run_horovod(job["graph"], per, steps=config.steps, warmup_steps=config.warmup_steps,
                          emulation_per_rank=emulation, source=config.cluster, device_names=cluster.device_names,
                          host_links=checked_layout(cluster, per="device"))
        return {"step_times_s": list(res.report.step_times_s), "simulated_s": None, "simulated_oom": None,
                "timeline": "", "probes_s": [before, watch.probe()]}
    profile = job.get("profile") or cluster_profile(graph, cluster)  # measured_profiles' when measured
    strategy, grouping = job.get("strategy"), job.get("grouping")  # check_groups' or a plan's (real_check)
    if strategy is None:
        strategy, grouping = baseline_plan(job["baseline"], graph, cluster, profile, job["batch"],
                                           overheads=overheads)
    step = rewrite_step(graph, strategy, cluster, profile=profile, grouping=grouping)
    # the PlacedGraph the rewrite emitted, with what the runtime adds when the config gives it
    report = simulate(with_overheads(step.placed, cluster, overheads), cluster)
    feed = random_feed(step.inputs, strategy.global_batch_size, 0)
    with StepRunner(lc, step) as runner:
        runner.initialize()
        runner.run_steps(config.warmup_steps, feed)
        before = watch.probe()
        times = runner.run_steps(config.steps, feed)
        after = watch.probe()
        trace = runner.traced_step(feed) if config.trace else ""
    path = ""
    if config.trace:
        path = os.path.join(config.output_dir, job["name"] + TIMELINE)
        atomic_write(path, lambda f: f.write(trace))
    return {"step_times_s": times, "simulated_s": report.iteration_time_s, "simulated_oom": report.oom,
            "timeline": path, "probes_s": [before, after]}


def run(config_path: str, out=None) -> List[Dict[str, Any]]:
    """Runs every entry of the config, printing to `out` (standard output by default); returns
    (and writes) the result rows."""
    out = out or sys.stdout  # at call time: a stream bound when the module loaded may be closed since
    from tfplace.graph_defs.export import resolve_options
    from tfplace.runtime.local_cluster import LocalCluster
    config = load_activate_config(config_path, check_model=resolve_options)  # every entry: before any work
    common.check_outputs_in(config.output_dir, ["results.json", PREVIOUS_RESULTS, ".tfplace.lock"] +
                            ([OVERHEADS_FILE] if config.overheads == MEASURE else []) +
                            _rotated_timelines(config.output_dir), config_path, "output_dir")  # before any work
    cluster = load_cluster(config.cluster)
    measure_overheads = config.overheads == MEASURE
    # before any work: its errors name the file
    overheads = None if measure_overheads else common.load_overheads_arg(config.overheads)
    note = common.overheads_note(cluster, config.cluster, config.overheads, give='"overheads": "{}" in the config',
                                 fix='write "overheads": "measure" in the config to measure them at the start of the '
                                     'run')
    # loopback hosts, cores and quotas are checked here, before any export or server
    LocalCluster.for_cluster(cluster)
    if measure_overheads:
        check_measurable(cluster, config.cluster, config.source, "overheads", 'leave "overheads" out')
    jobs = _jobs(config)  # exports; its bad input, and check_groups', before the output folder or any server
    check_groups(jobs, cluster)
    if config.trace:
        common.check_outputs_in(config.output_dir, [j["name"] + TIMELINE for j in jobs], config_path, "output_dir")
    os.makedirs(config.output_dir, exist_ok=True)
    results_path = os.path.join(config.output_dir, "results.json")
    watch = machine_speed.SpeedWatch(machine_speed.cores_of(cluster))
    if note:
        print(note, file=out, flush=True)
    with common.OutputLock(config.output_dir, config_path, "output_dir"):  # one run per folder
        watch.calibrate()
        _start_results(results_path, config_path, config, watch)
        if measure_overheads:
            overheads = measure_cluster_overheads(cluster, config.cluster,
                                                  os.path.join(config.output_dir, OVERHEADS_FILE),
                                                  f"activate ({config.source})", watch, out)
        profiles = measured_profiles(jobs, cluster, config, overheads, out, watch)
        for job in jobs:
            job["profile"] = profiles.get(job.get("graph"))
        rows = run_rounds(jobs, cluster, config, overheads, watch, out,
                          after_entry=lambda rows: _write_results(results_path, config_path, config, rows, False,
                                                                  watch))  # what ran survives an interrupt
        print_table(rows, out)
        for line in verdict_lines(rows):
            print(line, file=out)
        print_machine_note(rows, out)
        # after the run: the quiet speed is then each core's fastest probe of every round, not of a
        # first moment that may have fallen in a slow phase
        mismatch = None if measure_overheads else common.overheads_machine_note(
            cluster, config.cluster, overheads, config.overheads, watch=watch, fix=MEASURE_FIX)
        if mismatch:
            print(mismatch, file=out, flush=True)
        _write_results(results_path, config_path, config, rows, True, watch)
    return rows


def run_rounds(jobs: List[Dict[str, Any]], cluster: Cluster, config: ActivateConfig, overheads, watch, out,
               after_entry: Optional[Callable[[List[Dict[str, Any]]], None]] = None) -> List[Dict[str, Any]]:
    """Runs every job (see _jobs) `config.rounds` times, round by round, each round on fresh servers
    of `cluster` (so that a drift of the machine touches every entry), and prints a line per entry
    and round. Returns one row per job: its rounds, median round and simulated / real ratio, settled
    against the quiet core speeds of the whole run (`watch`, a SpeedWatch already calibrated); a
    job that failed has its "error". `after_entry(rows)` runs after every entry."""
    rows: List[Dict[str, Any]] = [{"name": job["name"], "kind": job["kind"], "graph": job.get("graph"),
                                   "horovod": _is_horovod(job),
                                   "error": None, "rounds": []} for job in jobs]
    lc = None
    try:
        for r in range(config.rounds):
            if r and lc is not None:  # every round on fresh servers
                lc.close()
                lc = None
            for job, row in zip(jobs, rows):
                if row["error"] is not None:  # failed in an earlier round: reported then
                    continue
                if job.get("error") is not None:
                    row["error"] = str(job["error"])
                    print(f"{row['name']}: {row['error']}", file=out, flush=True)
                    continue
                try:
                    lc = _running_cluster(lc, cluster, out)
                    _add_round(row, _run_one(job, cluster, lc, config, overheads, watch), watch)
                except Exception as err:  # one bad entry must not stop the others
                    row["error"] = f"{type(err).__name__}: {err}"
                    if not isinstance(err, InputError):  # a bad input is its message; a failure, its trace
                        traceback.print_exc(file=sys.stderr)
                which = f" (round {r + 1} of {config.rounds})" if config.rounds > 1 else ""
                last = row["rounds"][-1] if row["rounds"] and row["error"] is None else None
                note = (f"; the machine ran {last['machine_slowdown']:.2f}x slower than its quiet speed"
                        if last is not None and last["disturbed"] else "")
                print(f"{row['name']}{which}: " + (row["error"] or f"{last['mean_s'] * 1e3:.2f} ± "
                                                   f"{last['std_s'] * 1e3:.2f} ms{note}"), file=out, flush=True)
                if after_entry is not None:
                    after_entry(rows)
    finally:
        if lc is not None:
            lc.close()
    for row in rows:  # judged again against the quiet speeds of the whole run
        if row["rounds"]:
            _settle(row, watch.reference_s)
    return rows


def _add_round(row: Dict[str, Any], result: Dict[str, Any], watch) -> None:
    """Adds one round's result to an entry's row (its machine slowdown judged by `watch` as known
    now) and settles the row's figures (_settle). simulated_s and simulated_oom (the simulator
    says the entry does not fit in device memory; None: not simulated) come from the first round
    (every round simulates the same PlacedGraph), and the timeline file holds the last round's
    traced step."""
    t = result["step_times_s"]
    probes = [{str(c): s for c, s in p.items()} for p in result["probes_s"]]
    row["rounds"].append({"step_times_s": t, "mean_s": statistics.fmean(t), "std_s": statistics.pstdev(t),
                          "probes_s": probes})
    if "simulated_s" not in row:
        row["simulated_s"], row["timeline"] = result["simulated_s"], result["timeline"]
        row["simulated_oom"] = result.get("simulated_oom")
    _settle(row, watch.reference_s)


def _settle(row: Dict[str, Any], reference_s: Dict[int, float]) -> None:
    """Marks each round of `row` disturbed or not against the cores' quiet seconds `reference_s`
    (machine_speed.DISTURBED_SLOWDOWN), then sets the row's step_times_s, mean_s and std_s to
    those of its median round among the undisturbed ones (all rounds when every one was
    disturbed; by mean, the lower middle one of an even count), round_means_s to every round's
    mean, and the simulated / real ratio (None for an entry the simulator says runs out of memory:
    its time is no prediction of a run that fits)."""
    for rnd in row["rounds"]:
        probes = [{int(c): s for c, s in p.items()} for p in rnd["probes_s"]]
        rnd["machine_slowdown"] = machine_speed.slowdown_of(probes, reference_s)
        rnd["disturbed"] = rnd["machine_slowdown"] > machine_speed.DISTURBED_SLOWDOWN
    ordered = sorted(median_rounds(row["rounds"]), key=lambda x: x["mean_s"])
    median = ordered[(len(ordered) - 1) // 2]
    row["step_times_s"], row["mean_s"], row["std_s"] = median["step_times_s"], median["mean_s"], median["std_s"]
    row["round_means_s"] = [x["mean_s"] for x in row["rounds"]]
    row["disturbed_rounds"] = sum(x["disturbed"] for x in row["rounds"])
    row["ratio"] = row["simulated_s"] / row["mean_s"] if simulated_fits(row) else None


def median_rounds(rounds: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The rounds a row's median is taken over: the undisturbed ones, or all when every one was."""
    return [x for x in rounds if not x.get("disturbed")] or list(rounds)


def _running_cluster(lc, cluster: Cluster, out):
    """`lc` while all its tasks live; else a new LocalCluster of `cluster`, started (a worker that
    died in one entry, e.g. out of memory, must not fail every later entry)."""
    from tfplace.runtime.local_cluster import LocalCluster
    if lc is not None and lc.running and not lc.dead_tasks():
        return lc
    if lc is not None:
        lc.close()
        print("a worker died: restarting the cluster for the next entry", file=out, flush=True)
    return LocalCluster.for_cluster(cluster).start()


PREVIOUS_RESULTS = "results.previous.json"  # an earlier run's results.json, kept when a new run starts
TIMELINE, PREVIOUS_TIMELINE = ".timeline.json", ".timeline.previous.json"  # <entry>TIMELINE, and an earlier run's


def _start_results(path: str, config_path: str, config: ActivateConfig, watch) -> None:
    """Moves an earlier run's results.json aside (PREVIOUS_RESULTS) and, when there was one, its
    timelines (<entry>.timeline.json -> <entry>.timeline.previous.json, the moved results naming
    them), replacing the run before it's, and writes this run's results, empty and not complete: a run
    stopped before its first entry ends leaves no earlier run's results marked complete, nor its
    timelines, beside its own files."""
    folder = os.path.dirname(path)
    previous = os.path.join(folder, PREVIOUS_RESULTS)
    if not os.path.exists(path):  # no earlier run's results: no timelines of theirs to move either
        _write_results(path, config_path, config, [], False, watch)
        return
    os.replace(path, previous)
    older, moves = _timeline_rotation(folder)
    if older or moves:
        for name in older:  # the run before the earlier one: replaced, as its results are
            os.remove(os.path.join(folder, name))
        moved = {os.path.abspath(os.path.join(folder, old)): os.path.abspath(os.path.join(folder, new))
                 for old, new in moves.items()}
        for old, new in moved.items():
            os.replace(old, new)
        _rename_timelines(previous, moved)
    _write_results(path, config_path, config, [], False, watch)


def _timeline_rotation(folder: str) -> Tuple[List[str], Dict[str, str]]:
    """What _start_results does to the timelines in `folder`: (the run before the earlier one's
    <entry>.timeline.previous.json files, removed; the earlier run's <entry>.timeline.json ->
    <entry>.timeline.previous.json, moved)."""
    names = os.listdir(folder)
    return ([n for n in names if n.endswith(PREVIOUS_TIMELINE)],
            {n: n[:-len(TIMELINE)] + PREVIOUS_TIMELINE for n in names if n.endswith(TIMELINE)})


def _rotated_timelines(folder: str) -> List[str]:
    """The timeline files of `folder` that _start_results removes, moves or moves onto when an
    earlier run's results.json is there (each must turn out to be a file, checked before any work)."""
    if not os.path.isfile(os.path.join(folder, "results.json")):
        return []
    older, moves = _timeline_rotation(folder)
    return sorted(set(older) | set(moves) | set(moves.values()))


def _rename_timelines(results_path: str, moved: Dict[str, str]) -> None:
    """Points the rows of the results file `results_path` (if it is one) at their moved timelines
    (`moved`: old path -> new path); a file that does not read as results is left as it is."""
    try:
        with open(results_path, encoding="utf-8") as f:
            data = json.load(f)
        rows = data["results"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    for row in rows:
        if isinstance(row, dict) and isinstance(row.get("timeline"), str):
            row["timeline"] = moved.get(os.path.abspath(row["timeline"]), row["timeline"])
    atomic_write(results_path, lambda f: json.dump(data, f, indent=1))


def _write_results(path: str, config_path: str, config: ActivateConfig, rows, complete: bool, watch) -> None:
    """results.json, replaced atomically; `complete` is false while entries are still to run.
    `core_quiet_s`: each probed core's quiet seconds in this run (machine_speed), which tell how
    fast this machine was against another run's."""
    quiet = {str(c): s for c, s in sorted(watch.reference_s.items())}
    overheads = (os.path.abspath(os.path.join(config.output_dir, OVERHEADS_FILE)) if config.overheads == MEASURE
                 else config.overheads)
    # an interrupt while writing leaves the previous results.json, and no temporary file
    atomic_write(path, lambda f: json.dump({"config": os.path.abspath(config_path), "cluster": config.cluster,
                                            "complete": complete, "overheads": overheads, "core_quiet_s": quiet,
                                            "results": rows}, f, indent=1))


def simulated_fits(row: Dict[str, Any]) -> bool:
    """Whether a result row has a simulated time that predicts its run: simulated, and not out of
    memory in the simulator (such a row's time is left out of every simulated / real figure)."""
    return bool(row.get("simulated_s")) and not row.get("simulated_oom")


def print_table(rows, out=None) -> None:
    """The result table: an entry column as wide as its longest name, so the numbers line up. An
    entry the simulator says runs out of memory shows "OOM" before its simulated time, no ratio,
    and a note under the table."""
    w = max([40] + [len(r["name"]) for r in rows])
    print(f"{'entry':{w}s} {'measured ms':>16s} {'simulated ms':>13s} {'sim/real':>9s}", file=out)
    for r in rows:
        if r["error"]:
            print(f"{r['name']:{w}s} FAILED: {r['error'].splitlines()[0][:100]}", file=out)
            continue
        sim = f"{r['simulated_s'] * 1e3:13.2f}" if r.get("simulated_s") else f"{'-':>13s}"
        if r.get("simulated_s") and r.get("simulated_oom"):
            sim = f"{'OOM ' + format(r['simulated_s'] * 1e3, '.2f'):>13s}"
        ratio = f"{r['ratio']:9.3f}" if r.get("ratio") else f"{'-':>9s}"
        means = r.get("round_means_s") or []
        spread = f"  rounds {min(means) * 1e3:.2f}–{max(means) * 1e3:.2f}" if len(means) > 1 else ""
        slow = r.get("disturbed_rounds") or 0
        if slow:
            spread += (f"  ({slow} of {len(means)} rounds on a slowed machine" +
                       (", left out)" if slow < len(means) else ": none was quiet)"))
        print(f"{r['name']:{w}s} {r['mean_s'] * 1e3:8.2f} ± {r['std_s'] * 1e3:5.2f} {sim} {ratio}{spread}", file=out)
    oom = [r["name"] for r in rows if not r["error"] and r.get("simulated_oom")]
    if oom:
        print(f"OOM: the simulator says {', '.join(oom)} run{'s' if len(oom) == 1 else ''} out of device memory "
              "(the cluster file's memory_bytes): no sim/real for it, and it is left out of the simulator's ranking "
              "and range below", file=out)


def ran(row: Dict[str, Any]) -> bool:
    """Whether a result row ran: no error and at least one round."""
    return row.get("error") is None and bool(row.get("rounds"))


def verdict_lines(rows: List[Dict[str, Any]]) -> List[str]:
    """Per graph that ran two or more entries: a line naming the entry that ran fastest for real
    (median round) and whether the simulator ranked the same one first among the entries it
    simulates (Horovod rows are not simulated), and when not, how much slower its pick ran; then,
    indented, how the fastest other entry compares with the fastest Horovod row (when both ran)
    and how far the simulator was off on the entries it simulated (the rows' simulated / real
    ratios, as the table shows them: their range and median)."""
    by_graph: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        if ran(r) and r.get("graph"):
            by_graph.setdefault(r["graph"], []).append(r)
    lines = []
    for graph, entries in by_graph.items():
        if len(entries) < 2:
            continue
        best = min(entries, key=lambda r: r["mean_s"])
        stem = os.path.splitext(os.path.basename(graph))[0]
        line = f"{stem}: fastest for real {best['name']} ({best['mean_s'] * 1e3:.2f} ms)"
        simulated = [r for r in entries if simulated_fits(r)]
        if len(simulated) >= 2:
            pick = min(simulated, key=lambda r: r["simulated_s"])
            fastest_simulated = min(simulated, key=lambda r: r["mean_s"])
            if pick is fastest_simulated:
                line += f"; the simulator ranked {pick['name']} first of its {len(simulated)} entries too"
            elif same_time(pick['simulated_s'], fastest_simulated['simulated_s']):
                line += (f"; the simulator gave {pick['name']} and {fastest_simulated['name']} the same time, and "
                         f"{fastest_simulated['name']} ran {pick['mean_s'] / fastest_simulated['mean_s']:.2f}x faster"
                         + rounds_tie_note(fastest_simulated, pick))
            else:
                line += (f"; the simulator ranked {pick['name']} first of its {len(simulated)} entries, which ran "
                         f"{pick['mean_s'] / fastest_simulated['mean_s']:.2f}x slower than {fastest_simulated['name']}"
                         + rounds_tie_note(fastest_simulated, pick))
        lines.append(line)
        horovod = [r for r in entries if r.get("horovod")]
        ours = [r for r in entries if not r.get("horovod")]
        if horovod and ours:
            h, o = min(horovod, key=lambda r: r["mean_s"]), min(ours, key=lambda r: r["mean_s"])
            lines.append(f"  against Horovod: {o['name']} ran {_compared(h['mean_s'], o['mean_s'])} {h['name']}, "
                         f"the fastest Horovod row")
        if simulated:
            ratios = sorted(r["ratio"] for r in simulated)  # each row's own, as _settle sets it and the table shows
            spread = (f"{ratios[0]:.2f}-{ratios[-1]:.2f} (median {statistics.median(ratios):.2f})"
                      if len(ratios) > 1 else f"{ratios[0]:.2f}")
            lines.append(f"  simulated / real on its {len(ratios)} simulated "
                         f"entr{'ies' if len(ratios) > 1 else 'y'}: {spread}; 1 is exact")
    return lines


def round_means(row: Dict[str, Any], quiet_only: bool = False) -> List[float]:
    """A result row's round means (s), in round order: every round's, or with `quiet_only` those
    of the rounds the median was taken over (median_rounds); [mean_s] for a row without per-round
    means."""
    rounds = [x for x in row.get("rounds") or [] if isinstance(x, dict) and "mean_s" in x]
    if quiet_only and rounds:
        return [x["mean_s"] for x in median_rounds(rounds)]
    return row.get("round_means_s") or [row["mean_s"]]


def rounds_tie_note(faster: Dict[str, Any], slower: Dict[str, Any]) -> str:
    """"; their rounds overlap: ..." when a round of the row `slower` ran no slower than a round of
    the row `faster`, both among the rounds their medians were taken over (the gap between the
    medians is within this machine's round-to-round spread), else ""."""
    if min(round_means(slower, quiet_only=True)) <= max(round_means(faster, quiet_only=True)):
        return "; their rounds overlap: within this machine's spread they tie"
    return ""


def _compared(other_s: float, this_s: float) -> str:
    """"1.25x faster than" when `this_s` is the shorter time, "1.25x slower than" when the longer,
    "as fast as" when they round to equal."""
    if f"{other_s / this_s:.2f}" == "1.00":
        return "as fast as"
    return f"{other_s / this_s:.2f}x faster than" if this_s < other_s else f"{this_s / other_s:.2f}x slower than"


def print_machine_note(rows, out=None) -> None:
    """One line when some rounds ran while the machine itself was slow (machine_speed)."""
    rounds = [x for r in rows if not r["error"] for x in r["rounds"]]
    slow = [x["machine_slowdown"] for x in rounds if x["disturbed"]]
    if slow:
        print(f"The machine ran up to {max(slow):.2f}x slower than its quiet speed during {len(slow)} of "
              f"{len(rounds)} rounds (another load on this host, or a shared host): such rounds count only where "
              f"every round of the row was slow, and rows can move by as much between runs.", file=out)


POSITIONAL = ("CONFIG",)  # activate_config.txt (JSON), see examples/formats/README.md


def define_flags() -> None:
    """The command has no flags: its one argument is the config path."""


def main(argv) -> int:
    """Runs the config argv[1] (absl main); exit status 1 when an entry failed (the others ran)."""
    rows = run(argv[1])
    failed = [r["name"] for r in rows if r["error"]]
    if failed:
        print(f"error: {len(failed)} of {len(rows)} entries failed ({', '.join(failed)}); their errors are above "
              f"and in results.json", file=sys.stderr)
    return 1 if failed else 0


def run_command() -> None:
    """Entry point of `python activate.py CONFIG`: `app.run(main)` under tfplace.cli.common's contract."""
    common.run(main, define_flags, __doc__, positional=POSITIONAL, servers=True)


if __name__ == "__main__":
    run_command()
