"""The policy's weights in a JSON file, and the pre-trained policy that ships with the package.

    save_weights(learner, path, network_config, max_groups, provenance)   # tfplace.policy_weights
    learner, weights = load_weights(path)                                  # ready to plan
    learner, weights = load_pretrained()                                   # the shipped file

The file format and its checks: tfplace.formats.policy_weights. Loading also checks every
variable's name and shape against a freshly built network, so a file from another architecture
is one InputError, not silently wrong weights.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Optional

import numpy as np

from tfplace.formats.config import NetworkConfig, RLConfig
from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import write_json
from tfplace.formats.policy_weights import (FORMAT, PRETRAIN_COMMAND, VERSION, PolicyWeights,  # noqa: F401
                                           pretrained_path, read_weights)

PRETRAINED_PATH = pretrained_path()


def _observation_for_build():
    """A small zero observation (2 groups, 1 edge, 2 devices) that creates every variable of the
    network: no weight's shape depends on the graph or the cluster."""
    from tfplace.policy import features as F
    z = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
    return {"nodes": z(2, F.NODE_FEATURES), "edges": z(1, F.EDGE_FEATURES), "senders": np.array([0], np.int32),
            "receivers": np.array([1], np.int32), "devices": z(2, F.DEVICE_FEATURES),
            "pairs": z(2, 2, F.PAIR_FEATURES), "globals": z(F.GLOBAL_FEATURES)}


def new_learner(network: NetworkConfig, rl: RLConfig = RLConfig()):
    """A ReinforceLearner whose network and optimizer variables exist."""
    from tfplace.policy.actions import ActionLayout
    from tfplace.policy.agent import ReinforceLearner
    from tfplace.policy.network import PlacementNetwork
    learner = ReinforceLearner(PlacementNetwork(network, ActionLayout()), rl)
    learner.build(_observation_for_build())
    return learner


def variables_to_json(variables) -> list:
    """[{name, shape, values}] of TF variables, float32 values with 9 significant digits (they
    round-trip exactly)."""
    return [{"name": v.name, "shape": list(v.shape),
             "values": [float(f"{x:.9g}") for x in v.numpy().astype(np.float32).ravel()]} for v in variables]


def save_weights(learner, path: str, network: NetworkConfig, max_groups: int,
                 provenance: Optional[Dict[str, Any]] = None) -> None:
    """Writes the network's weights (atomically, through tfplace.formats.jsonio)."""
    variables = variables_to_json(learner.network.trainable_variables)
    write_json(path, {"format": FORMAT, "version": VERSION, "network": dataclasses.asdict(network),
                      "max_groups": int(max_groups), "provenance": provenance or {}, "variables": variables})


def assign_weights(learner, weights: PolicyWeights, variables: list) -> None:
    """Sets the learner's network to the file's values; names and shapes must match one for one."""
    own = learner.network.trainable_variables
    fix = "the file is from another network architecture: train it again with " + PRETRAIN_COMMAND
    if len(own) != len(variables):
        raise InputError(weights.path, "variables", f"has {len(variables)} variables, the network {len(own)}", fix)
    for i, (v, saved) in enumerate(zip(own, variables)):
        if saved.get("name") != v.name or list(saved["shape"]) != list(v.shape):
            raise InputError(weights.path, f"variables[{i}]",
                             f"is {saved.get('name')} {saved['shape']}, the network has {v.name} {list(v.shape)}", fix)
    for v, saved in zip(own, variables):
        v.assign(np.asarray(saved["values"], np.float32).reshape(v.shape))


def load_weights(path: str, rl: RLConfig = RLConfig()):
    """(learner with the file's weights, PolicyWeights)."""
    weights, variables = read_weights(path)
    learner = new_learner(weights.network, rl)
    assign_weights(learner, weights, variables)
    return learner, weights


def load_pretrained(rl: RLConfig = RLConfig()):
    """The policy shipped with the package (policy/pretrained/policy.json)."""
    if not os.path.exists(PRETRAINED_PATH):
        raise InputError(PRETRAINED_PATH, "", "the shipped pre-trained policy is missing",
                         f"reinstall tfplace, or make it with {PRETRAIN_COMMAND}")
    return load_weights(PRETRAINED_PATH, rl)
