"""Collectives between learners: sums and maxima over all of them, and full tensors
from shards.

With one learner every function returns its input (no process group is needed),
so the learner and the learner connector call them unconditionally. Imports
nothing of the project.
"""

from __future__ import annotations

from typing import Any

import torch


def is_sharded(tensor: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a shard (a collective: every learner must call it)."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor


def learner_count() -> int:
    """How many learners share the process group (1 without one)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _reduced(tensor: torch.Tensor, device: torch.device | str, op) -> torch.Tensor:
    """``tensor`` reduced over all learners with ``op`` (one all-reduce on ``device``;
    ``tensor`` itself with a single learner)."""
    import torch.distributed as dist

    if learner_count() < 2:
        return tensor
    value = tensor.to(device)
    dist.all_reduce(value, op=op)
    return value.to(tensor.device)


def agreed_count(count: int, device: torch.device | str = "cpu") -> int:
    """The largest ``count`` over all learners. ``device``: the learner's (NCCL
    reduces GPU tensors)."""
    import torch.distributed as dist

    return int(_reduced(torch.tensor([count]), device, dist.ReduceOp.MAX).item())


def summed_over_learners(tensor: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """``tensor`` summed over all learners. ``device``: the learner's (NCCL reduces
    GPU tensors)."""
    import torch.distributed as dist

    return _reduced(tensor, device, dist.ReduceOp.SUM)


def maximum_over_learners(tensor: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """``tensor``'s elementwise maximum over all learners."""
    import torch.distributed as dist

    return _reduced(tensor, device, dist.ReduceOp.MAX)
