"""trim_host_heap: glibc's free memory goes back to the system (resident memory
falls), and RAGEN_RLLIB_TRIM_HEAP=0 leaves it where it is. Each case runs in a fresh
interpreter, so that nothing else of the suite's heap is in the measure. No Ray."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ragen_rllib.distributed.host_memory import _malloc_trim

pytestmark = pytest.mark.skipif(_malloc_trim() is None, reason="the C library is not glibc")

#: 2000 blocks of 60 KB (below glibc's mmap threshold: on the heap), every page
#: touched; every other block freed, so the free memory lies between live blocks
#: where the heap's top cannot shrink, then the heap trimmed; prints the resident
#: MB before and after the trim, and what trim_host_heap returned.
SCRIPT = """
import ctypes, ctypes.util, os
from ragen_rllib.distributed.host_memory import trim_host_heap
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
blocks = [libc.malloc(60_000) for _ in range(2000)]
for b in blocks:
    ctypes.memset(b, 1, 60_000)
for b in blocks[::2]:
    libc.free(b)
before = rss_mb()
returned = trim_host_heap()
print(before, rss_mb(), returned)
"""


def _run(**env) -> tuple[float, float, str]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return float(out[0]), float(out[1]), out[2]


def test_trim_returns_the_free_blocks_between_live_ones():
    before, after, returned = _run(RAGEN_RLLIB_TRIM_HEAP="1")
    # 1000 freed blocks of 60 KB: about 57 MB free, nearly all of it in whole pages.
    assert before - after > 40, (before, after)
    assert returned == "True"


def test_turned_off_by_the_environment_variable():
    before, after, returned = _run(RAGEN_RLLIB_TRIM_HEAP="0")
    assert abs(before - after) < 5, (before, after)
    assert returned == "False"
