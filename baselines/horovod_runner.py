"""Horovod data parallelism for real: the baselines `horovod_even` and `horovod_proportional`.

    result = run_horovod("graph_defs/zoo/tiny_mlp_b16_sgd.json", batch_per_rank=[10, 6],
                         steps=10, warmup_steps=3, threads_per_rank=[(2, 1), (1, 1)])
    result.report              # RunReport: step_times_s, device_names, oom (+ mean_s, std_s)
    result.mean_s, result.std_s, result.warmup_steps, result.steps, result.losses

Launches `horovodrun --gloo -np N -H localhost:N python -m tfplace.baselines.horovod_worker`
on 127.0.0.1 (what each rank runs, and why the step equals the global-batch step, is in
horovod_worker). The launcher runs in its own process group; leaving `run_horovod` by any route
(success, error, timeout, Ctrl-C) terminates that group (SIGTERM, then SIGKILL), so no rank
outlives the call.

Heterogeneity on one machine is emulated with per-rank thread limits (TF intra-/inter-op
threads), the same knob tfplace.runtime.local_cluster uses for its servers.

Batches: `even_batches(B, n)` (remainder to the first ranks) and `proportional_batches(B,
weights)` (tfplace.formats.strategy.proportional_shares, the DP-CP rounding rule).

Step time = wall time of one sess.run of the train op on rank 0 (the all-reduce makes every
rank wait for the slowest, so rank 0's time is the step's); warm-up steps are excluded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Optional, Sequence, Tuple

from tfplace.formats.errors import InputError, TfplaceError
from tfplace.formats.reports import RunReport
from tfplace.formats.strategy import proportional_shares

TERM_GRACE_S = 3.0


class HorovodError(TfplaceError, RuntimeError):
    """horovodrun failed or timed out; the message holds the tail of its output."""


@dataclasses.dataclass(frozen=True)
class HorovodResult:
    """A measured Horovod run. report.step_times_s are rank 0's timed steps."""
    report: RunReport
    warmup_steps: int
    steps: int
    batch_per_rank: Tuple[int, ...]
    threads_per_rank: Optional[Tuple[Tuple[int, int], ...]]
    losses: Tuple[float, ...]
    rank_step_times_s: Tuple[Tuple[float, ...], ...]
    variables_path: str = ""

    @property
    def mean_s(self) -> float:
        return self.report.mean_s

    @property
    def std_s(self) -> float:
        return self.report.std_s

    @property
    def step_times_s(self) -> Tuple[float, ...]:
        return self.report.step_times_s

    @property
    def iteration_time_s(self) -> float:
        return self.report.iteration_time_s


def even_batches(global_batch_size: int, num_ranks: int) -> Tuple[int, ...]:
    if num_ranks < 1 or global_batch_size < num_ranks:
        raise InputError("argument", "global_batch_size", f"{global_batch_size} samples for {num_ranks} ranks",
                         "give at least one sample per rank")
    return tuple(proportional_shares([1.0] * num_ranks, global_batch_size))


def proportional_batches(global_batch_size: int, weights: Sequence[float]) -> Tuple[int, ...]:
    shares = proportional_shares(list(weights), global_batch_size)
    if min(shares) < 1:
        raise InputError("argument", "weights", f"a rank gets 0 samples ({shares})",
                         "use a larger global batch or fewer ranks")
    return tuple(shares)


