"""Host memory that a rollout or an update freed, handed back to the system.

A process that generates and trains on CPU frees gigabytes every iteration
(the keys and values of a batch's decoding, a minibatch's activations and
logits), of sizes that differ from one batch to the next. The engine and the
learner ask glibc to keep freed blocks of up to 1 GiB for reuse
(``models/runtime.py``'s ``keep_freed_memory``: reuse saves the page faults
within a pass), which also means glibc never hands any back by itself. Across
iterations the kept blocks fragment and pile up: the resident memory of a run
climbs for many iterations although what is alive stays the same (measured on
the TicTacToe self-play example with SmolLM2 on CPU: 3.0 GB after a trim,
7.8 GB without one, after four iterations). :func:`trim_host_heap` asks glibc
to return its free memory (``malloc_trim``) once a batch or an update is done,
so each pass still reuses its own blocks: the runners call it after each batch,
the learners after each update, and the algorithm after the format warm-up.
Where the C library is not glibc it does nothing, and ``RAGEN_RLLIB_TRIM_HEAP=0``
in a process's environment turns it off there (an allocator of your own
preloaded, or the baseline of ``bench/bench_host_memory.py``).

Imports nothing of the project.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library, or none found)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # musl, macOS: no malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_host_heap() -> bool:
    """Return the C heap's free memory to the system; True when some was returned,
    False when none was or the C library cannot (not glibc)."""
    if os.environ.get("RAGEN_RLLIB_TRIM_HEAP", "1") == "0":
        return False
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
