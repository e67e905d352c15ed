"""Trains the placement policy: `python -m tfplace.train --config config.json [--output_dir DIR]`.

Thin binary over tfplace.policy.train_lib (flags live only here). Re-running with the same
output_dir resumes from its last usable checkpoint (the budget and checkpoint period may change;
anything else that changes the problem is refused). The run holds output_dir's lock
(tfplace.cli.common.OutputLock) throughout, so a second run on the same folder stops at once.
Progress and notes go to stderr, the results (a line per task, where the outputs are) to stdout;
both to output_dir/train.log.

Exit status: 0 done; 1 the run failed: no strategy found for some task fits in memory (unless the
config sets "accept_infeasible": true; the summary says INFEASIBLE either way); 2 bad input,
including a config that differs from the run output_dir holds, no usable checkpoint in it, or
an output_dir in use by another run;
128 + the signal number (143 SIGTERM, 130 Ctrl-C) when stopped by a signal, after checkpointing
the last whole step (a second signal stops at once, keeping the checkpoint before).
"""

from __future__ import annotations

import os
import shutil
import signal
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads (binary only)

from absl import flags  # noqa: E402

from tfplace.cli import common  # noqa: E402
from tfplace.formats.errors import InputError  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags (called when it runs; see tfplace.cli.common)."""
    flags.DEFINE_string("config", None, "train config JSON (format tfplace.train_config)", required=True)
    flags.DEFINE_string("output_dir", None, "overrides the config's output_dir")
    flags.DEFINE_boolean("progress", True, "show the progress bar on stderr")
    common.output_dir_flag("output_dir")


def main(argv) -> int:
    """Trains as the parsed flags say (absl main: argv holds the program name only); bad input
    (InputError) becomes one line and exit status 2 in tfplace.cli.common."""
    del argv
    import dataclasses

    from tfplace.formats.config import load_train_config
    from tfplace.graph_defs.export import resolve_options
    config = load_train_config(FLAGS.config, check_model=resolve_options)  # zoo names and options: before any work
    if FLAGS.output_dir:
        config = dataclasses.replace(config, output_dir=os.path.abspath(FLAGS.output_dir))
    else:
        common.check_output_dir(config.output_dir, FLAGS.config, "output_dir")
    from tfplace.formats.cluster import load_cluster
    from tfplace.profiling.device_model import check_known_kinds
    for i, (path, overheads) in enumerate(zip(config.clusters, config.overheads or [None] * len(config.clusters))):
        cluster = load_cluster(path)
        if None in config.profiles:  # a graph without a profile file takes the device model's
            check_known_kinds(cluster)
        loaded = common.load_overheads_arg(overheads, cluster, config.source or FLAGS.config, f"overheads[{i}]",
                                           f"set overheads[{i}] to null: clusters[{i}] has GPUs, which take none")
        common.print_overheads_notes(cluster, path, loaded, overheads,
                                     give=f'"{{}}" as "overheads"[{i}] in the config')
    from tfplace.graph_defs.export import bundle_for_entry
    from tfplace.policy import train_lib
    bundles = train_lib.config_bundles(config, bundle_for_entry)  # exports: their bad input before any folder
    created = not os.path.isdir(config.output_dir)
    os.makedirs(config.output_dir, exist_ok=True)
    return in_output_dir(config.output_dir, created, FLAGS.config, lambda: _train(config, bundles))


def in_output_dir(output_dir: str, created: bool, config_path: str, work: Callable[[], int]) -> int:
    """work() with `output_dir` locked (one run per folder); bad input (InputError) before any
    checkpoint removes the folder when this run `created` it. Only a held lock makes the folder
    this run's: a refusal of the lock (another run holds it, and may have made the folder at the
    same moment) leaves it as it is."""
    with common.OutputLock(output_dir, config_path, "output_dir"):
        try:
            return work()
        except InputError:
            from tfplace.policy.train_state import state_files
            if created and not state_files(output_dir):  # bad input before any checkpoint: no folder left
                shutil.rmtree(output_dir, ignore_errors=True)
            raise


def _train(config, bundles) -> int:
    """Trains (or resumes) `config` on its graphs' `bundles` while its output_dir is locked;
    returns the exit status."""
    from tfplace.policy import train_lib
    log = train_lib.file_logger(config.output_dir)
    try:
        summary = train_lib.train(config, log, FLAGS.progress, bundles=bundles)
    except train_lib.TrainingInterrupted as stop:
        if not stop.saved:
            name = signal.Signals(stop.signum).name
            log(f"stopped at once by a second {name}; " +
                ("no checkpoint had been written before it" if stop.step is None else
                 f"the checkpoint of step {stop.step} stands"))
        return stop.exit_status
    say = train_lib.file_logger(config.output_dir, results=True)  # the results: stdout
    for label, t in summary["tasks"].items():
        say(_summary_line(label, t))
    say("each graph's folder holds best_strategy.json, best_graph.pb (the step rewritten for it; best_time.log's "
        "rewritten_graph says why when the rewrite refused it), best_trace.json, best_time.log and training.png")
    say(f"{summary['steps']} steps in {summary['elapsed_s']:.0f} s; outputs in {config.output_dir}")
    failed = train_lib.infeasible_tasks(summary)
    if failed and not config.accept_infeasible:
        log(f"error: the run failed: no strategy found for {', '.join(failed)} fits in device memory. Fix: use a "
            "cluster with more device memory or a smaller batch_size, or set \"accept_infeasible\": true in "
            f"{config.source or FLAGS.config} to keep an out-of-memory result")
        return common.FAILED_EXIT
    return 0


def _summary_line(label: str, t: dict) -> str:
    """One task's result; an out-of-memory best says so first, with no speed-up."""
    baseline = f"best baseline {t['best_baseline']} {t['best_baseline_time_s'] * 1e3:.3f} ms" + \
        ("" if t["best_baseline_feasible"] else " (out of memory)")
    if t["feasible"]:
        over = t.get("passed_over")
        passed = "" if over is None else \
            (f", the fastest that fits; {over['source']} ({over['time_s'] * 1e3:.3f} ms) ranks above it by "
             "penalised time but runs out of memory")
        return (f"{label}: best {t['best_time_s'] * 1e3:.3f} ms ({t['best_source']}{passed}); {baseline}; "
                f"speed-up x{t['speedup_over_best_baseline']:.3f}")
    from tfplace.formats.reports import SimReport
    over = SimReport.over_memory_text({d: (v["peak_memory_bytes"], v["memory_bytes"])
                                       for d, v in t["oom_devices"].items()})
    return (f"{label}: INFEASIBLE: the best strategy found ({t['best_source']}, {t['best_time_s'] * 1e3:.3f} ms) "
            f"runs out of memory ({over}); {baseline}; no speed-up")


def run() -> None:
    """Entry point for `python -m`: `app.run(main)` under tfplace.cli.common's contract, with
    TensorFlow's temporary files in a folder of this process (tfplace.runtime.tmpdir)."""
    common.run(main, define_flags, __doc__, private_tmp=True)


if __name__ == "__main__":
    run()
