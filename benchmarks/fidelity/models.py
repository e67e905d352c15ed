"""The models the fidelity bench runs and the strategies it times: zoo models at small sizes
(bundles exported on first use), the registry's baselines, random valid strategies."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# zoo models and the sizes they run at; bundles are exported on first use (graph_defs.export)
MODELS = {"tiny_mlp": {"batch_size": 48}, "tiny_cnn": {"batch_size": 48, "image_size": 16},
          "tiny_transformer": {"batch_size": 16, "seq_len": 8, "num_layers": 2},
          "resnet50": {"batch_size": 8, "image_size": 32}}
BASELINES = ("single", "dp_even_allreduce", "dp_even_ps", "dp_proportional_allreduce", "dp_proportional_ps",
             "model_parallel_round_robin", "model_parallel_contiguous", "heft", "pipeline")
MAX_GROUPS = 8


def bundle_path(model: str) -> str:
    """The model's bundle (<stem>.json) relative to the repository, exported if missing."""
    from tfplace.graph_defs.export import ensure_bundle
    return os.path.relpath(ensure_bundle(model, **MODELS[model]), ROOT)


def random_strategy(rng, devices, group_names, batch):
    """Random uneven shares over random device subsets, 30% PS; no micro-batches or priorities."""
    from tfplace.testing import random_strategy as shared_random_strategy
    return shared_random_strategy(rng, group_names, devices, batch, micro_batch_probability=0.0,
                                  ps_probability=0.3, priority_probability=0.0)
