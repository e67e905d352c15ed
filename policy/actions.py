"""The policy's action space and its decoding into a Strategy that is always valid.

One action for a graph of G groups on a cluster of D devices is a dict of int32 arrays:

  shares     [G, D] in [0, L)  share level of each device for each group; level l gives the device
                               the weight SHARE_LEVELS[l] x its relative speed (level 0 = not used).
                               The group's samples are `proportional_shares(weights, batch)`
                               (largest remainder, sums exactly to the batch); devices that end at
                               0 samples are dropped. All-zero weights fall back to the fastest
                               device (of those with the highest share level logit if given).
                               Uneven splits (0.5x / 2x speed) are expressible.
  micro      [G]    in {0, 1}  1 = run each device's share as 2 micro-batches (pipelining), when
                               the share has >= 2 samples.
  sync       [G]    in {0, 1}  0 = all-reduce among the holders, 1 = parameter server.
  ps_device  [G]    in [0, D)  the PS device when sync = 1 (any device: a holder or a dedicated
                               PS); ignored for all-reduce.
  priority   [G]    in [0, P)  execution priority of the group's ops on each device (lower first).

Everything is a pure function of the arrays: `decode` never raises for an action inside
`action_array_spec` (tested with random actions).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from tf_agents.specs import array_spec

from tfplace.formats.strategy import GroupDecision, Strategy, proportional_shares

SHARE_LEVELS: Tuple[float, ...] = (0.0, 0.5, 1.0, 2.0)
ACTION_KEYS = ("micro", "priority", "ps_device", "shares", "sync")


@dataclasses.dataclass(frozen=True)
class ActionLayout:
    """Sizes of the action space that do not depend on the graph or cluster."""
    share_levels: int = len(SHARE_LEVELS)
    priority_levels: int = 3


def action_array_spec(num_groups: int, num_devices: int, layout: ActionLayout = ActionLayout()):
    """The TF-Agents spec of one action (dict of BoundedArraySpec)."""
    def spec(shape, hi, name):
        return array_spec.BoundedArraySpec(shape, np.int32, minimum=0, maximum=hi, name=name)
    g, d = num_groups, num_devices
    return {"shares": spec((g, d), layout.share_levels - 1, "shares"), "micro": spec((g,), 1, "micro"),
            "sync": spec((g,), 1, "sync"), "ps_device": spec((g,), d - 1, "ps_device"),
            "priority": spec((g,), layout.priority_levels - 1, "priority")}


def random_action(rng: np.random.Generator, num_groups: int, num_devices: int,
                  layout: ActionLayout = ActionLayout()) -> Dict[str, np.ndarray]:
    spec = action_array_spec(num_groups, num_devices, layout)
    return {k: rng.integers(0, s.maximum + 1, size=s.shape).astype(np.int32) for k, s in spec.items()}


def proportional_action(num_groups: int, num_devices: int) -> Dict[str, np.ndarray]:
    """The action that decodes to data parallel with shares proportional to speed, all-reduce."""
    z = np.zeros(num_groups, np.int32)
    return {"shares": np.full((num_groups, num_devices), SHARE_LEVELS.index(1.0), np.int32), "micro": z.copy(),
            "sync": z.copy(), "ps_device": z.copy(), "priority": z.copy()}


def mutate(rng: np.random.Generator, action: Dict[str, np.ndarray], num_changes: int = 2,
           layout: ActionLayout = ActionLayout()) -> Dict[str, np.ndarray]:
    """A copy of `action` with `num_changes` random groups re-drawn in one random field (local
    search; the lowering then re-resolves only the touched groups)."""
    out = {k: v.copy() for k, v in action.items()}
    g, d = out["shares"].shape
    spec = action_array_spec(g, d, layout)
    for _ in range(num_changes):
        key = ACTION_KEYS[rng.integers(len(ACTION_KEYS))]
        grp = rng.integers(g)
        if key == "shares":
            out[key][grp, rng.integers(d)] = rng.integers(spec[key].maximum + 1)
        else:
            out[key][grp] = rng.integers(spec[key].maximum + 1)
    return out


def _categorical(rng: np.random.Generator, p: np.ndarray) -> np.ndarray:
    """One index per row of `p` [..., k] (weights >= 0 along the last axis), drawn in proportion
    to the weights with one uniform number per row."""
    c = np.cumsum(np.asarray(p, dtype=np.float64), axis=-1)
    u = rng.random(c.shape[:-1] + (1,)) * c[..., -1:]
    return np.minimum((u >= c).sum(axis=-1), c.shape[-1] - 1)


def guided_mutate(rng: np.random.Generator, action: Dict[str, np.ndarray], probs: Dict[str, np.ndarray],
                  num_changes: int = 2) -> Dict[str, np.ndarray]:
    """Like `mutate`, but the new values are drawn from the policy's marginals `probs`
    (ReinforceLearner.probabilities: shares [G, D, L], ps_device [G, D], sync / micro /
    priority [G, k]) instead of uniformly: the policy is the search's proposal distribution.
    Half the time a share change re-draws the whole group's row of devices at once (a group moved
    to other devices), since single-device changes cannot move a group in one step."""
    out = {k: v.copy() for k, v in action.items()}
    g, d = out["shares"].shape
    for _ in range(num_changes):
        key = ACTION_KEYS[rng.integers(len(ACTION_KEYS))]
        grp = int(rng.integers(g))
        if key == "shares":
            devs = range(d) if rng.random() < 0.5 else [int(rng.integers(d))]
            for dev in devs:
                out[key][grp, dev] = int(_categorical(rng, probs[key][grp, dev]))
        else:
            out[key][grp] = int(_categorical(rng, probs[key][grp]))
    return out


def greedy_from(probs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The most likely action under the policy's marginals `probs` (ReinforceLearner.probabilities;
    the policy factorises over its entries, so this is its mode)."""
    return {k: np.argmax(np.asarray(probs[k]), axis=-1).astype(np.int32) for k in ACTION_KEYS}


