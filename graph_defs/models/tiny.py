"""Tiny test models: run a real training step on CPU in well under a second.

tiny_mlp:  features float32 [N, 32] -> Dense 64 relu -> Dense 64 relu -> Dense C (logits).
tiny_cnn:  images float32 [N, S, S, 3] (S=16) -> Conv 3x3x8 + BN + relu
           -> Conv 3x3x16 stride 2 + BN + relu -> Flatten -> Dense C (logits).
Both: labels int32 [N] in [0, C), C = num_classes (10); per-example sparse softmax CE.
"""

import tensorflow as tf

from ._train import Built, keras_updates

layers = tf.keras.layers

MLP_FEATURES = 32
MLP_HIDDEN = (64, 64)


def _classifier(inputs, x_input, logits_fn, num_classes):
    labels = inputs.add("labels", tf.int32, [None], max_value=num_classes)
    x = layers.Input(tensor=x_input, name="input")
    model = tf.keras.Model(x, logits_fn(x), name="tiny")
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                 logits=model.output)
    return Built(per_example, keras_updates(model))


def _mlp(cfg, inputs):
    features = inputs.add("features", tf.float32, [None, MLP_FEATURES])

    def logits_fn(x):
        for i, width in enumerate(MLP_HIDDEN):
            x = layers.Dense(width, activation="relu", name=f"dense_{i}")(x)
        return layers.Dense(cfg.num_classes, name="logits")(x)

    return _classifier(inputs, features, logits_fn, cfg.num_classes)


def _cnn(cfg, inputs):
    s = cfg.image_size
    if s < 4:
        raise ValueError(f"tiny_cnn: image_size must be >= 4, got {s}")
    images = inputs.add("images", tf.float32, [None, s, s, 3])

    def logits_fn(x):
        for i, (filters, stride) in enumerate(((8, 1), (16, 2))):
            x = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False,
                              name=f"conv_{i}")(x)
            x = layers.BatchNormalization(name=f"bn_{i}")(x)
            x = layers.ReLU(name=f"relu_{i}")(x)
        x = layers.Flatten(name="flatten")(x)
        return layers.Dense(cfg.num_classes, name="logits")(x)

    return _classifier(inputs, images, logits_fn, cfg.num_classes)


def build(cfg, inputs):
    return {"tiny_mlp": _mlp, "tiny_cnn": _cnn}[cfg.name](cfg, inputs)
