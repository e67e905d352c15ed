"""SIGTERM as an exception, so a stopped run cleans up as it does on Ctrl-C.

Python's default SIGTERM ends the process at once: no `finally` or `with` runs, so the servers and
Horovod ranks a run started (each in its own process group) and its temporary folders stay
behind. `stop_on_sigterm()` makes SIGTERM raise `Terminated` (a KeyboardInterrupt) in the main
thread instead: every context manager on the way out stops its processes and removes its folders,
and training checkpoints as on Ctrl-C. The command lines install it at start-up; a LocalCluster
installs it when it starts, if the process still has the default handler. A Terminated that
reaches the top of a script ends it with one line and status 143 (sys.excepthook), as SIGTERM
would have.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading

TERMINATED_EXIT = 128 + signal.SIGTERM  # 143, as a shell reports a process SIGTERM ended


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM once `stop_on_sigterm()` is installed."""

    def __str__(self) -> str:
        return "stopped by SIGTERM"


def _raise_terminated(signum, frame):
    raise Terminated()


def _exit_terminated(exc_type, exc, tb) -> None:
    """sys.excepthook while the handler is installed: a Terminated that reaches the top of a script
    (every `with` and `finally` on the way has stopped its servers) ends the process as SIGTERM
    would, status 143 after the exit handlers, with one line instead of a traceback."""
    if not issubclass(exc_type, Terminated):
        sys.__excepthook__(exc_type, exc, tb)
        return
    sys.stderr.write("stopped by SIGTERM\n")
    atexit._run_exitfuncs()  # what a normal exit would run (a LocalCluster's close among them)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(TERMINATED_EXIT)


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
    if sys.excepthook is sys.__excepthook__:  # a script's own hook is kept
        sys.excepthook = _exit_terminated
    return True
