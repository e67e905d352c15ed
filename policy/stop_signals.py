"""Stopping a long run at a safe point: the first SIGINT or SIGTERM is held until the run reaches
one (training: after the step under way, tfplace.policy.train_lib; pre-training: between searches
and updates, tfplace.policy.pretrain), a second acts at once. A signal that lands inside a
TensorFlow call would leave its state half-updated; a step cut half-way would leave a run's pools,
logs and policy out of step with each other."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Callable, Iterator, List

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def held_stop_signals(notice: str, at_once: Callable[[int, object], None]) -> Iterator[List[int]]:
    """While inside: the first SIGTERM or SIGINT is appended to the yielded list, for the caller to
    act on at its next safe point, with the line "<SIGNAME>: <notice>" on stderr; a second calls
    at_once(signum, frame) at once. The handlers there before are put back on leaving; an ignored
    signal stays ignored. Signal handlers exist only in the main thread; elsewhere nothing is held
    (the list stays empty)."""
    held: List[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return

    def handler(signum: int, frame) -> None:
        if held:
            at_once(signum, frame)
            return
        held.append(signum)
        with contextlib.suppress(OSError):  # os.write, not a logger: the handler may interrupt a write to it
            os.write(2, f"\n{signal.Signals(signum).name}: {notice}\n".encode())

    # A signal ignored (a background job's SIGINT) stays ignored, and one whose handler was set
    # outside Python (getsignal None) is left alone: neither could be put back as it was.
    taken = [s for s in STOP_SIGNALS if signal.getsignal(s) not in (signal.SIG_IGN, None)]
    previous = {s: signal.signal(s, handler) for s in taken}
    try:
        yield held
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
