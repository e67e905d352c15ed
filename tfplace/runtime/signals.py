"""SIGTERM as an exception, so a stopped run cleans up as it does on Ctrl-C.

Python's default SIGTERM ends the process at once: no `finally` or `with` runs, so the servers and
Horovod ranks a run started (each in its own process group) and its temporary folders stay
behind. `stop_on_sigterm()` makes SIGTERM raise `Terminated` (a KeyboardInterrupt) in the main
thread instead: every context manager on the way out stops its processes and removes its folders,
and training checkpoints as on Ctrl-C. The command lines install it at start-up; a LocalCluster
installs it when it starts, if the process still has the default handler.
"""

from __future__ import annotations

import signal
import threading


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM once `stop_on_sigterm()` is installed."""


def _raise_terminated(signum, frame):
    raise Terminated()


def stop_on_sigterm(replace: bool = True) -> bool:
    """Installs the SIGTERM handler that raises Terminated; with `replace=False` only over the
    default handler (a user's own handler is kept). Returns whether it is installed. Signals
    can only be set from the main thread: elsewhere it does nothing and returns False."""
    if threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGTERM)
    if current is _raise_terminated:
        return True
    if not replace and current is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _raise_terminated)
    return True
