"""Pre-trains the placement policy by expert iteration over the training distribution and writes
its weights: `python -m tfplace.pretrain --out policy/pretrained/policy.json --seed 0`.

The tasks are drawn from the split's training models and generated training clusters
(policy/split.json; the held-out models and cluster shapes are never used). Each round runs the
policy-guided search on every task for --search_seconds, encodes the best strategy found as the
task's target and trains the policy to imitate the targets; REINFORCE steps follow
(tfplace.policy.pretrain). Progress goes to stderr. Running the same command again resumes from
the folder --work_dir (default: OUT.work), where targets and per-round weights are kept; a work
folder resumes only the settings it was made with (more --rounds or other --rl_steps aside),
another is refused before any work. Ctrl-C (or SIGTERM) stops it when the search or training step
under way ends (a second one at once), with exit status 130 (143); the same command resumes.
The shipped policy is made by exactly the command above.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from tfplace.cli import common  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags (called when it runs; see tfplace.cli.common)."""
    from tfplace.policy.pretrain import PretrainConfig
    d = PretrainConfig(out="")
    flags.DEFINE_string("out", None, "where to write the policy weights (JSON, tfplace.policy_weights)", required=True)
    flags.DEFINE_integer("seed", d.seed, "seed of the task draw, the network's initial weights and the search",
                         lower_bound=0)
    flags.DEFINE_integer("num_tasks", d.num_tasks, "(model, cluster) training tasks", lower_bound=1)
    flags.DEFINE_integer("num_validation_tasks", d.num_validation_tasks,
                         "further tasks never imitated: imitation keeps the weights that plan them best", lower_bound=1)
    flags.DEFINE_integer("rounds", d.rounds, "expert-iteration rounds", lower_bound=1)
    flags.DEFINE_float("search_seconds", d.search_seconds, "search seconds per task and round", lower_bound=0.0)
    flags.DEFINE_integer("epochs", d.epochs, "imitation passes over the targets per round", lower_bound=1)
    flags.DEFINE_integer("rl_steps", d.rl_steps, "REINFORCE steps after the rounds", lower_bound=0)
    flags.DEFINE_integer("hidden_size", d.network.hidden_size, "network width", lower_bound=4)
    flags.DEFINE_integer("device_rank_feature", d.network.device_rank_feature,
                         "1: the network reads each device's rank among identical devices (so it can place "
                         "groups on different ones) and targets are relabelled to match; 0: it does not",
                         lower_bound=0, upper_bound=1)
    flags.DEFINE_string("split", None, "split file (default: policy/split.json)")
    flags.DEFINE_string("work_dir", None, "folder for targets and per-round weights (default: OUT.work)")
    common.output_file_flag("out")
    common.input_file_flag("split")


def main(argv) -> int:
    """Pre-trains as the parsed flags say; bad input is one line and exit status 2."""
    del argv
    import dataclasses
    import sys
    from tfplace.graph_defs.export import bundle_for_entry
    from tfplace.policy.pretrain import PretrainConfig, pretrain
    base = PretrainConfig(out="")
    config = PretrainConfig(out=os.path.abspath(FLAGS.out), seed=FLAGS.seed, num_tasks=FLAGS.num_tasks,
                            num_validation_tasks=FLAGS.num_validation_tasks,
                            rounds=FLAGS.rounds, search_seconds=FLAGS.search_seconds, epochs=FLAGS.epochs,
                            rl_steps=FLAGS.rl_steps, split_path=FLAGS.split, work_dir=FLAGS.work_dir,
                            network=dataclasses.replace(base.network, hidden_size=FLAGS.hidden_size,
                                                        device_rank_feature=FLAGS.device_rank_feature))
    os.makedirs(config.work, exist_ok=True)
    with common.OutputLock(config.work, FLAGS.work_dir or FLAGS.out, "work_dir" if FLAGS.work_dir else "out"):
        pretrain(config, lambda m: (sys.stderr.write(m + "\n"), sys.stderr.flush()), bundle_for_entry)
    return 0


def run() -> None:
    """Entry point for `python -m`: `app.run(main)` under tfplace.cli.common's contract, with
    TensorFlow's temporary files in a folder of this process (tfplace.runtime.tmpdir)."""
    common.run(main, define_flags, __doc__, private_tmp=True)


if __name__ == "__main__":
    run()
