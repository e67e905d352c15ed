"""Exports DenseNet-121 (not in the zoo) at 32x32x3, 10 classes, as a tfplace bundle (docs/your_own_model.md)."""
import sys

import tensorflow as tf

from tfplace.graph_defs import export_keras

out_dir = sys.argv[1] if len(sys.argv) > 1 else "my_models"
path = export_keras(
    lambda: tf.keras.applications.DenseNet121(weights=None, input_shape=(32, 32, 3), classes=10,
                                              classifier_activation=None),
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="momentum",
    batch_size=32, input_shapes=[(32, 32, 3)], out_dir=out_dir, name="densenet121")
print(path)
