"""Exports zoo models as tfplace graph bundles: `python -m tfplace.cli.export`.

  python -m tfplace.cli.export --model resnet50 --batch-size 64 --optimizer momentum
  python -m tfplace.cli.export --all [--manifest]   # every model at its defaults, cached
  python -m tfplace.cli.export --tiny               # only the tiny test models

The library (bundle names, export, manifest) is tfplace.graph_defs.export. The command line keeps
tfplace's contract (tfplace.cli.common): --help exits 0, a usage error or bad option exits 2 with
one line, --out is checked before anything is exported.
"""

import os
import sys
import time

from absl import flags

import tfplace.cli.common as common
from tfplace.graph_defs import bundle, models
from tfplace.graph_defs.export import DEFAULT_LR, ZOO_DIR, _human_bytes, export_all, export_model, write_manifest


def define_flags():
    """The command's flags (called when it runs; see tfplace.cli.common)."""
    flags.DEFINE_enum("model", None, models.model_names(), "model to export")
    flags.DEFINE_boolean("all", False, "every zoo model at its defaults")
    flags.DEFINE_boolean("tiny", False, "only the tiny test models")
    flags.register_multi_flags_validator(
        ["model", "all", "tiny"], lambda v: (v["model"] is not None) + v["all"] + v["tiny"] == 1,
        message="give exactly one of --model, --all, --tiny")
    flags.DEFINE_integer("batch-size", None, "global batch size (default: per model)", lower_bound=1)
    flags.DEFINE_integer("image-size", None, "image side in pixels (image models)", lower_bound=1)
    flags.DEFINE_integer("seq-len", None, "sequence length in tokens (sequence models)", lower_bound=1)
    flags.DEFINE_integer("num-layers", None, "layers per stack (sequence models)", lower_bound=1)
    flags.DEFINE_integer("num-classes", None, "classifier classes (image models)", lower_bound=1)
    flags.DEFINE_string("variant", None, "model variant, e.g. nasnet: mobile|large")
    flags.DEFINE_enum("optimizer", "sgd", list(bundle.OPTIMIZERS), "training optimizer")
    flags.DEFINE_float("learning-rate", DEFAULT_LR, "learning rate", lower_bound=0.0)
    flags.DEFINE_integer("seed", 0, "graph-level random seed")
    flags.DEFINE_string("out", ZOO_DIR, "output folder (default: the zoo cache)")
    flags.DEFINE_boolean("force", False, "re-export even if the bundle is current")
    flags.DEFINE_boolean("manifest", False, "with --all/--tiny: rewrite manifest.json and zoo/.gitignore")
    common.output_dir_flag("out")


def main(argv):
    """Exports as the parsed flags say (absl main: argv holds the program name only)."""
    del argv
    args = common.args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not args.model:
        given = [f for f in ("batch_size", "image_size", "seq_len", "num_layers",
                             "num_classes", "variant") if getattr(args, f) is not None]
        if given or args.optimizer != "sgd" or args.learning_rate != DEFAULT_LR or args.seed:
            print(f"error: --all/--tiny export the default sizes; drop {given or 'the options'}"
                  " or use --model", file=sys.stderr)
            return 2
    elif args.manifest:
        print("error: --manifest goes with --all or --tiny", file=sys.stderr)
        return 2
    try:
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")  # Keras' graph-mode deprecation notices are noise here
        if args.model:
            start = time.time()
            path = export_model(
                args.model, args.batch_size, image_size=args.image_size, seq_len=args.seq_len,
                num_layers=args.num_layers, num_classes=args.num_classes, variant=args.variant,
                optimizer=args.optimizer, learning_rate=args.learning_rate, seed=args.seed,
                out_dir=args.out)
            meta = bundle.read_meta(path)
            print(f"{os.path.basename(path)}: {time.time() - start:.1f}s  "
                  f"ops={meta['op_count']} params={meta['param_count']} "
                  f"{_human_bytes(meta['graph_bytes'])} -> {path}")
            return 0
        names = models.model_names(tiny_only=args.tiny)
        paths = export_all(names, out_dir=args.out, force=args.force)
        if args.manifest:
            print(f"wrote {write_manifest(paths, zoo_dir=args.out)}")
        return 0
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run() -> None:
    """Entry point for `python -m`."""
    common.run(main, define_flags, __doc__)


if __name__ == "__main__":
    run()
