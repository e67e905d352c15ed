"""Image classifiers from tf.keras.applications (weights=None: random init, nothing downloaded).

Inputs:
  images  float32 [N, S, S, 3]  pixels (any scale; the graph has no preprocessing)
  labels  int32   [N]           class ids in [0, num_classes)
Loss: sparse softmax cross entropy on the logits (classifier_activation=None), per example [N].
"""

import tensorflow as tf

from ._train import Built, keras_updates

_APPS = {
    "vgg19": lambda **kw: tf.keras.applications.VGG19(**kw),
    "resnet50": lambda **kw: tf.keras.applications.ResNet50(**kw),
    "inception_v3": lambda **kw: tf.keras.applications.InceptionV3(**kw),
    "mobilenet_v2": lambda **kw: tf.keras.applications.MobileNetV2(**kw),
    "nasnet/mobile": lambda **kw: tf.keras.applications.NASNetMobile(**kw),
    "nasnet/large": lambda **kw: tf.keras.applications.NASNetLarge(**kw),
}

# Smallest image side each application accepts with include_top=True and weights=None.
MIN_IMAGE_SIZE = {"vgg19": 32, "resnet50": 32, "inception_v3": 75, "mobilenet_v2": 32,
                  "nasnet": 32}


def classify_images(cfg, inputs, make_model):
    """Shared wiring: placeholders -> Keras model (on the placeholder) -> per-example loss."""
    s = cfg.image_size
    images = inputs.add("images", tf.float32, [None, s, s, 3])
    labels = inputs.add("labels", tf.int32, [None], max_value=cfg.num_classes)
    # input_tensor wires the model straight onto our placeholder. Building a Model on its own
    # Input and calling it on `images` would leave a second, dead copy of the forward graph.
    model = make_model(images)
    logits = model.output
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return Built(per_example, keras_updates(model))


def build(cfg, inputs):
    key = cfg.name if cfg.name != "nasnet" else f"nasnet/{cfg.variant}"
    if cfg.image_size < MIN_IMAGE_SIZE[cfg.name]:
        raise ValueError(f"{cfg.name}: image_size must be >= {MIN_IMAGE_SIZE[cfg.name]}, "
                         f"got {cfg.image_size}")
    app = _APPS[key]

    def make_model(images):
        s = cfg.image_size
        # Wrap the placeholder as a Keras tensor first: MobileNetV2 rejects a plain tensor.
        keras_images = tf.keras.Input(tensor=images, name="input")
        return app(weights=None, include_top=True, input_tensor=keras_images,
                   input_shape=(s, s, 3),
                   classes=cfg.num_classes, classifier_activation=None)

    return classify_images(cfg, inputs, make_model)