def horovodrun_path() -> str:
    """horovodrun next to this interpreter, else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    found = here if os.path.exists(here) else shutil.which("horovodrun")
    if not found:
        raise InputError("environment", "horovodrun", "not found", "install horovod (scripts/setup_env.sh)")
    return found


def _terminate(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher's process group, SIGKILL it after TERM_GRACE_S."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, TERM_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_horovod(bundle: str, batch_per_rank: Sequence[int], steps: int = 10, warmup_steps: int = 3,
                threads_per_rank: Optional[Sequence[Tuple[int, int]]] = None, seed: int = 0,
                timeout_s: float = 600.0, out_dir: Optional[str] = None, dump_variables: bool = False,
                device_names: Optional[Sequence[str]] = None, sample_weighted: bool = True) -> HorovodResult:
    """Runs the bundle's training step with Horovod on len(batch_per_rank) local ranks.

    out_dir: where the config, log and rank results go (default: a temporary folder, removed
    unless dump_variables). dump_variables: rank 0 writes variables.npz after the last step.
    sample_weighted=False averages gradients unweighted (only for tests: wrong for uneven batches).
    """
    n = len(batch_per_rank)
    if n < 1 or any(int(b) < 1 for b in batch_per_rank):
        raise InputError("argument", "batch_per_rank", f"got {list(batch_per_rank)}", "give every rank >= 1 sample")
    if steps < 1 or warmup_steps < 0:
        raise InputError("argument", "steps", f"steps={steps}, warmup_steps={warmup_steps}",
                         "use steps >= 1 and warmup_steps >= 0")
    if threads_per_rank is not None and len(threads_per_rank) != n:
        raise InputError("argument", "threads_per_rank", f"{len(threads_per_rank)} entries for {n} ranks",
                         "give one (intra, inter) pair per rank")
    if not os.path.exists(bundle):
        raise InputError(bundle, "", "bundle not found", "give a bundle .json (graph_defs/zoo/...)")
    own_dir = out_dir is None
    work = tempfile.mkdtemp(prefix="tfplace_hvd_") if own_dir else out_dir
    os.makedirs(work, exist_ok=True)
    config = {"bundle": os.path.abspath(bundle), "batch_per_rank": [int(b) for b in batch_per_rank],
              "steps": int(steps), "warmup_steps": int(warmup_steps), "seed": int(seed), "out_dir": work,
              "threads_per_rank": [list(t) for t in threads_per_rank] if threads_per_rank else None,
              "dump_variables": bool(dump_variables), "sample_weighted": bool(sample_weighted)}
    cfg_path = os.path.join(work, "horovod_config.json")
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    cmd = [horovodrun_path(), "--gloo", "-np", str(n), "-H", f"localhost:{n}",
           sys.executable, "-m", "tfplace.baselines.horovod_worker", "--config", cfg_path]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    log_path = os.path.join(work, "horovodrun.log")
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _terminate(proc)
                raise HorovodError(f"horovodrun did not finish in {timeout_s:.0f} s\n{_tail(log_path)}") from None
            finally:
                _terminate(proc)
        if rc != 0:
            raise HorovodError(f"horovodrun exited with status {rc}\n{_tail(log_path)}")
        return _collect(work, n, device_names, dump_variables)
    finally:
        if own_dir and not dump_variables:
            shutil.rmtree(work, ignore_errors=True)


def _tail(path: str, lines: int = 25) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        kept = [ln for ln in f.read().splitlines() if "oneDNN" not in ln and "cpu_feature_guard" not in ln]
    return "\n".join(kept[-lines:])


def _collect(work: str, n: int, device_names, dump_variables: bool) -> HorovodResult:
    ranks = []
    for r in range(n):
        path = os.path.join(work, f"rank_{r}.json")
        if not os.path.exists(path):
            raise HorovodError(f"rank {r} wrote no result\n{_tail(os.path.join(work, 'horovodrun.log'))}")
        with open(path, encoding="utf-8") as f:
            ranks.append(json.load(f))
    r0 = ranks[0]
    names = tuple(device_names) if device_names else tuple(f"rank{r}" for r in range(n))
    report = RunReport(step_times_s=tuple(r0["step_times_s"]), device_names=names)
    threads = tuple(tuple(r["threads"]) for r in ranks) if r0["threads"] else None
    return HorovodResult(report=report, warmup_steps=r0["warmup_steps"], steps=r0["steps"],
                         batch_per_rank=tuple(r0["batch_per_rank"]), threads_per_rank=threads,
                         losses=tuple(r0["losses"]), rank_step_times_s=tuple(tuple(r["step_times_s"]) for r in ranks),
                         variables_path=os.path.join(work, "variables.npz") if dump_variables else "")

