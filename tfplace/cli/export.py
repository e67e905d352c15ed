"""Exports zoo models as tfplace graph bundles: `python -m tfplace.cli.export`.

  python -m tfplace.cli.export --model resnet50 --batch-size 64 --optimizer momentum
  python -m tfplace.cli.export --all [--manifest]   # every model at its defaults, cached
  python -m tfplace.cli.export --tiny               # only the tiny test models

The library (bundle names, export, manifest) is tfplace.graph_defs.export. The command line keeps
tfplace's contract (tfplace.cli.common): --help exits 0, a usage error or bad option (an unknown
model, with the closest name; an option the model does not take) exits 2 with one line, --out
(and with --manifest, manifest.json) is checked before anything is exported; a failed export exits 1.
"""

import math
import os
import sys
import time

from absl import flags

import tfplace.cli.common as common
from tfplace.graph_defs import bundle, models
from tfplace.formats.errors import InputError
from tfplace.graph_defs.export import (DEFAULT_LR, MANIFEST_PATH, ZOO_DIR, _human_bytes, export_all, export_dir,
                                       export_model, write_manifest)


def define_flags():
    """The command's flags (called when it runs; see tfplace.cli.common)."""
    flags.DEFINE_string("model", None, f"model to export, one of {', '.join(models.model_names())}")
    flags.DEFINE_boolean("all", False, "every zoo model at its defaults")
    flags.DEFINE_boolean("tiny", False, "only the tiny test models")
    flags.register_multi_flags_validator(
        ["model", "all", "tiny"], lambda v: (v["model"] is not None) + v["all"] + v["tiny"] == 1,
        message="give exactly one of --model, --all, --tiny")
    common.batch_size_flag("batch-size", None, "global batch size (default: per model)")
    flags.DEFINE_integer("image-size", None, "image side in pixels (image models)", lower_bound=1)
    flags.DEFINE_integer("seq-len", None, "sequence length in tokens (sequence models)", lower_bound=1)
    flags.DEFINE_integer("num-layers", None, "layers per stack (sequence models)", lower_bound=1)
    flags.DEFINE_integer("num-classes", None, "classifier classes (image models)", lower_bound=1)
    flags.DEFINE_string("variant", None, "model variant, e.g. nasnet: mobile|large")
    flags.DEFINE_enum("optimizer", "sgd", list(bundle.OPTIMIZERS), "training optimizer")
    flags.DEFINE_float("learning-rate", DEFAULT_LR, "learning rate (> 0)")
    flags.DEFINE_integer("seed", 0, "graph-level random seed", lower_bound=0)
    flags.DEFINE_string("out", None, "output folder (default: the zoo: graph_defs/zoo in a checkout, "
                        "${TFPLACE_CACHE:-~/.cache/tfplace}/zoo when installed)")
    flags.DEFINE_boolean("force", False, "with --all/--tiny: re-export bundles that are current too (--model always "
                         "exports)")
    flags.DEFINE_boolean("manifest", False, "with --all/--tiny: rewrite manifest.json and zoo/.gitignore")
    common.output_dir_flag("out")
    common.zoo_model_flag("model")
    flags.register_validator("learning-rate", lambda v: v > 0 and math.isfinite(v),
                             message="must be a positive number. Fix: give e.g. 0.01")


# resolve_options' option names -> this command's flags
_OPTION_FLAGS = {"batch_size": "--batch-size", "image_size": "--image-size", "seq_len": "--seq-len",
                 "num_layers": "--num-layers", "num_classes": "--num-classes", "variant": "--variant",
                 "optimizer": "--optimizer", "learning_rate": "--learning-rate", "seed": "--seed", "model": "--model"}


def main(argv):
    """Exports as the parsed flags say (absl main: argv holds the program name only)."""
    del argv
    args = common.args()
    if not args.model:
        defaults = dict(batch_size=None, image_size=None, seq_len=None, num_layers=None, num_classes=None,
                        variant=None, optimizer="sgd", learning_rate=DEFAULT_LR, seed=0)
        given = [_OPTION_FLAGS[k] for k, v in defaults.items() if getattr(args, k) != v]
        if given:
            raise InputError("arguments", "", f"--all/--tiny export the default sizes, but {', '.join(given)} "
                             f"{'was' if len(given) == 1 else 'were'} given", "drop them or export one model with --model")
    elif args.manifest:
        raise InputError("arguments", "", "--manifest goes with --all or --tiny", "drop --manifest or use --all")
    else:
        _check_options(args)
    out = export_dir() if args.out is None else args.out  # the zoo, outside an installed package
    if args.manifest:
        if args.out is not None and os.path.realpath(out) != os.path.realpath(ZOO_DIR):
            raise InputError("argument --manifest", "", f"describes the zoo in {ZOO_DIR}, but --out is {args.out}",
                             "drop --out to refresh the zoo and its manifest, or drop --manifest")
        if os.path.realpath(out) != os.path.realpath(ZOO_DIR):  # installed: the shipped zoo is not ours to rewrite
            raise InputError("argument --manifest", "", f"describes the zoo of a checkout ({ZOO_DIR}), but this "
                             f"tfplace is installed and exports into {out}", "drop --manifest")
        common.check_output_file(MANIFEST_PATH, "argument --manifest", "manifest.json")
    try:
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")  # Keras' graph-mode deprecation notices are noise here
        if args.model:
            start = time.time()
            path = export_model(
                args.model, args.batch_size, image_size=args.image_size, seq_len=args.seq_len,
                num_layers=args.num_layers, num_classes=args.num_classes, variant=args.variant,
                optimizer=args.optimizer, learning_rate=args.learning_rate, seed=args.seed,
                out_dir=out)
            meta = bundle.read_meta(path)
            print(f"{os.path.basename(path)}: {time.time() - start:.1f}s  "
                  f"ops={meta['op_count']} params={meta['param_count']} "
                  f"{_human_bytes(meta['graph_bytes'])} -> {path}")
            return 0
        names = models.model_names(tiny_only=args.tiny)
        paths = export_all(names, out_dir=args.out, force=args.force)
        if args.manifest:
            print(f"wrote {write_manifest(paths, zoo_dir=out)}")
        return 0
    except InputError:
        raise  # bad input: one line and exit status 2 (tfplace.cli.common)
    except ValueError as e:  # the export itself failed; the options were checked above
        print(f"error: export failed: {e}", file=sys.stderr)
        return 1


def _check_options(args) -> None:
    """Raises InputError naming the flag unless the model takes the options given (before TF loads)."""
    common.check_zoo_options(args.model, _OPTION_FLAGS, args.batch_size, image_size=args.image_size,
                             seq_len=args.seq_len, num_layers=args.num_layers, num_classes=args.num_classes,
                             variant=args.variant, optimizer=args.optimizer, learning_rate=args.learning_rate,
                             seed=args.seed)


def run() -> None:
    """Entry point for `python -m`."""
    common.run(main, define_flags, __doc__)


if __name__ == "__main__":
    run()
