"""Small tasks for the policy tests (fakes next to what they stand in for)."""

from __future__ import annotations

from tfplace import testing
from tfplace.ir.grouping import make_grouping

from tfplace.policy.environment import PlacementTask
from tfplace.profiling.device_model import default_profile


def tiny_task(model: str = "mlp", cluster: str = "four", batch_size: int = 8, max_groups: int = 16) -> PlacementTask:
    """The tiny MLP/CNN training step on the 2- or 4-device fake cluster, derived profile."""
    graph = testing.tiny_graph(model, batch_size)
    c = testing.four_device_cluster() if cluster == "four" else testing.two_device_cluster()
    grouping = make_grouping(graph, max_groups)
    return PlacementTask(f"tiny_{model}_{cluster}", graph, grouping, c, default_profile(graph, c.kinds),
                         batch_size, max_groups)
