"""NodeDef builders of the rewrite pass (tfplace.rewrite.graph_rewrite): slices, weighted partials,
variable reads and assignments, and the per-replica seeds of random ops (`reseed_replica`, the
one place that lists random ops and derives their seeds); the builders it shares with the
profilers (constants, concatenation, sums, the all-reduce) live in tfplace.ir.node_defs and are
re-exported here. Each returns NodeDefs (protos) and never decides what a strategy means; that
is the lowering's job.

All builders take the full TF device string of the device the node runs on.
"""

from __future__ import annotations

from typing import List, Sequence

from tfplace.ir.node_defs import (CPU_ALL_REDUCE, add_n, all_reduce, bucket_all_reduce, concat, const,  # noqa: F401
                                  dtype_enum, dtype_size, exchange_all_reduce, group_key, identity, node,
                                  no_op, packed_send, padding_elements, _tf)


def batch_slice(name: str, device: str, src: str, axis: int, start: int, stop: int, dtype_name: str) -> List:
    """Rows [start, stop) of `src` along `axis` (StridedSlice; axes before `axis` kept whole)."""
    begin = [0] * axis + [start]
    end = [0] * axis + [stop]
    mask = (1 << axis) - 1
    return [const(name + "/begin", device, begin, "int32"), const(name + "/end", device, end, "int32"),
            const(name + "/strides", device, [1] * (axis + 1), "int32"),
            node(name, "StridedSlice", device, [src, name + "/begin", name + "/end", name + "/strides"],
                 type_T=dtype_enum(dtype_name), type_Index=dtype_enum("int32"), begin_mask=mask, end_mask=mask)]


def scaled(name: str, device: str, src: str, weight: float, dtype_name: str) -> List:
    """src * weight on `device` (the aggregation weight of one replica's partial value)."""
    return [const(name + "/weight", device, weight, dtype_name),
            node(name, "Mul", device, [src, name + "/weight"], type_T=dtype_enum(dtype_name))]


def read_variable(name: str, device: str, handle: str, dtype_name: str, control: Sequence[str] = ()):
    return node(name, "ReadVariableOp", device, [handle] + ["^" + c for c in control],
                type_dtype=dtype_enum(dtype_name))


def assign_variable(name: str, device: str, handle: str, value: str, dtype_name: str,
                    control: Sequence[str] = ()):
    return node(name, "AssignVariableOp", device, [handle, value] + ["^" + c for c in control],
                type_dtype=dtype_enum(dtype_name))


# ---- per-replica seeds of random ops -----------------------------------------------------------
# Replica k of a random op must draw its own numbers: copied with the original's
# seeds, every replica would draw the same dropout mask for its share of the batch.
#
# Stateful ops, seeded by the int attrs `seed` (graph-level) and `seed2` (op-level): replica k
# keeps `seed` and gets `seed2 = replica_seed2(seed2, k)`. TF reads seed == seed2 == 0 as "draw a
# fresh random seed for this op instance", so such replicas already differ and keep 0.
STATEFUL_RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomGamma", "RandomPoisson", "RandomPoissonV2", "RandomShuffle",
    "Multinomial", "RandomCrop", "SampleDistortedBoundingBox", "SampleDistortedBoundingBoxV2",
    "FractionalAvgPool", "FractionalMaxPool", "UniformCandidateSampler", "LogUniformCandidateSampler",
    "LearnedUnigramCandidateSampler", "ThreadUnsafeUnigramCandidateSampler", "FixedUnigramCandidateSampler"})
# Stateless ops, seeded by an input: op type -> index of that input. `seed` is int32/int64 [2]
# (attr Tseed); replica k > 0 reads seed + [0, k]. `key` (the V2 ops, after
# StatelessRandomGetKeyCounter) is uint64 [1]; replica k > 0 reads key + [k]. The sum is computed
# on the host CPU of the replica's task: seed and key are host-memory inputs on every device.
STATELESS_SEED_INPUT = {
    "StatelessRandomUniform": 1, "StatelessRandomNormal": 1, "StatelessTruncatedNormal": 1,
    "StatelessRandomUniformInt": 1, "StatelessRandomUniformFullInt": 1, "StatelessRandomBinomial": 1,
    "StatelessRandomPoisson": 1, "StatelessRandomGammaV2": 1, "StatelessParameterizedTruncatedNormal": 1,
    "StatelessMultinomial": 2, "StatelessSampleDistortedBoundingBox": 3}
STATELESS_KEY_INPUT = {
    "StatelessRandomUniformV2": 1, "StatelessRandomNormalV2": 1, "StatelessTruncatedNormalV2": 1,
    "StatelessRandomUniformIntV2": 1, "StatelessRandomUniformFullIntV2": 1, "StatelessRandomGammaV3": 1,
    "StatelessShuffle": 1, "StochasticCastToInt": 1}
