"""Recorded runs (--record) and their replay (--replay): a run's profiles, overheads,
strategies and every timed step, re-simulated later with the current simulator."""

from __future__ import annotations

import os
import statistics

from .models import MAX_GROUPS, MODELS, ROOT, bundle_path
from .report import summary

RECORD_FORMAT = "tfplace.fidelity_record"


def typed_overheads(overheads, source: str = "measured runtime overheads"):
    """The RuntimeOverheads of a measured or recorded overheads object (None: none)."""
    from tfplace.overheads.model import overheads_from_json
    return None if overheads is None else overheads_from_json(overheads, source)


def simulate_with(graph, grouping, cluster, strategy, profile, overheads, sim_options=None):
    """The SimReport of `strategy`: lowered, through the runtime-overhead pass, simulated."""
    from tfplace.baselines.problem import with_overheads
    from tfplace.lowering.lower import lower
    from tfplace.simulator import SimOptions, simulate
    placed = with_overheads(lower(graph, grouping, cluster, strategy, profile), cluster, overheads)
    return simulate(placed, cluster, sim_options or SimOptions())


def replay(paths, verbose: bool = False) -> int:
    """Re-simulates recorded runs (--record) with the current simulator and compares with their
    recorded real steps: model changes can be judged on several runs of this noisy machine
    without timing anything again. Same strategies, profiles and runtime overheads as recorded
    (per model; records before the overheads were measured per model have one set for all);
    `verbose` (--verbose) also prints each strategy's sim / real, recorded and now."""
    from tfplace.baselines.problem import make_problem
    from tfplace.formats.cluster import load_cluster
    from tfplace.ir.loader import load_op_graph
    from tfplace.formats.jsonio import FieldReader
    from tfplace.formats.profile import profile_from_reader
    from tfplace.formats.strategy import strategy_from_reader
    for path in paths:
        rec = FieldReader.from_file(path, expected_format=RECORD_FORMAT).data
        cluster = load_cluster(os.path.join(ROOT, "clusters", rec["cluster"]))
        print(f"{path}: {rec['cluster']}, recorded {rec['date']}")
        for model, m in rec["models"].items():
            if not os.path.exists(os.path.join(ROOT, m["bundle"])) and model in MODELS:
                bundle_path(model)  # a zoo bundle this checkout has not exported yet
            graph = load_op_graph(os.path.join(ROOT, m["bundle"]))
            batch = int(graph.reference_batch_size)
            profile = profile_from_reader(FieldReader(m["profile"], f"{path}: models.{model}.profile"))
            overheads = typed_overheads(m.get("overheads", rec.get("overheads")), f"{path}: models.{model}.overheads")
            grouping = make_problem(graph, cluster, profile, max_groups=MAX_GROUPS, global_batch_size=batch).grouping
            rows = []
            for r in m["rows"]:
                strategy = strategy_from_reader(FieldReader(r["strategy"], f"{path}: {model}/{r['name']}"))
                sim = simulate_with(graph, grouping, cluster, strategy, profile, overheads).iteration_time_s
                rows.append((r["name"], statistics.median(r["real_s"]), sim, min(r["real_s"])))
                if verbose:
                    real = rows[-1][1]
                    print(f"    {model}/{r['name']}: real {real * 1e3:.2f} ms, sim/real {sim / real:.2f} "
                          f"(recorded {r['sim_s'] / real:.2f})")
            med, worst, tau = summary(rows)
            then, _, _ = summary([(r["name"], statistics.median(r["real_s"]), r["sim_s"], 0) for r in m["rows"]])
            print(f"  {model}: median {med:.1%} (recorded {then:.1%}), worst {worst:.1%}, tau {tau:.2f}")
    return 0
