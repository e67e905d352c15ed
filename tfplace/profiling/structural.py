"""A profile that carries a graph's structure and no measurement: for passes that lower a
strategy only to know which tasks exist and in which order (the rewrite), not how long they take.

    profile = structural_profile(graph, cluster.kinds)

Layout: every op of `graph` on every kind in `kinds` (any kind name, known to the device model
or not) costs `seconds_per_op` at the graph's reference batch size. An op that is
batch-dependent and has an output with a batch axis scales linearly with its per-device batch
(one point, at the reference batch); every other op costs `seconds_per_op` at any batch (points
at 1 and at the reference batch). No `run_order`, no `comm`, nothing missing.

Why costs do not matter to the rewrite: the lowering decides tasks, buffers, messages and
priorities from the strategy and the graph; the profile's seconds only fill `task_seconds`, and
the only other thing it reads, `run_order`, breaks priority ties (`run_order_rank`). Without a
run order the ties follow the OpGraph's own op order, so the rewritten graph is deterministic
and the same as with any other profile that has no run order.

Pure: no files, no TensorFlow.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tfplace.formats.errors import InputError
from tfplace.formats.profile import Profile
from tfplace.ir.graph_ir import OpGraph

DEFAULT_SECONDS_PER_OP = 1e-4  # an arbitrary positive unit: only the structure is used


def structural_profile(graph: OpGraph, kinds: Sequence[str],
                       seconds_per_op: float = DEFAULT_SECONDS_PER_OP) -> Profile:
    """Every op of `graph` costs `seconds_per_op` on every kind (see the module docstring)."""
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    if not kinds:
        raise InputError("structural_profile", "kinds", "is empty", "pass the cluster's device kinds")
    if not np.isfinite(seconds_per_op) or seconds_per_op <= 0:
        raise InputError("structural_profile", "seconds_per_op", f"must be a positive number, got {seconds_per_op!r}",
                         "use a small positive time such as 1e-4")
    ref = graph.reference_batch_size
    batched = np.zeros(graph.num_ops, dtype=bool)
    batched[graph.tensor_op[graph.tensor_batch_axis >= 0]] = True
    scales = graph.op_batch_dependent & batched
    s = float(seconds_per_op)
    linear = ((ref,), (s,))
    constant = ((1, ref), (s, s)) if ref > 1 else linear
    ops = {name: {kind: (linear if scales[i] else constant) for kind in kinds}
           for i, name in enumerate(graph.names)}
    return Profile(ops=ops, graph=str(graph.meta.get("model", graph.source or "")),
                   conditions={"method": "structural (tfplace.profiling.structural): no measurement",
                               "seconds_per_op": s})