# Seeded by an input but not re-seeded: the key derivation (its V2 consumers are offset instead,
# so a derivation shared by several replicas still gives each its own key) and index shuffles
# (a data pipeline's permutation must agree across replicas).
NOT_RESEEDED = frozenset({"StatelessRandomGetKeyCounter", "StatelessRandomGetKeyCounterAlg", "RandomIndexShuffle"})

_SEED2_MODULUS = 2 ** 31 - 1   # a prime: seed2 stays a positive int32 and k -> seed2 is one-to-one
_SEED2_STRIDE = 2654435761 % _SEED2_MODULUS  # Knuth's multiplicative-hash prime, ~2^32 / golden ratio


def replica_seed2(seed2: int, k: int) -> int:
    """`seed2` of replica k of a stateful random op: 1 + (seed2 - 1 + k * stride) mod (2^31 - 1).

    Replica 0 keeps any seed2 in [1, 2^31 - 1] (a one-replica strategy is unchanged); for a fixed
    seed2 the values of k < 2^31 - 1 are pairwise distinct (stride prime to the modulus) and never 0
    (so seed == 0 never turns into TF's "random seed" pair)."""
    return 1 + (int(seed2) - 1 + int(k) * _SEED2_STRIDE) % _SEED2_MODULUS


def reseed_replica(replica, k: int, host_device: str) -> List:
    """Gives `replica` (instance k of an op, already renamed and placed) its replica's seeds.

    Stateful: sets attr seed2 (in place) unless k == 0 or seed == seed2 == 0. Stateless, k > 0:
    re-points the seed/key input to `<replica>/tfplace_seed` = input + offset on `host_device` and
    returns those two NodeDefs. Other ops and replica 0: unchanged, returns []."""
    if k == 0:
        return []
    if replica.op in STATEFUL_RANDOM_OPS:
        seed, seed2 = (replica.attr[a].i if a in replica.attr else 0 for a in ("seed", "seed2"))
        if seed != 0 or seed2 != 0:
            replica.attr["seed2"].i = replica_seed2(seed2, k)
        return []
    if replica.op in STATELESS_SEED_INPUT:
        index, offset = STATELESS_SEED_INPUT[replica.op], [0, k]
        dtype = _tf().as_dtype(replica.attr["Tseed"].type).name if "Tseed" in replica.attr else "int64"
    elif replica.op in STATELESS_KEY_INPUT:
        index, offset, dtype = STATELESS_KEY_INPUT[replica.op], [k], "uint64"
    else:
        return []
    name = replica.name + "/tfplace_seed"
    out = [const(name + "/offset", host_device, offset, dtype),
           node(name, "AddV2", host_device, [replica.input[index], name + "/offset"], type_T=dtype_enum(dtype))]
    replica.input[index] = name
    return out



# ---- the step's own function library -------------------------------------------------------------
FUNCTION_SUFFIX = "_tfplace"


def private_function_library(graph_def) -> None:
    """Renames every function of `graph_def`'s library to `<name>_tfplace`, with every reference to
    it (a node's op or func attrs, in the graph and in function bodies; gradients), and drops the
    colocation attrs (`_class`) of the function bodies' nodes; in place.

    Why: a v2 cond's branch (a batch-norm layer's moving-average update under a `training`
    placeholder) holds nodes colocated by name (`loc:@AssignMovingAvg/...`). TensorFlow inlines a
    function once per call and keeps those names, so the copies of every replica's cond, on
    several tasks, fell into one colocation group: "Cannot merge devices with incompatible tasks"
    at the first step (the graph's own `_class` attrs are dropped as each node is emitted). The new
    names keep the step's library apart from the script's when the hook imports the step into the
    script's graph (TensorFlow refuses two functions of one name that differ)."""
    names = {f.signature.name: f.signature.name + FUNCTION_SUFFIX for f in graph_def.library.function}
    if not names:
        return

    def rename(n) -> None:
        if n.op in names:  # a direct call
            n.op = names[n.op]
        _rename_func_attrs(n.attr, names)

    for n in graph_def.node:
        rename(n)
    for f in graph_def.library.function:
        f.signature.name = names[f.signature.name]
        _rename_func_attrs(f.attr, names)
        for n in f.node_def:
            rename(n)
            if "_class" in n.attr:
                del n.attr["_class"]
    for gradient in graph_def.library.gradient:
        gradient.function_name = names.get(gradient.function_name, gradient.function_name)
        gradient.gradient_func = names.get(gradient.gradient_func, gradient.gradient_func)


def _rename_func_attrs(attrs, names) -> None:
    """Points the function attrs among `attrs` (an If's branches, a call's `f`, a Case's list) at the new names."""
    for value in attrs.values():
        if value.HasField("func") and value.func.name in names:
            value.func.name = names[value.func.name]
        for fn in value.list.func:
            if fn.name in names:
                fn.name = names[fn.name]
