"""What tfplace's Grappler plugin (grappler_plugin.cc) calls: one serialized GraphDef in, one out.

    optimize(graph_def_bytes, fetches, params, item_id) -> bytes | None

`graph_def_bytes` is the Grappler item's graph: the session's whole graph (the plugin runs as the
only optimizer, so nothing pruned it to the fetches first); `fetches` are the item's fetch names
("loss:0", "train_op"); `item_id` is Grappler's ("tf_graph" for a session's graph, a
function's name for its body); `params` is the custom optimizer's `parameter_map`, all strings:

  strategy, cluster   paths of the strategy and cluster files (tfplace.formats), required
  train_op            the op that runs one training step (a NoOp, e.g. `tf.group` or `minimize`
                      without global_step), required: it names the step to rewrite
  init_op             the variable initializer (default "init", `global_variables_initializer`)
  loss                the loss tensor (optional, as tfplace.ir.loader.load_op_graph)
  loss_reduction      "mean" or "sum" (optional, as load_op_graph)

Returns the rewritten step (tfplace.rewrite.graph_rewrite.rewrite_step; the single implementation)
serialized, or None when the item is a function body, or a graph rewritten already. A session's
graph without `train_op` raises InputError. The rewritten graph keeps the names a script
fetches: the train op, the init op (initialise, then copy to every mirror), the loss (when it is
output 0 of its op) and the placeholders. A fetched variable read (`ReadVariableOp` of a variable of the step) becomes an
Identity of mirror 0's value under its own name; any other fetch the rewrite renamed raises
InputError, which the plugin turns into a failing session run.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from typing import Mapping, Optional, Sequence

from tfplace.formats.errors import InputError
from tfplace.ir.roles import REFERENCE_VARIABLE_OPS, RESOURCE_VARIABLES_FIX

SOURCE = "tfplace Grappler optimizer"
# An Assert(false) that session_config makes the script's train op wait for and that optimize()
# removes before it rewrites: a master without the plugin runs the original graph, and the Assert
# fails the step instead of letting it train unplaced on one device, silently.
SENTINEL = "tfplace_plugin_sentinel"
REWRITTEN_MARKER = "tfplace/init_once"  # a node every rewritten step has (graph_rewrite.init_subgraph)
SESSION_ITEM = "tf_graph"  # Grappler's item id for a session's graph (GraphExecutionState)
_CACHE_ENTRIES = 4  # rewritten steps kept: one session asks once per distinct fetch set


@dataclasses.dataclass(frozen=True)
class PluginParams:
    """The custom optimizer's parameters (see the module docstring), validated when built."""
    strategy: str = ""  # the required ones default to "" so that a missing one is named, not a TypeError
    cluster: str = ""
    train_op: str = ""
    init_op: str = "init"
    loss: str = ""
    loss_reduction: str = ""

    def __post_init__(self):
        for field in ("strategy", "cluster", "train_op", "init_op"):
            if not getattr(self, field):
                raise InputError(SOURCE, f"parameter_map.{field}", "is missing or empty",
                                 "enable the optimizer with tfplace.rewrite.grappler.session_config(...)")
        if self.loss_reduction not in ("", "mean", "sum"):
            raise InputError(SOURCE, "parameter_map.loss_reduction", f"is {self.loss_reduction!r}",
                             'use "mean" or "sum"')

    @classmethod
    def from_map(cls, params: Mapping[str, str]) -> "PluginParams":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise InputError(SOURCE, "parameter_map", f"has unknown keys {unknown}", f"use only {sorted(known)}")
        return cls(**{k: str(v) for k, v in params.items()})


_steps: "collections.OrderedDict[str, object]" = collections.OrderedDict()


def optimize(graph_def_bytes: bytes, fetches: Sequence[str], params: Mapping[str, str],
             item_id: str = SESSION_ITEM) -> Optional[bytes]:
    """The rewritten GraphDef, serialized, or None to keep the graph; see the module docstring."""
    from tensorflow.core.framework import graph_pb2
    p = PluginParams.from_map(params)
    graph_def = graph_pb2.GraphDef.FromString(graph_def_bytes)
    if strip_sentinel(graph_def):
        graph_def_bytes = graph_def.SerializeToString()
    names = {n.name for n in graph_def.node}
    if REWRITTEN_MARKER in names or (item_id != SESSION_ITEM and p.train_op not in names):
        return None
    if p.train_op not in names:
        raise InputError(SOURCE, "parameter_map.train_op", f"no op {p.train_op!r} in the session's graph",
                         "pass the op the script runs for one training step")
    if p.init_op not in names:
        raise InputError(SOURCE, "parameter_map.init_op", f"no op {p.init_op!r} in the session's graph",
                         "pass the op that initialises the variables as session_config(..., init_op=...), e.g. "
                         "the one tf.compat.v1.global_variables_initializer() returns")
    step = _rewritten_step(graph_def, graph_def_bytes, p)
    out = graph_pb2.GraphDef()
    out.CopyFrom(step.graph_def)
    add_fetch_aliases(out, graph_def, step, fetches)
    return out.SerializeToString()


