"""Is the machine itself running slow? A per-core speed probe for real timings.

On a shared host (a cloud VM whose cores share physical cores with other tenants) a core's speed
changes while a benchmark runs. On the 2-core development VM a fixed pure-Python loop pinned to
one core took 0.74-0.88 ms per repetition for seconds at a time and 1.30-1.42 ms (1.8x) for
others, with nothing else of ours running; the tiny transformer's single-task step followed it
(3.1-3.8 ms in the quick phases, 4.1-5.7 ms in the slow ones). Such a phase during an entry's
timed steps moves its row by up to 2x and makes every comparison in the run (tfplace against
Horovod, simulated against real) depend on when each entry ran.

`SpeedWatch` probes each core the run uses just before and just after a timed window. A core's
quiet speed is its fastest probe of the run; a window whose probes show a core more than
`DISTURBED_SLOWDOWN` slower than that was measured on a disturbed machine. activate marks such
rounds, leaves them out of a row's median where the row has a quiet round, and says how many there
were (tfplace.cli.activate). The probe cannot see a phase that starts and ends inside the window;
it catches the ones that overlap its edges. On that VM slow phases were common enough (in five
series of about 1.5 s, a core was slow in 13-73% of their blocks) that most rounds of a run were
disturbed: running them again would not find quiet ones, so activate reports them instead.

    watch = SpeedWatch(cores=[0, 1])
    before = watch.probe()
    ...timed steps...
    after = watch.probe()
    watch.slowdown(before, after)   # 1.0 on a quiet machine, ~1.8 in a slow phase
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

# A probe slower than its core's quiet speed by more than this marks a disturbed window. Quiet
# probes spread up to 1.19x on the development VM; its slow phases ran 1.7-1.9x.
DISTURBED_SLOWDOWN = 1.3
PROBE_LOOP = 20_000  # iterations of one repetition: about 0.75 ms on a quiet development core
PROBE_REPS = 15


def _workload(n: int = PROBE_LOOP) -> int:
    """A fixed amount of pure-Python work (no allocation beyond small ints, no I/O)."""
    s = 0
    for i in range(n):
        s += i * i
    return s


def probe_core_s(core: int, reps: int = PROBE_REPS, clock: Callable[[], float] = time.perf_counter) -> float:
    """Mean seconds of one repetition of a fixed workload run `reps` times on `core` (the calling
    thread is pinned to it for the probe and given its former cores back after). The mean, not
    the median: a core shared with another busy process runs each repetition at full speed and
    only the time between them, when the other one runs, shows the sharing."""
    former = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        t0 = clock()
        for _ in range(reps):
            _workload()
        return (clock() - t0) / reps
    finally:
        os.sched_setaffinity(0, former)


def slowdown_of(probes: Iterable[Mapping[int, float]], reference_s: Mapping[int, float]) -> float:
    """The largest ratio of a probe's seconds to its core's quiet seconds over every probe given
    (1.0: every core at its quiet speed). Cores without a reference are ignored."""
    worst = 1.0
    for probe in probes:
        for core, seconds in probe.items():
            ref = reference_s.get(core)
            if ref:
                worst = max(worst, seconds / ref)
    return worst


SPACED_PROBES, SPACED_GAP_S = 10, 0.2  # SpeedWatch.probe_spaced
MAX_UNPINNED_CORES = 8  # probed when no device is pinned: about 12 ms per core and probe


def cores_of(cluster) -> list:
    """The cores a run on `cluster` uses: those its devices' emulation pins, else the first
    MAX_UNPINNED_CORES cores this process may use; only cores this process may be pinned to."""
    allowed = os.sched_getaffinity(0)
    pinned = sorted({c for d in getattr(cluster, "devices", ()) if d.emulation is not None
                     for c in (d.emulation.cpus or ())})
    return [c for c in pinned if c in allowed] if pinned else sorted(allowed)[:MAX_UNPINNED_CORES]


class SpeedWatch:
    """Probes `cores` and keeps each one's quiet seconds (its fastest probe so far) and every probe
    taken (`probes`, oldest first), so that a stretch of work can be judged by all the probes
    taken during it (slowdown_since).

    probe_fn(core) -> seconds is tfplace's probe by default (tests give a fake)."""

    def __init__(self, cores: Sequence[int], probe_fn: Optional[Callable[[int], float]] = None):
        self.cores = list(cores)
        self._probe_fn = probe_fn or probe_core_s
        self.reference_s: Dict[int, float] = {}
        self.probes: List[Dict[int, float]] = []

    def probe(self, keep: bool = True) -> Dict[int, float]:
        """{core: seconds} now; lowers each core's quiet seconds when this probe is faster. `keep`
        False: not added to `probes` (a probe taken while tfplace's own servers may still load the
        cores: it can find a quiet speed, but a slow one says nothing about the machine)."""
        out = {c: float(self._probe_fn(c)) for c in self.cores}
        for c, s in out.items():
            self.reference_s[c] = min(s, self.reference_s.get(c, s))
        if keep:
            self.probes.append(out)
        return out

    def calibrate(self, probes: int = 3) -> None:
        """A few probes before the run, so that the first window has a reference."""
        for _ in range(probes):
            self.probe()

    def probe_spaced(self, count: int = SPACED_PROBES, gap_s: float = SPACED_GAP_S) -> None:
        """`count` probes `gap_s` apart (2 s by default). A shared core's slow phase lasts a second
        or more, so a burst of probes may fall inside one; probes spread over seconds find the
        quiet speed that tells one machine from another (machine_probe_s)."""
        for _ in range(count):
            time.sleep(gap_s)
            self.probe()

    def slowdown(self, *probes: Mapping[int, float]) -> float:
        """slowdown_of(probes) against the quiet speeds known now."""
        return slowdown_of(probes, self.reference_s)

    def slowdown_since(self, mark: int) -> float:
        """The median slowdown of the probes kept since `mark` (len(self.probes) when the stretch
        began): a slow phase of the machine, not one probe's spike (one probe in a dozen read
        1.2-1.8x slow on an idle machine here). 1.0 without probes."""
        kept = self.probes[mark:]
        return float(statistics.median(self.slowdown(p) for p in kept)) if kept else 1.0


