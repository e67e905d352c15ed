"""The simulator-fidelity bench (`python benchmarks/fidelity_bench.py`), by role:

  models         the zoo models at their sizes, the baselines timed, random strategies
  cluster_setup  the 3-task local cluster: homogeneous, or emulated heterogeneous (HETERO)
  conditions     what the simulator is given, measured a pass before each round
                 (RoundConditions: profiles and their medians, the comm fit, the runtime overheads
                 from tfplace.profiling.overheads_probe)
  timing         bench_model: warm-up, round-robin rounds of timed steps, the simulated times
  record         --record / --replay: RECORD_FORMAT, replay, typed_overheads, simulate_with
  report         summary statistics, the conditions table, the markdown page

`benchmarks/fidelity_bench.py` is the command line and re-exports the names its callers use.
"""