def sample_from(rng: np.random.Generator, probs: Dict[str, np.ndarray], n: int) -> List[Dict[str, np.ndarray]]:
    """`n` actions drawn from the policy's marginals `probs` (each entry independently, as the
    policy's own sampler draws them), with numpy's generator: planning needs no further pass of
    the network once it has the marginals."""
    out: List[Dict[str, np.ndarray]] = [{} for _ in range(n)]
    for k in ACTION_KEYS:
        for a in out:
            a[k] = _categorical(rng, probs[k]).astype(np.int32)
    return out


def fastest_subsets(speeds: Sequence[float]) -> Tuple[np.ndarray, ...]:
    """Device masks [D] (bool) of the clusters' fastest parts, smallest first: the fastest device
    alone, then every device at least as fast as the k-th fastest speed class, for each class
    but the slowest (whose mask is the whole cluster). Distinct masks only."""
    sp = np.asarray(speeds, dtype=np.float64)
    masks = [np.arange(len(sp)) == int(np.argmax(sp))]
    for speed in sorted(set(sp.tolist()), reverse=True)[:-1]:
        masks.append(sp >= speed)
    out, seen = [], set()
    for m in masks:
        if m.all() or m.tobytes() in seen:
            continue
        seen.add(m.tobytes())
        out.append(m)
    return tuple(out)


def ranked_subsets(share_probs: np.ndarray) -> Tuple[np.ndarray, ...]:
    """Device masks [D] (bool) of the policy's own device ranking, smallest first: the k devices
    it most expects to use (mean over groups of P(share level > 0), from `share_probs` [G, D, L]),
    for k = 1 .. D - 1 (ties: the earlier device). The policy's marginals may rank the devices
    well while its per-(group, device) argmax still spreads a group over all of them."""
    use = 1.0 - np.asarray(share_probs, dtype=np.float64)[..., 0]
    order = np.argsort(-use.mean(axis=0), kind="stable")
    masks = []
    for k in range(1, len(order)):
        m = np.zeros(len(order), dtype=bool)
        m[order[:k]] = True
        masks.append(m)
    return tuple(masks)


