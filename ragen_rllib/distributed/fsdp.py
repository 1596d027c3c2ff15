"""FSDP2 learners (``learner_strategy: fsdp``): per-layer sharding of the LLM module.

With ``num_learners = W >= 2`` every learner holds 1/W of each parameter, of its
gradient and of AdamW's two moments (``torch.distributed.fsdp.fully_shard``),
instead of a full replica as under DDP. What that changes, and where:

- **Sharding** (:func:`shard_module`): every transformer layer of the actor (and
  of the critic) is its own FSDP unit, the rest of each network (embeddings,
  final norm, a tied LM head) is the unit of the network's root, and the
  critic's value head is one more. Parameters are gathered layer by layer in
  the forward and backward passes and gradients reduce-scattered in float32.
- **Mixed precision.** Every unit gets a ``MixedPrecisionPolicy``: with
  ``model_dtype: bfloat16``, ``param_dtype=bfloat16`` (the gathered parameters,
  so the compute, are bfloat16) and ``reduce_dtype=float32``; the shards, and so
  the master weights, their gradients and AdamW's moments, stay float32. The
  value head's unit gathers float32 (it is one [H] vector, and the module runs
  it in float32).
- **The forward entry point.** FSDP gathers a unit's parameters in hooks around
  the unit's ``forward``. The learner scores responses through
  ``actor.score_responses`` (the transformer, then the LM head on the response
  positions only), which is registered as a forward method of the actor's root
  unit, so the embeddings and the tied LM head are gathered around it too.
- **Full state for the engines and for checkpoints** is gathered by all
  learners together (:mod:`ragen_rllib.distributed.learner_group`, and the
  learner's optimizer-state overrides in :mod:`ragen_rllib.learner.fsdp`).

Imports nothing of the project: the module to shard is duck-typed (``actor``,
optional ``critic`` and ``value_head``) and the actor's entry point is passed in.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch


def shard_module(
    module,
    entry_point: tuple[str, Callable],
    param_dtype: torch.dtype | None = None,
) -> None:
    """Apply FSDP2 to an ``LLMRLModule`` in place (see the module docstring).

    ``entry_point = (name, function)``: the function becomes a method ``name`` of the
    actor, run inside the hooks of the actor's root unit. ``param_dtype``: the dtype
    the transformers' parameters are gathered and computed in (None: as stored,
    float32); gradients are reduced in float32 either way."""
    from torch.distributed.fsdp import (
        MixedPrecisionPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for net in (module.actor, getattr(module, "critic", None)):
        if net is None:
            continue
        for layer in net.base_model.layers:
            fully_shard(layer, mp_policy=policy)
        fully_shard(net, mp_policy=policy)
    if getattr(module, "value_head", None) is not None:
        fully_shard(module.value_head, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32))
    # The learner's entry point into the actor, run inside the root unit's hooks.
    name, function = entry_point
    setattr(module.actor, name, types.MethodType(function, module.actor))
    register_fsdp_forward_method(module.actor, name)


def sharded_units(module) -> list[torch.nn.Module]:
    """The roots of an FSDP-sharded module's units (empty if not sharded)."""
    from torch.distributed.fsdp import FSDPModule

    units = [module.actor, getattr(module, "critic", None), getattr(module, "value_head", None)]
    return [u for u in units if isinstance(u, FSDPModule)]
