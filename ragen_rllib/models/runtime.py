"""How a process runs models on its hardware: kernels, the CPU allocator, and whether
bfloat16 pays.

The engine and the learner call these before they run a model:

- :func:`avoid_per_shape_attention_kernels`: PyTorch's scaled-dot-product
  attention may dispatch to cuDNN's kernels on Hopper GPUs, and cuDNN builds
  (compiles) an execution plan for every new input shape. Decoding grows the key
  length by one token per step, and the learner's packed micro-batches change
  shape every pass, so nearly every call meets a new shape: on an H200 the first
  runs spent most of a rollout compiling. FlashAttention and the
  memory-efficient kernels need no per-shape build and stay enabled.
- :func:`keep_freed_memory`: glibc's malloc hands every block above 32 MiB
  back to the kernel when it is freed, so a tensor that size allocated again
  (an LM-head chunk's [positions, vocabulary] logits, a tied embedding's
  gradient) pays its page faults and the kernel's zeroing every time: on 2
  cores a [300, 49152] float32 pass ran at under 1 GB/s. Raising malloc's
  mmap and trim thresholds keeps freed blocks in the process for reuse; the
  runners and learners hand them back once per batch and update
  (``distributed/host_memory.py``), so they do not pile up across iterations.
- :func:`native_bfloat16`: whether this machine computes bfloat16 natively
  (a CUDA GPU that supports it, or a CPU with AVX512-BF16 or AMX); a CPU
  without either emulates it, several times slower than float32.
- :data:`BF16_MIN_HIDDEN`: native bfloat16 is not enough for it to pay on a CPU:
  a narrow model's matrices are too small for the bfloat16 kernels to win back
  what casting costs, so ``model_dtype: auto`` takes it only for wide models.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

logger = logging.getLogger(__name__)

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from malloc's heap and stay there once freed.
HEAP_BLOCKS_UP_TO = 1 << 30


def avoid_per_shape_attention_kernels() -> None:
    """Turn cuDNN's attention off in this process when it sees a GPU (idempotent)."""
    if torch.cuda.is_available():
        torch.backends.cuda.enable_cudnn_sdp(False)


@functools.cache
def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed blocks of up to :data:`HEAP_BLOCKS_UP_TO`
    bytes for reuse in this process (see the module docstring); False where the C
    library is not glibc. Once per process: the setting is process-wide."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        done = libc.mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCKS_UP_TO) == 1
        done &= libc.mallopt(_M_TRIM_THRESHOLD, 2 * HEAP_BLOCKS_UP_TO) == 1
    except (OSError, AttributeError):
        return False
    return bool(done)


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def native_bfloat16(device: str = "cpu", flags: set[str] | None = None) -> bool:
    """Whether ``device`` computes bfloat16 natively: a CUDA GPU that supports it, or
    a CPU with AVX512-BF16 or AMX (``flags``: the CPU's, default this machine's)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    flags = cpu_flags() if flags is None else flags
    return bool(flags & {"avx512_bf16", "amx_bf16"})


#: On a CPU with native bfloat16, ``model_dtype: auto`` takes bfloat16 for models at
#: least this wide (``hidden_size``). Measured on an AVX512-BF16 CPU: the built-in
#: model (128 wide) ran 0.72x as fast in bfloat16, SmolLM2-135M (576) 1.38x; a narrow
#: model's matrices are too small for the bfloat16 kernels to win back the casts.
BF16_MIN_HIDDEN = 512
