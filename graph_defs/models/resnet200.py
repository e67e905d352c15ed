"""ResNet-200 v2 (He et al. 2016, "Identity Mappings in Deep Residual Networks").

Pre-activation bottleneck blocks (BN -> ReLU -> conv), stages of [3, 24, 36, 3] blocks with
64/128/256/512 bottleneck widths and 4x expansion; stride 2 in the first block of stages 2-4;
7x7/2 stem conv and 3x3/2 max pool; final BN-ReLU, global average pool, dense classifier.
~64.7M parameters at 1000 classes. Built with tf.keras layers (channels last).

Inputs: images float32 [N, S, S, 3] (pixels), labels int32 [N] in [0, num_classes).
Loss: sparse softmax cross entropy per example [N].
"""

import tensorflow as tf

from .keras_apps import classify_images

layers = tf.keras.layers

STAGES = ((64, 3), (128, 24), (256, 36), (512, 3))   # (bottleneck width, blocks)
EXPANSION = 4
BN_EPSILON = 1.001e-5


def _bn_relu(x, name):
    x = layers.BatchNormalization(epsilon=BN_EPSILON, name=name + "_bn")(x)
    return layers.Activation("relu", name=name + "_relu")(x)


def bottleneck(x, width, stride, name):
    """Pre-activation bottleneck: [N, H, W, C] -> [N, H/stride, W/stride, 4*width]."""
    pre = _bn_relu(x, name + "_preact")
    out_channels = width * EXPANSION
    if stride != 1 or x.shape[-1] != out_channels:
        # Projection shortcut from the pre-activated input, as in the v2 paper.
        shortcut = layers.Conv2D(out_channels, 1, strides=stride, use_bias=False,
                                 name=name + "_shortcut")(pre)
    else:
        shortcut = x
    y = layers.Conv2D(width, 1, use_bias=False, name=name + "_conv1")(pre)
    y = _bn_relu(y, name + "_conv1")
    y = layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False,
                      name=name + "_conv2")(y)
    y = _bn_relu(y, name + "_conv2")
    y = layers.Conv2D(out_channels, 1, use_bias=False, name=name + "_conv3")(y)
    return layers.Add(name=name + "_add")([shortcut, y])


def resnet_v2(images, num_classes, stages=STAGES):
    """Keras functional ResNet v2 on the `images` placeholder; returns the Model (logits)."""
    inp = layers.Input(tensor=images, name="input")
    x = layers.Conv2D(64, 7, strides=2, padding="same", use_bias=False, name="stem_conv")(inp)
    x = layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)
    for s, (width, blocks) in enumerate(stages):
        for b in range(blocks):
            stride = 2 if (b == 0 and s > 0) else 1
            x = bottleneck(x, width, stride, f"stage{s + 1}_block{b + 1}")
    x = _bn_relu(x, "post")
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    logits = layers.Dense(num_classes, name="logits")(x)
    return tf.keras.Model(inp, logits, name="resnet200_v2")


def build(cfg, inputs):
    if cfg.image_size < 32:
        raise ValueError(f"resnet200: image_size must be >= 32, got {cfg.image_size}")
    return classify_images(cfg, inputs, lambda images: resnet_v2(images, cfg.num_classes))
