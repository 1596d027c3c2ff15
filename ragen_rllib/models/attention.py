"""Which of PyTorch's attention kernels the engine and the learner may use on a GPU.

PyTorch's scaled-dot-product attention may dispatch to cuDNN's kernels on Hopper
GPUs, and cuDNN builds (compiles) an execution plan for every new input shape.
Decoding grows the key length by one token per step, and the learner's packed
micro-batches change shape every pass, so nearly every call meets a new shape:
on an H200 the first runs spent most of a rollout compiling. FlashAttention and
the memory-efficient kernels need no per-shape build and stay enabled.
"""

from __future__ import annotations

import torch


def avoid_per_shape_attention_kernels() -> None:
    """Turn cuDNN's attention off in this process when it sees a GPU (idempotent)."""
    if torch.cuda.is_available():
        torch.backends.cuda.enable_cudnn_sdp(False)