def restrict(action: Dict[str, np.ndarray], mask: np.ndarray,
             ps_probs: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
    """`action` with the devices outside `mask` [D] left out: their share levels set to 0 (a group
    left with none falls back to the fastest device, `decode`), and a parameter server outside the
    mask moved to the device of the mask that `ps_probs` [G, D] ranks highest (the first of the
    mask without it). Everything else is kept."""
    out = {k: np.array(v, copy=True) for k, v in action.items()}
    keep = np.asarray(mask, dtype=bool)
    out["shares"][:, ~keep] = 0
    inside = np.flatnonzero(keep)
    for g in np.flatnonzero(out["sync"] == 1):
        if not keep[int(out["ps_device"][g])]:
            best = inside[int(np.argmax(ps_probs[g, inside]))] if ps_probs is not None else inside[0]
            out["ps_device"][g] = int(best)
    return out


def greedy_plans(probs: Dict[str, np.ndarray], speeds: Sequence[float]) -> List[Tuple[str, Dict[str, np.ndarray]]]:
    """The policy's deterministic plans from its marginals `probs` (ReinforceLearner.probabilities)
    on devices of relative `speeds` [D], as (what it is, action) pairs: the greedy action, then the
    greedy action restricted to each of the cluster's fastest parts (fastest_subsets) and to the k
    devices the policy most expects to use (ranked_subsets). Planning's zero-shot plan is the best of
    these and a few samples; training times the same ones every step, so that its curve of the
    policy's own plan is what planning from that checkpoint would give."""
    greedy = greedy_from(probs)
    plans = [("greedy", greedy)]
    for part, masks in (("fastest devices", fastest_subsets(speeds)), ("policy's top devices",
                                                                        ranked_subsets(probs["shares"]))):
        plans += [(f"greedy, {part}", restrict(greedy, m, probs["ps_device"])) for m in masks]
    return plans


def canonical_device_permutation(action: Dict[str, np.ndarray], classes: Sequence[Sequence[int]],
                                 group_weights: Sequence[float]) -> np.ndarray:
    """[D] the new index of each device when the devices of each class of identical devices
    (`classes`, device indices in order; tfplace.policy.features.identical_device_classes) are
    relabelled so that the class's first device carries the most work: by the sum over groups of
    `group_weights` [G] (e.g. the group's seconds) x the device's share weight, then by the number
    of groups whose parameter server it is, then by the first group that uses it."""
    shares = np.asarray(action["shares"])
    sync, ps = np.asarray(action["sync"]), np.asarray(action["ps_device"])
    levels = np.asarray(SHARE_LEVELS)[shares]  # [G, D]
    load = np.asarray(group_weights, dtype=np.float64) @ levels
    serves = np.bincount(ps[sync == 1], minlength=shares.shape[1])
    used = levels > 0
    first = np.where(used.any(axis=0), used.argmax(axis=0), shares.shape[0])
    new_of = np.arange(shares.shape[1])
    for members in classes:
        ranked = sorted(members, key=lambda i: (-load[i], -serves[i], first[i], i))
        for new, old in zip(members, ranked):
            new_of[old] = new
    return new_of


def canonical_device_order(action: Dict[str, np.ndarray], classes: Sequence[Sequence[int]],
                           group_weights: Sequence[float]) -> Dict[str, np.ndarray]:
    """`action` with its devices relabelled by canonical_device_permutation: one of the equal
    targets that differ only by which of two identical devices runs what, the same one for every
    search. (The decoded strategies are the same up to that relabelling, except where the split
    of a batch breaks a tie by device index; the simulator's own tie-breaks can move the time of
    a relabelled strategy by a few percent.)"""
    new_of = canonical_device_permutation(action, classes, group_weights)
    out = {k: np.array(v, copy=True) for k, v in action.items()}
    out["shares"][:, new_of] = np.asarray(action["shares"])
    out["ps_device"] = new_of[np.asarray(action["ps_device"])].astype(np.int32)
    return out


def _group_decision(row: np.ndarray, micro: int, sync: int, ps: int, prio: int, names: Sequence[str],
                    speeds: np.ndarray, batch: int) -> GroupDecision:
    weights = np.asarray(SHARE_LEVELS)[row] * speeds
    if not (weights > 0).any():
        weights = np.zeros_like(speeds)
        weights[int(np.argmax(speeds))] = 1.0
    shares = proportional_shares(weights.tolist(), batch)
    entries = []
    for name, s in zip(names, shares):
        if s <= 0:
            continue
        entries.append((name, (s - s // 2, s // 2) if micro and s >= 2 else (s,)))
    return GroupDecision(tuple(entries), "ps" if sync else "allreduce", names[ps] if sync else None, int(prio))


def decode(action: Dict[str, np.ndarray], group_names: Sequence[str], device_names: Sequence[str],
           speeds: Sequence[float], batch_size: int, max_groups: int, graph: str = "") -> Strategy:
    """The Strategy of `action` (see the module docstring); every group is listed explicitly."""
    sp = np.asarray(speeds, dtype=np.float64)
    shares = np.asarray(action["shares"])
    groups = {}
    cache: Dict[tuple, GroupDecision] = {}
    for g, name in enumerate(group_names):
        key = (shares[g].tobytes(), int(action["micro"][g]), int(action["sync"][g]),
               int(action["ps_device"][g]) if action["sync"][g] else -1, int(action["priority"][g]))
        if key not in cache:
            cache[key] = _group_decision(shares[g], key[1], key[2], int(action["ps_device"][g]), key[4],
                                         device_names, sp, batch_size)
        groups[name] = cache[key]
    return Strategy(batch_size, max_groups, None, groups, graph)


def action_key(action: Dict[str, np.ndarray]) -> bytes:
    """Hashable identity of an action (for caches and pool de-duplication)."""
    return b"|".join(np.ascontiguousarray(action[k], dtype=np.int32).tobytes() for k in ACTION_KEYS)


def action_to_json(action: Optional[Dict[str, np.ndarray]]):
    return None if action is None else {k: np.asarray(v).tolist() for k, v in action.items()}


def action_from_json(obj) -> Optional[Dict[str, np.ndarray]]:
    return None if obj is None else {k: np.asarray(v, dtype=np.int32) for k, v in obj.items()}


def _encode_shares(samples: np.ndarray, speeds: np.ndarray) -> np.ndarray:
    """Share levels [D] whose decoded split is closest (L1 over samples) to `samples` [D]: the
    scale c of weight = level x speed is chosen among the values that make some device's level
    exact; ties go to the smaller scale."""
    levels = np.asarray(SHARE_LEVELS)
    used = samples > 0
    total = float(samples.sum())
    best, best_err = np.zeros(len(samples), np.int32), np.inf
    target = samples / total
    for d in np.flatnonzero(used):
        for lv in levels[1:]:
            c = target[d] / (lv * speeds[d])  # weight per unit of share at this scale
            wanted = np.where(used, target / (c * speeds), 0.0)
            idx = np.abs(wanted[:, None] - levels[None, :]).argmin(axis=1).astype(np.int32)
            w = levels[idx] * speeds
            if w.sum() <= 0:
                continue
            err = float(np.abs(w / w.sum() - target).sum())
            if err < best_err - 1e-12:
                best, best_err = idx, err
    return best


def encode(strategy: Strategy, group_names: Sequence[str], device_names: Sequence[str], speeds: Sequence[float],
           layout: ActionLayout = ActionLayout()) -> Dict[str, np.ndarray]:
    """The action whose `decode` is closest to `strategy` (the inverse of decode where the action
    space can express the strategy): per group, the share levels whose split is nearest the
    strategy's samples per device, micro = 1 when some device runs more than one micro-batch,
    sync and PS device as given, priority clipped to the layout's levels. Used to turn strategies
    found by search (any split, pipelines) into imitation targets for the policy."""
    sp = np.asarray(speeds, dtype=np.float64)
    index = {name: i for i, name in enumerate(device_names)}
    g, d = len(group_names), len(device_names)
    out = {"shares": np.zeros((g, d), np.int32), "micro": np.zeros(g, np.int32), "sync": np.zeros(g, np.int32),
           "ps_device": np.zeros(g, np.int32), "priority": np.zeros(g, np.int32)}
    memo: Dict[GroupDecision, tuple] = {}
    for i, name in enumerate(group_names):
        dec = strategy.decision_for(name)
        if dec not in memo:
            samples = np.zeros(d)
            for dev, mb in dec.shares:
                samples[index[dev]] += sum(mb)
            memo[dec] = (_encode_shares(samples, sp), int(any(len(mb) > 1 for _, mb in dec.shares)),
                         int(dec.sync == "ps"), index[dec.ps_device] if dec.sync == "ps" and dec.ps_device else 0,
                         min(max(int(dec.priority or 0), 0), layout.priority_levels - 1))
        shares, out["micro"][i], out["sync"][i], out["ps_device"][i], out["priority"][i] = memo[dec]
        out["shares"][i] = shares
    return out
