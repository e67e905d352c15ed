"""Trains the placement policy: `python -m tfplace.train --config config.json [--output_dir DIR]`.

Thin binary over tfplace.policy.train_lib (flags live only here). Re-running with the same
output_dir resumes from its last checkpoint.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads (binary only)

from absl import flags  # noqa: E402

from tfplace.cli import common  # noqa: E402

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
    from tfplace.graph_defs.export import bundle_for_entry
    from tfplace.policy import train_lib
    config = load_train_config(FLAGS.config)
    if FLAGS.output_dir:
        config = dataclasses.replace(config, output_dir=os.path.abspath(FLAGS.output_dir))
    else:
        common.check_output_dir(config.output_dir, FLAGS.config, "output_dir")
    log = train_lib.file_logger(config.output_dir)
    summary = train_lib.train(config, log, FLAGS.progress, resolve_bundle=bundle_for_entry)
    for label, t in summary["tasks"].items():
        log(f"{label}: best {t['best_time_s'] * 1e3:.3f} ms ({t['best_source']}); best baseline "
            f"{t['best_baseline']} {t['best_baseline_time_s'] * 1e3:.3f} ms; speed-up x{t['speedup_over_best_baseline']:.3f}")
    if not train_lib.rewrite_available():
        log("best_graph.pb not written: the rewrite pass (tfplace.rewrite.graph_rewrite) does not exist yet")
    else:
        log("best_graph.pb: see rewritten_graph in each best_time.log")
    log(f"{summary['steps']} steps in {summary['elapsed_s']:.0f} s; outputs in {config.output_dir}")
    return 0


def run() -> None:
    """Entry point for `python -m`: `app.run(main)` under tfplace.cli.common's contract."""
    common.run(main, define_flags, __doc__)


if __name__ == "__main__":
    run()