def slow_note(slowdown: float, what: str = "they") -> str:
    """What to add to a line that reports something measured (`what`: "they", "its costs") when the
    machine's probes saw it `slowdown` times slower than its quiet speed meanwhile (more than
    DISTURBED_SLOWDOWN): the figures may then be high. "" otherwise."""
    if slowdown <= DISTURBED_SLOWDOWN:
        return ""
    return f" (the machine ran {slowdown:.2f}x slower than its quiet speed meanwhile: {what} may be high)"


def machine_probe_s(reference_s: Mapping[int, float]) -> Optional[float]:
    """One number for the machine's speed: the median over its probed cores of their quiet seconds
    (SpeedWatch.reference_s); None when nothing was probed. A runtime-overheads file keeps it
    (tfplace.overheads.model, machine_probe_s) so that a later run can tell whether it runs on a
    machine of the same speed."""
    return float(statistics.median(reference_s.values())) if reference_s else None


# Cores of one machine quietly spread up to 1.19x (DISTURBED_SLOWDOWN's note); two machines whose
# quiet probes differ by more than this differ in speed.
MACHINE_MISMATCH = DISTURBED_SLOWDOWN


def speed_mismatch_note(measured_s: Optional[float], now_s: Optional[float], what: str, fix: str) -> Optional[str]:
    """A line to print when `what` (e.g. "the runtime overheads in F") was measured on a machine
    whose quiet probe took `measured_s` and this machine's takes `now_s`, and the two differ by more
    than MACHINE_MISMATCH: its CPU figures then do not describe this machine. None when they agree
    or either is unknown (a file from before the probe was recorded)."""
    if not measured_s or not now_s:
        return None
    ratio = now_s / measured_s
    if 1 / MACHINE_MISMATCH <= ratio <= MACHINE_MISMATCH:
        return None
    if ratio > 1:
        how = f"{ratio:.2f}x faster than this one: simulated times will read low"
    else:
        how = f"{1 / ratio:.2f}x slower than this one: simulated times will read high"
    return (f"note: {what} were measured on a machine whose cores ran {how} (quiet probe {measured_s * 1e3:.2f} "
            f"against {now_s * 1e3:.2f} ms); {fix}")