def strip_sentinel(graph_def) -> bool:
    """Removes SENTINEL (and the constants under its name) from `graph_def`, with every control
    input on it; True if it was there. The returned graph is then rewritten, or, as a function body
    or a graph rewritten already, kept, either way without the failing Assert."""
    drop = {n.name for n in graph_def.node if n.name == SENTINEL or n.name.startswith(SENTINEL + "/")}
    if not drop:
        return False
    keep = [n for n in graph_def.node if n.name not in drop]
    for n in keep:
        inputs = [i for i in n.input if i.lstrip("^").split(":")[0] not in drop]
        if len(inputs) != len(n.input):
            del n.input[:]
            n.input.extend(inputs)
    del graph_def.node[:]
    graph_def.node.extend(keep)
    return True


def rewrite_graph_def(graph_def, p: PluginParams):
    """The RewrittenStep of `graph_def` under `p`: the same calls the session hook makes."""
    from tfplace.formats.cluster import load_cluster
    from tfplace.formats.strategy import load_strategy
    from tfplace.ir.loader import load_op_graph
    from tfplace.rewrite.graph_rewrite import rewrite_step
    strategy, cluster = load_strategy(p.strategy), load_cluster(p.cluster)
    graph = load_op_graph(graph_def, sinks=[p.train_op], batch_size=strategy.global_batch_size,
                          loss=p.loss or None, loss_reduction=p.loss_reduction or None, source=SOURCE)
    return rewrite_step(graph, strategy, cluster, init_op=p.init_op, private_functions=False)


def _file_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""  # unreadable: load_strategy / load_cluster then fail naming it, and nothing is cached


def _rewritten_step(graph_def, graph_def_bytes: bytes, p: PluginParams):
    # Grappler asks once per distinct (feeds, fetches) with the same whole graph: rewrite it once.
    # The key holds the strategy and cluster files' contents, not only their paths: a file edited
    # between two sessions of one process must not get the rewrite of its old contents.
    files = b"".join(hashlib.sha256(_file_bytes(path)).digest() for path in (p.strategy, p.cluster))
    key = hashlib.sha256(graph_def_bytes + repr(dataclasses.astuple(p)).encode() + files).hexdigest()
    step = _steps.get(key)
    if step is None:  # (two sessions' threads may both rewrite: the same result, kept once)
        step = _steps[key] = rewrite_graph_def(graph_def, p)
        while len(_steps) > _CACHE_ENTRIES:
            _steps.popitem(last=False)
    return step


def _is_reference_variable(node, by_name) -> bool:
    """A VariableV2 op, or the Identity that reads one (`<var>/read`)."""
    if node is None:
        return False
    if node.op == "Identity" and node.input:
        node = by_name.get(node.input[0].split(":")[0])
    return node is not None and node.op in REFERENCE_VARIABLE_OPS


def add_fetch_aliases(out, original, step, fetches: Sequence[str]) -> None:
    """Adds to `out` (the rewritten GraphDef) an Identity under each fetched variable read's name;
    raises InputError for another fetch that is not in `out`."""
    have = {n.name for n in out.node}
    by_name = {n.name: n for n in original.node}
    for fetch in fetches:
        op = fetch.lstrip("^").split(":")[0]
        if op in have:
            continue
        node = by_name.get(op)
        var = node.input[0].split(":")[0] if node is not None and node.op == "ReadVariableOp" else ""
        if var not in step.variables:
            if _is_reference_variable(node, by_name):
                raise InputError(SOURCE, f"fetch {fetch!r}", "is the value of a reference variable (VariableV2), "
                                 "which the rewritten step does not keep under its name", RESOURCE_VARIABLES_FIX)
            raise InputError(SOURCE, f"fetch {fetch!r}", "is not in the rewritten step (its ops are replicated "
                             "and renamed)", "fetch the train op, the init op, the loss, or variable values")
        alias = out.node.add(name=op, op="Identity", input=[step.variables[var][0]])
        alias.attr["T"].CopyFrom(node.attr["dtype"])
        alias.device = next(n.device for n in out.node if n.name == step.variables[var][0].split(":")[0])
        have.add(op)
