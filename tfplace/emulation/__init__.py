"""Heterogeneity on one machine: CPU quotas and pinned cores per task process, and the
malloc settings servers and profiler share."""
