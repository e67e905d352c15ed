"""Baseline and planner names -> generators.

    strategy = generate("dp_proportional_allreduce", problem)
    names()                    # every name below, in table order

Strategy generators (each returns a Strategy that goes through the lowering and simulator):
  single                       fastest device that fits (data_parallel.single_device)
  dp_even_allreduce / _ps      DP-EV with ring all-reduce / with a PS (best-linked device)
  dp_proportional_allreduce / _ps   DP-CP, shares ∝ profiled device throughput
  dp_ratio_lp                  HAP's ratio LP re-balancing DP-EV's device set (ratio_lp)
  dp_subset_even / _proportional   DP all-reduce over the best subset of the fastest devices
                               (data_parallel.dp_best_subset): what a user tries by hand
  dp_mp_hybrid                 DP with the heaviest layers each whole on one device (hybrid)
  model_parallel_round_robin, model_parallel_contiguous   HeteroG's MP seeds (model_parallel)
  heft, m_etf, m_sct           memory-aware list-scheduling placers (list_scheduling)
  pipeline                     DAPPLE-style planner (prints its estimated speed-up over DP)
  pipeline_ratio_lp            the pipeline plan re-balanced by the ratio LP

Runtime baselines (run for real, not strategies): horovod_even and horovod_proportional run the
original graph under Horovod (horovod_runner). For simulated tables they stand for the strategy
they implement: `SIMULATED_AS[name]`.

The names of tfplace.formats.config.BASELINES are all here (a test checks it).
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

from tfplace.formats.errors import InputError
from tfplace.formats.strategy import Strategy
from tfplace.profiling import device_model

from tfplace.baselines import data_parallel, hybrid, list_scheduling, model_parallel, pipeline, ratio_lp
from tfplace.baselines.horovod_runner import HorovodResult, even_batches, proportional_batches, run_horovod
from tfplace.baselines.problem import Problem, make_problem

Generator = Callable[[Problem], Strategy]

GENERATORS: Dict[str, Generator] = {
    "single": data_parallel.single_device,
    "dp_even_allreduce": lambda p: data_parallel.dp_even(p, "allreduce"),
    "dp_even_ps": lambda p: data_parallel.dp_even(p, "ps"),
    "dp_proportional_allreduce": lambda p: data_parallel.dp_proportional(p, "allreduce"),
    "dp_proportional_ps": lambda p: data_parallel.dp_proportional(p, "ps"),
    "dp_ratio_lp": lambda p: ratio_lp.rebalance(p, data_parallel.dp_even(p, "allreduce")).strategy,
    "dp_subset_even": lambda p: data_parallel.dp_best_subset(p, "allreduce", proportional=False),
    "dp_subset_proportional": lambda p: data_parallel.dp_best_subset(p, "allreduce", proportional=True),
    "dp_mp_hybrid": hybrid.dp_mp_hybrid,
    "model_parallel_round_robin": model_parallel.round_robin,
    "model_parallel_contiguous": model_parallel.contiguous,
    "heft": list_scheduling.heft,
    "m_etf": list_scheduling.m_etf,
    "m_sct": list_scheduling.m_sct,
    "pipeline": pipeline.pipeline,
    "pipeline_ratio_lp": lambda p: ratio_lp.rebalance(p, pipeline.plan_pipeline(p, log=None).strategy).strategy,
}

RUNTIME_BASELINES = ("horovod_even", "horovod_proportional")
SIMULATED_AS = {"horovod_even": "dp_even_allreduce", "horovod_proportional": "dp_proportional_allreduce"}
REFERENCE = "dp_even_allreduce"  # speed-ups are reported over this one




def baseline_factories(graph, cluster, batch_size: int, max_groups: int, profile=None, grouping=None,
                       include: Optional[Sequence[str]] = None, overheads=None) -> Dict[str, Callable[[], Strategy]]:
    """name -> zero-argument factory for every strategy generator (or those in `include`), over
    one shared Problem (for seeding the policy's pool). profile None: `device_model.cluster_profile`;
    overheads: the cluster's RuntimeOverheads (the planners simulate with them), or None. The
    pipeline planner is quiet here and runs once for both pipeline entries. Names whose generator
    cannot apply (DP-EV with fewer samples than devices) are left out."""
    if profile is None:
        profile = device_model.cluster_profile(graph, cluster)
    problem = make_problem(graph, cluster, profile,
                           max_groups=max_groups, global_batch_size=batch_size, grouping=grouping,
                           overheads=overheads)
    plans: Dict[str, pipeline.PipelinePlan] = {}

    def pipeline_plan(p: Problem) -> pipeline.PipelinePlan:  # planned once, used by both pipeline entries
        if "plan" not in plans:
            plans["plan"] = pipeline.plan_pipeline(p, log=None)
        return plans["plan"]
    quiet = dict(GENERATORS, pipeline=lambda p: pipeline_plan(p).strategy,
                 pipeline_ratio_lp=lambda p: ratio_lp.rebalance(p, pipeline_plan(p).strategy).strategy)
    wanted = [n for n in (include or GENERATORS) if n in GENERATORS]
    if batch_size < cluster.num_devices:
        wanted = [n for n in wanted if not n.startswith("dp_even") and n != "dp_ratio_lp"]
    return {n: (lambda fn=quiet[n]: fn(problem)) for n in wanted}


def names() -> Tuple[str, ...]:
    return tuple(GENERATORS) + RUNTIME_BASELINES


def _check(name: str) -> None:
    if name not in GENERATORS and name not in RUNTIME_BASELINES:
        raise InputError("argument", "baseline", f"unknown baseline {name!r}", f"use one of {list(names())}")


def generate(name: str, problem: Problem) -> Strategy:
    """The strategy of baseline `name` (a runtime baseline gives the strategy it implements)."""
    _check(name)
    # every planner keeps batch norm's minimum per-replica batch (what Problem.evaluate scored)
    return problem.lowerer.legalize(GENERATORS[SIMULATED_AS.get(name, name)](problem))


def is_runtime(name: str) -> bool:
    _check(name)
    return name in RUNTIME_BASELINES


def horovod_batch_sizes(name: str, global_batch_size: int, num_ranks: int,
                        weights: Optional[Sequence[float]] = None) -> Tuple[int, ...]:
    """Per-rank batches of a Horovod baseline: even, or ∝ `weights` (rank speeds; default: even)."""
    _check(name)
    if name == "horovod_even" or weights is None:
        return even_batches(global_batch_size, num_ranks)
    if len(weights) != num_ranks:
        raise InputError("argument", "weights", f"{len(weights)} weights for {num_ranks} ranks", "one per rank")
    return proportional_batches(global_batch_size, weights)


def run_runtime_baseline(name: str, bundle: str, global_batch_size: int, num_ranks: int,
                         weights: Optional[Sequence[float]] = None, **kwargs) -> HorovodResult:
    """Runs horovod_even / horovod_proportional; kwargs go to `run_horovod` (steps,
    warmup_steps, threads_per_rank, device_names, ...)."""
    if not is_runtime(name):
        raise InputError("argument", "baseline", f"{name!r} is a simulated strategy, not a runtime baseline",
                         f"use one of {list(RUNTIME_BASELINES)}")
    return run_horovod(bundle, horovod_batch_sizes(name, global_batch_size, num_ranks, weights), **kwargs)
