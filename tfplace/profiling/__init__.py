"""Profiles: per-op costs measured from step stats, fits over batch sizes, link and collective
costs measured on a cluster, the roofline device model, a structural profile (no costs, for passes
that need only the tasks), kernel replay and the Grappler check."""
