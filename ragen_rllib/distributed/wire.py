"""Weights on the wire: learner state dicts as NumPy arrays for Ray's object store.

Ray stores NumPy arrays out of band: ``ray.put`` writes them once into shared
memory and ``ray.get`` in a runner maps them without a copy. Torch tensors are
pickled instead, several times slower for a large model (measured in
``bench/bench_weight_sync.py``). bfloat16 has no NumPy dtype, so its bits travel
as int16 and are viewed back.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

_BITS = {torch.bfloat16: torch.int16}


def to_wire(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """{name: tensor} -> {name: (array, dtype name)} (CPU, contiguous)."""
    out = {}
    for name, tensor in state.items():
        t = tensor.detach().cpu().contiguous()
        out[name] = (
            t.view(_BITS.get(t.dtype, t.dtype)).numpy(),
            str(t.dtype).removeprefix("torch."),
        )
    return out


def from_wire(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_wire`; tensors share the arrays' (read-only) memory,
    which is fine for ``load_state_dict``, which only reads them."""
    out = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, (array, dtype) in state.items():
            t = torch.from_numpy(np.asarray(array))
            want = getattr(torch, dtype)
            out[name] = t.view(want) if want in _BITS else t
    return out


def is_wire(state: dict[str, Any]) -> bool:
    return bool(state) and isinstance(next(iter(state.values())), tuple)
