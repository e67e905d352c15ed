"""Running a rewritten step: local TF server processes on loopback, the worker entry point,
and the step runner that warms up, times and traces iterations."""
