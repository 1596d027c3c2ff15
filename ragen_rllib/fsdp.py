"""FSDP2 learners (``learner_strategy: fsdp``): per-layer sharding of the LLM module.

With ``num_learners = W >= 2`` every learner holds 1/W of each parameter, of its
gradient and of AdamW's two moments (``torch.distributed.fsdp.fully_shard``),
instead of a full replica as under DDP. What that changes, and where:

- **Sharding** (:func:`shard_module`): every transformer layer of the actor (and
  of the critic) is its own FSDP unit, the rest of each network (embeddings,
  final norm, a tied LM head) is the unit of the network's root, and the
  critic's value head is one more. Parameters are gathered layer by layer in
  the forward and backward passes and gradients reduce-scattered in float32.
  With ``model_dtype: bfloat16`` the gathered parameters are bfloat16 (the
  shards, the gradients' reduction and the optimizer stay float32).
- **The forward entry point.** FSDP gathers a unit's parameters in hooks around
  the unit's ``forward``. The learner scores responses through
  ``actor.score_responses`` (the transformer, then the LM head on the response
  positions only), which is registered as a forward method of the actor's root
  unit, so the embeddings and the tied LM head are gathered around it too.
- **Full state for the engines and for checkpoints.** A shard is not a
  weight: the actor's weights for the rollout engines, the module's state and
  the optimizers' state in a checkpoint are gathered to full tensors, which is
  a collective call that every learner must make. RLlib asks one learner for
  the state; :class:`StarPOLearnerGroup` asks all of them and keeps the first
  answer, and saves a checkpoint's learner state through that gathered state
  (not through one learner actor, as RLlib would). Restoring hands every
  learner the full state, and each keeps its shard.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from ray.rllib.core import COMPONENT_LEARNER
from ray.rllib.core.learner.learner_group import LearnerGroup


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


def shard_module(module, param_dtype: torch.dtype | None = None) -> None:
    """Apply FSDP2 to an ``LLMRLModule`` in place (see the module docstring)."""
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
        fully_shard(module.value_head, mp_policy=policy)
    # The learner's entry point into the actor, run inside the root unit's hooks.
    from .rl_module import score_responses

    module.actor.score_responses = types.MethodType(score_responses, module.actor)
    register_fsdp_forward_method(module.actor, "score_responses")


def sharded_units(module) -> list[torch.nn.Module]:
    """The roots of an FSDP-sharded module's units (empty if not sharded)."""
    from torch.distributed.fsdp import FSDPModule

    units = [module.actor, getattr(module, "critic", None), getattr(module, "value_head", None)]
    return [u for u in units if isinstance(u, FSDPModule)]


class StarPOLearnerGroup(LearnerGroup):
    """RLlib's LearnerGroup, except that with FSDP learners the state is gathered
    by all of them together (each call is a collective), and the first answer kept."""

    @property
    def _gathering(self) -> bool:
        return not self.is_local and self.config.learner_strategy == "fsdp"

    def get_checkpointable_components(self):
        # RLlib saves a remote learner through one actor, which alone cannot gather
        # its shards: with FSDP the learner's state goes into this group's own state.
        return [] if self._gathering else super().get_checkpointable_components()

    def get_state(self, components=None, *, not_components=None, **kwargs):
        if not self._gathering:
            return super().get_state(components, not_components=not_components, **kwargs)
        state = {}
        if self._check_component(COMPONENT_LEARNER, components, not_components):
            comps = self._get_subcomponents(COMPONENT_LEARNER, components)
            not_comps = self._get_subcomponents(COMPONENT_LEARNER, not_components)
            results = self._worker_manager.foreach_actor(
                lambda w: w.get_state(comps, not_components=not_comps, **kwargs)
            )
            state[COMPONENT_LEARNER] = self._get_results(results)[0]
        return state


def build_learner_group(
    config, *, env=None, spaces=None, rl_module_spec=None, placement_group=None
):
    """``AlgorithmConfig.build_learner_group`` with :class:`StarPOLearnerGroup`."""
    if rl_module_spec is None:
        rl_module_spec = config.get_multi_rl_module_spec(env=env, spaces=spaces)
    return StarPOLearnerGroup(
        config=config.copy(), module_spec=rl_module_spec, placement_group=placement_group
    )


__all__ = [
    "StarPOLearnerGroup",
    "agreed_count",
    "build_learner_group",
    "full",
    "is_sharded",
    "shard_module",
    "sharded_units",
]
