"""Errors that tfplace raises for bad input.

Every user-facing error names where the bad value came from (a file or an argument), the field
inside it, what is wrong, and what would fix it, so that a user never has to read a traceback from
deep inside the library:

    cluster.json: devices[2].memory_bytes: must be > 0, got -16000000000. Fix: give the device
    memory in bytes, e.g. 16000000000 for a 16 GB GPU.
"""

from __future__ import annotations


class TfplaceError(Exception):
    """Base class of every error tfplace raises on purpose."""


class InputError(TfplaceError, ValueError):
    """A bad value in a file or argument.

    Attributes:
      source: the file (or "argument --x", "strategy") the value came from.
      field: dotted/indexed path of the field inside it, e.g. ``devices[2].memory_bytes``; may be
        empty when the whole source is bad (e.g. a truncated file).
      problem: what is wrong, in a few words.
      fix: what the user should do about it.
    """

    def __init__(self, source: str, field: str, problem: str, fix: str):
        self.source = str(source)
        self.field = field
        self.problem = problem
        self.fix = fix
        where = f"{self.source}: {field}" if field else self.source
        super().__init__(f"{where}: {problem}. Fix: {fix}")


class UnsupportedGraphError(InputError):
    """A graph uses a construct tfplace cannot place (e.g. while loops in the training step)."""


#: How TensorFlow's graph importer says a shape value is past int32: a batch so large that a size
#: the step computes (e.g. batch x features in a reshape) overflows.
INT32_OVERFLOW = "out of int32 range"


def size_overflow_problem(batch_size: int) -> str:
    """The problem, in words, of a batch size at which the step's int32 sizes overflow (for an
    InputError about the batch size)."""
    return f"is {batch_size}: a size the training step computes overflows TensorFlow's int32 shape values"
