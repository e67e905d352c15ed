"""Keeps a process's freed memory in its heap (glibc malloc): every step then finds its pages.

    from tfplace.emulation.allocator import steady_allocator
    settings = steady_allocator()   # before TensorFlow allocates; {} where malloc is not glibc's

TensorFlow's CPU tensors come from malloc. glibc's malloc hands memory back to the kernel on
free (trimming the heap top, unmapping a large chunk) under thresholds it moves as the process
runs, so whether a step's tensors land on pages the process still holds depends on the order
of its first frees. On this project's 2-core VM, 4 of 32 fresh processes running ResNet-50's
single-device step (b8, 32x32, one thread pinned to a core) with glibc's defaults settled into
taking 2,300-21,000 minor page faults per step, for as long as they ran, and took 5-20% longer
than the others of their batch (e.g. 164 against 137 ms); the rest took 0-1. One of 6 more, started
with settings glibc only partly took, took 53,000 and 40% longer. With all three settings below, 0 of
28 did (`benchmarks/process_spread.py --model resnet50 --allocator default|steady`: 2 of 10 and
0 of 10, medians spread 1.137 and 1.087 max / min). A profiler process and a server process that
differ in that way differ in speed by as much.

The server tasks (tfplace.runtime.worker) and the profiler (tfplace.cli.profile) call
`steady_allocator` first thing, so the profile is measured under the conditions the steps run
in. Fixed thresholds end glibc's moving ones (mallopt(3)):
  * M_MMAP_THRESHOLD 32 MiB (glibc's largest): chunks up to it come from the heap, not from a
    mapping of their own that each free returns;
  * M_TRIM_THRESHOLD 2 GiB - 1: the heap top is not handed back below that;
  * M_TOP_PAD 256 MiB: the heap grows in large steps (address space; pages cost only when used).
The price is memory a process does not give back between steps, at most its peak.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Dict

# mallopt(3) parameter numbers (glibc malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD_BYTES = (1 << 31) - 1  # mallopt takes an int
TOP_PAD_BYTES = 256 << 20


def steady_allocator() -> Dict[str, int]:
    """Sets the fixed thresholds above in this process's glibc malloc. Returns those it set
    ({"mmap_threshold_bytes": ..., ...}; empty where the C library is not glibc).
    Call it before the process allocates its tensors; later calls change nothing more."""
    name = ctypes.util.find_library("c")
    if not name:
        return {}
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # glibc's own: other C libraries' mallopt take other numbers
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to set
        return {}
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = {"mmap_threshold_bytes": (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
                "trim_threshold_bytes": (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
                "top_pad_bytes": (_M_TOP_PAD, TOP_PAD_BYTES)}
    return {key: value for key, (param, value) in settings.items() if mallopt(param, value) == 1}
