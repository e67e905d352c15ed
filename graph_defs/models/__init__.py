"""Model zoo registry: one ModelSpec per exportable model name.

Each family module (keras_apps, resnet200, transformer, bert, xlnet, tiny) has
`build(cfg, inputs) -> Built`, which creates the input placeholders through `inputs`
(batch dimension None) and the forward pass plus per-example loss in the current default graph.
`_train.build_train_graph` adds the optimizer, `train_op`, `init` and `loss` around it.
"""

import dataclasses
import difflib
import importlib
from typing import Optional, Tuple


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Static description of a zoo model and its default sizes.

    kind: 'image' (images [N, S, S, 3] float32, pixels), 'sequence' (int32 token ids [N, L]),
      or 'vector' (float32 features [N, D]).
    published_params: (parameter count, relative tolerance) at the defaults, from the model's
      paper or reference implementation; export_test checks exported counts against it.
    min_image_size: smallest image side (pixels) the model's layers take (image models); the
      family module's build refuses smaller ones too, export.resolve_options before any work.
    max_seq_len: longest sequence (tokens) the model takes (None: no limit), e.g. BERT's 512
      learned positions.
    """

    name: str
    family: str
    kind: str
    default_batch: int
    image_size: Optional[int] = None
    seq_len: Optional[int] = None
    num_layers: Optional[int] = None
    num_classes: Optional[int] = None
    variants: Tuple[str, ...] = ()
    tiny: bool = False
    published_params: Optional[Tuple[int, float]] = None
    min_image_size: Optional[int] = None
    max_seq_len: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Resolved options one build uses (the batch size is deliberately absent: graphs are
    built with batch None and shaped afterwards)."""

    name: str
    image_size: Optional[int]
    seq_len: Optional[int]
    num_layers: Optional[int]
    num_classes: Optional[int]
    variant: Optional[str]


# min_image_size: the smallest side Keras applications accept with include_top=True and weights=None
# (keras_apps.MIN_IMAGE_SIZE), resnet200's five stride-2 stages, tiny_cnn's 3x3 convolutions (tiny.py).
_SPECS = [
    ModelSpec("vgg19", "keras_apps", "image", 64, image_size=224, num_classes=1000, min_image_size=32,
              published_params=(143_667_240, 0.001)),
    ModelSpec("resnet50", "keras_apps", "image", 64, image_size=224, num_classes=1000, min_image_size=32,
              published_params=(25_636_712, 0.001)),
    ModelSpec("inception_v3", "keras_apps", "image", 64, image_size=299, num_classes=1000, min_image_size=75,
              published_params=(23_851_784, 0.001)),
    ModelSpec("mobilenet_v2", "keras_apps", "image", 64, image_size=224, num_classes=1000, min_image_size=32,
              published_params=(3_538_984, 0.001)),
    # NASNet-A Mobile (4 @ 1056) by default; variant 'large' is NASNet-A Large (6 @ 4032), 331 px.
    ModelSpec("nasnet", "keras_apps", "image", 64, image_size=224, num_classes=1000, min_image_size=32,
              variants=("mobile", "large"), published_params=(5_326_716, 0.001)),
    # ResNet-200 v2 (He et al. 2016, "Identity Mappings"): 64.7M parameters.
    ModelSpec("resnet200", "resnet200", "image", 64, image_size=224, num_classes=1000, min_image_size=32,
              published_params=(64_700_000, 0.03)),
    # Transformer base: the paper's 65M used a shared 37k vocabulary; ours is 32k (60.5M).
    ModelSpec("transformer", "transformer", "sequence", 32, seq_len=128, num_layers=6,
              published_params=(65_000_000, 0.10)),
    ModelSpec("bert_large", "bert", "sequence", 16, seq_len=128, num_layers=24, max_seq_len=512,
              published_params=(335_000_000, 0.05)),
    ModelSpec("bert_base", "bert", "sequence", 16, seq_len=128, num_layers=12, max_seq_len=512,
              published_params=(110_000_000, 0.05)),
    # XLNet-Large: the paper gives no count ("same size as BERT-Large"); the reference config
    # (32k vocabulary, untied relative biases) has ~360M.
    ModelSpec("xlnet_large", "xlnet", "sequence", 16, seq_len=128, num_layers=24,
              published_params=(360_000_000, 0.05)),
    ModelSpec("tiny_mlp", "tiny", "vector", 16, num_classes=10, tiny=True),
    ModelSpec("tiny_cnn", "tiny", "image", 16, image_size=16, num_classes=10, tiny=True,
              min_image_size=4),
    ModelSpec("tiny_transformer", "transformer", "sequence", 16, seq_len=8, num_layers=2,
              tiny=True),
]
MODELS = {s.name: s for s in _SPECS}


# Variants whose natural input size differs from the spec's default.
_VARIANT_IMAGE_SIZE = {("nasnet", "large"): 331}


def default_image_size(spec, variant=None):
    """Default image side (pixels) of `spec` for `variant` (None = the default variant)."""
    return _VARIANT_IMAGE_SIZE.get((spec.name, variant), spec.image_size)


def unknown_model(name):
    """What is wrong with the model name `name`: "unknown model 'x'", the closest known name
    when one is close, and every known name."""
    close = difflib.get_close_matches(str(name), sorted(MODELS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown model {name!r}{hint}; choose one of {sorted(MODELS)}"


def get_spec(name):
    """Returns the ModelSpec for `name`; ValueError listing the known names (and the closest
    one) otherwise."""
    if not isinstance(name, str) or name not in MODELS:
        raise ValueError(unknown_model(name))
    return MODELS[name]


def model_names(tiny_only=False):
    """Zoo model names in registry order (tiny ones last)."""
    return [s.name for s in _SPECS if s.tiny or not tiny_only]


def family_module(spec):
    """Imports the family module lazily, so listing models needs no TensorFlow."""
    return importlib.import_module("." + spec.family, __name__)
