"""The policy's weights as a JSON file, and the pre-trained policy that ships with the package.

    save_weights(learner, path, network_config, max_groups, provenance)   # tfplace.policy_weights
    learner, weights = load_weights(path)                                  # ready to plan
    learner, weights = load_pretrained()                                   # the shipped file

File format (JSON, never pickle; a checkpoint a person can read and diff):
  {"format": "tfplace.policy_weights", "version": 1,
   "network": {NetworkConfig fields}, "max_groups": int,
   "provenance": {how the weights were made: command, seed, split, metrics},
   "variables": [{"name": str, "shape": [int...], "values": [float...]}, ...]}
Variables are listed in the network's own order (PlacementNetwork.trainable_variables, which
its construction fixes); loading checks every name and shape against a freshly built network,
so a file from another architecture is one InputError, not silently wrong weights. Values are
float32 written with 9 significant digits, which read back bit-exactly.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Optional, Tuple

import numpy as np

from tfplace.formats.config import NetworkConfig, RLConfig
from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import FieldReader, write_json

FORMAT = "tfplace.policy_weights"
VERSION = 1
PRETRAINED_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pretrained", "policy.json")
PRETRAIN_COMMAND = "python -m tfplace.pretrain --out policy/pretrained/policy.json --seed 0"


@dataclasses.dataclass(frozen=True)
class PolicyWeights:
    """What a weights file says besides the values."""
    path: str
    network: NetworkConfig
    max_groups: int
    provenance: Dict[str, Any]


def _observation_for_build():
    """A small fixed observation that creates every variable of the network (the weights do not
    depend on the graph or cluster size)."""
    from tfplace.policy.testing_fixtures import tiny_task
    return tiny_task("mlp", "two").features.as_observation()


def new_learner(network: NetworkConfig, rl: RLConfig = RLConfig()):
    """A ReinforceLearner whose network and optimizer variables exist."""
    from tfplace.policy.actions import ActionLayout
    from tfplace.policy.agent import ReinforceLearner
    from tfplace.policy.network import PlacementNetwork
    learner = ReinforceLearner(PlacementNetwork(network, ActionLayout()), rl)
    learner.build(_observation_for_build())
    return learner


def save_weights(learner, path: str, network: NetworkConfig, max_groups: int,
                 provenance: Optional[Dict[str, Any]] = None) -> None:
    """Writes the network's weights (atomically, through tfplace.formats.jsonio)."""
    variables = [{"name": v.name, "shape": list(v.shape),
                  "values": [float(f"{x:.9g}") for x in v.numpy().astype(np.float32).ravel()]}
                 for v in learner.network.trainable_variables]
    write_json(path, {"format": FORMAT, "version": VERSION, "network": dataclasses.asdict(network),
                      "max_groups": int(max_groups), "provenance": provenance or {}, "variables": variables})


def _network_config(path: str, body: Dict[str, Any]) -> NetworkConfig:
    fields = {f.name for f in dataclasses.fields(NetworkConfig)}
    net = body.get("network")
    if not isinstance(net, dict) or set(net) - fields or not all(isinstance(v, int) and v > 0 for v in net.values()):
        raise InputError(path, "network", f"must be an object of positive integers with keys among {sorted(fields)}",
                         f"write the file with tfplace.policy.pretrained.save_weights ({PRETRAIN_COMMAND})")
    return NetworkConfig(**net)


def read_weights(path: str) -> Tuple[PolicyWeights, list]:
    """(what the file says, its variable list), checked for shape but not against a network."""
    fix = f"give a file written by save_weights, e.g. by {PRETRAIN_COMMAND}"
    body = FieldReader.from_file(path).data
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise InputError(path, "format", f"is not {FORMAT!r}", fix)
    if body.get("version") != VERSION:
        raise InputError(path, "version", f"is {body.get('version')!r}, this tfplace reads {VERSION}", fix)
    network = _network_config(path, body)
    max_groups = body.get("max_groups")
    if not isinstance(max_groups, int) or max_groups < 1:
        raise InputError(path, "max_groups", f"must be a positive integer, got {max_groups!r}", fix)
    variables = body.get("variables")
    if not isinstance(variables, list) or not variables:
        raise InputError(path, "variables", "must be a non-empty list", fix)
    for i, v in enumerate(variables):
        ok = isinstance(v, dict) and isinstance(v.get("shape"), list) and isinstance(v.get("values"), list)
        if not ok or len(v["values"]) != int(np.prod(v["shape"], dtype=np.int64)):
            raise InputError(path, f"variables[{i}]", "needs a name, a shape and prod(shape) values", fix)
    return PolicyWeights(path, network, max_groups, dict(body.get("provenance") or {})), variables


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
