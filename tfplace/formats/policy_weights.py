"""The policy weights file format (tfplace.policy_weights): what it holds, and its reading and
checking without TensorFlow (the network side is tfplace.policy.pretrained).

  {"format": "tfplace.policy_weights", "version": 1,
   "network": {NetworkConfig fields}, "max_groups": int,
   "provenance": {how the weights were made: command, seed, split, metrics},
   "variables": [{"name": str, "shape": [int...], "values": [float...]}, ...]}
Variables are listed in the network's own order (PlacementNetwork.trainable_variables, which
its construction fixes). Values are float32 written with 9 significant digits, which read back
bit-exactly. JSON, never pickle: a checkpoint a person can read and diff.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any, Dict, Tuple

import numpy as np

from tfplace.formats.config import NetworkConfig
from tfplace.formats.errors import InputError
from tfplace.formats.jsonio import FieldReader

FORMAT = "tfplace.policy_weights"
VERSION = 1
PRETRAIN_COMMAND = "python -m tfplace.pretrain --out policy/pretrained/policy.json --seed 0"


def pretrained_path() -> str:
    """Where the policy shipped with tfplace lies: pretrained/policy.json in the tfplace.policy
    package (found without importing it: the formats do not depend on the policy)."""
    spec = importlib.util.find_spec("tfplace.policy")
    return os.path.join(list(spec.submodule_search_locations)[0], "pretrained", "policy.json")


@dataclasses.dataclass(frozen=True)
class PolicyWeights:
    """What a weights file says besides the values."""
    path: str
    network: NetworkConfig
    max_groups: int
    provenance: Dict[str, Any]


def _network_config(path: str, body: Dict[str, Any]) -> NetworkConfig:
    fields = {f.name for f in dataclasses.fields(NetworkConfig)}
    net = body.get("network")
    flags = {"device_rank_feature"}  # 0 or 1; every other field is a positive size
    if (not isinstance(net, dict) or set(net) - fields
            or not all(isinstance(v, int) and not isinstance(v, bool) and (v in (0, 1) if k in flags else v > 0)
                       for k, v in net.items())):
        raise InputError(path, "network", f"must be an object of positive integers (device_rank_feature: 0 or 1) "
                                          f"with keys among {sorted(fields)}",
                         f"write the file with tfplace.policy.pretrained.save_weights ({PRETRAIN_COMMAND})")
    return NetworkConfig(**net)


def read_weights(path: str) -> Tuple[PolicyWeights, list]:
    """(what the file says, its variable list), checked for shape but not against a network.
    The last files read are kept while unchanged (same size and modification time): a training
    run reads its init_policy when the config is loaded and again for the weights (2.7 MB of
    JSON, about 0.3 s). The variable list is shared: callers read it, never change it."""
    try:
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_mtime_ns, st.st_size)
    except OSError:
        key = None  # FieldReader.from_file says what is wrong with the path
    if key is not None and key in _READ:
        return _READ[key]
    out = _read_weights(path)
    if key is not None:
        _READ.clear()  # one file: the shipped policy, or the one a config names
        _READ[key] = out
    return out


_READ: Dict[Tuple[str, int, int], Tuple[PolicyWeights, list]] = {}


def _read_weights(path: str) -> Tuple[PolicyWeights, list]:
    fix = f"give a file written by save_weights, e.g. by {PRETRAIN_COMMAND}"
    body = FieldReader.from_file(path).data
    if body.get("format") != FORMAT:
        raise InputError(path, "format", f"is not {FORMAT!r}", fix)
    if body.get("version") != VERSION:
        raise InputError(path, "version", f"is {body.get('version')!r}, this tfplace reads {VERSION}", fix)
    network = _network_config(path, body)
    max_groups = body.get("max_groups")
    if not isinstance(max_groups, int) or isinstance(max_groups, bool) or max_groups < 1:
        raise InputError(path, "max_groups", f"must be a positive integer, got {max_groups!r}", fix)
    variables = body.get("variables")
    if not isinstance(variables, list) or not variables:
        raise InputError(path, "variables", "must be a non-empty list", fix)
    for i, v in enumerate(variables):
        ok = isinstance(v, dict) and isinstance(v.get("shape"), list) and isinstance(v.get("values"), list)
        if not ok or len(v["values"]) != int(np.prod(v["shape"], dtype=np.int64)):
            raise InputError(path, f"variables[{i}]", "needs a name, a shape and prod(shape) values", fix)
    return PolicyWeights(path, network, max_groups, dict(body.get("provenance") or {})), variables
