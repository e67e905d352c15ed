"""tfplace model zoo: exports TF1 training-step graphs as tfplace graph bundles.

Public API:
  export_model(name, batch_size, *, image_size, seq_len, num_layers, optimizer, learning_rate,
               out_dir, ...) -> path of the bundle's .json
  ensure_bundle(name, **opts) -> .json path: a shipped bundle (graph_defs/zoo/), else exported into
    export_dir() only if missing (graph_defs/zoo/ in a checkout, ~/.cache/tfplace/zoo installed)
  read_bundle(meta_path) -> (GraphDef, meta dict);  write_bundle(out_dir, stem, graph_def, meta)
  with_batch_size(graph_def, meta['inputs'], batch) -> GraphDef re-shaped to another batch
  model_names(tiny_only=False), MODELS (name -> ModelSpec), ZOO_DIR, MANIFEST_PATH
  export_keras(model_fn, loss, optimizer, *, batch_size, input_shapes | input_specs, out_dir, name)
    -> .json path of your own Keras model's training step (keras_export.py; docs/your_own_model.md)
  import_step(path, *, train_ops, loss, loss_reduction, inputs, batch_size) -> .json path of a
    bare training step (.pb/.pbtxt/.meta), roles inferred (user_step.py)
Importing this package does not import TensorFlow; exporting and read_bundle do.
"""

from .bundle import read_bundle, read_meta, with_batch_size, write_bundle
from .models import MODELS, get_spec, model_names

_EXPORT_NAMES = ("MANIFEST_PATH", "ZOO_DIR", "bundle_for_entry", "bundle_stem", "ensure_bundle", "export_all",
                 "export_dir", "export_model", "resolve_options")


def __getattr__(name):
    # Lazy, so `python -m tfplace.cli.export` does not find its module pre-imported.
    if name in _EXPORT_NAMES:
        from . import export
        return getattr(export, name)
    if name == "export_keras":
        from .keras_export import export_keras
        return export_keras
    if name == "export_train_step":
        from .keras_export import export_train_step
        return export_train_step
    if name == "import_step":
        from .user_step import import_step
        return import_step
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["read_bundle", "read_meta", "with_batch_size", "write_bundle", "MODELS", "get_spec",
           "model_names", "export_keras", "export_train_step", "import_step", *_EXPORT_NAMES]
