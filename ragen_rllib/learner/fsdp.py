"""What a learner does differently under ``learner_strategy: fsdp``.

A mixin for :class:`~ragen_rllib.learner.starpo_learner.StarPOTorchLearner`, overriding
RLlib's TorchLearner where sharded parameters change the job:

- the module is sharded (:func:`~ragen_rllib.distributed.fsdp.shard_module`)
  before its optimizers are made (``configure_optimizers_for_module`` calls
  ``_shard_before_optimizers``), so
  that they hold the shards, and is not wrapped in DDP;
- gradients are clipped by their global norm over the shards (RLlib takes norms
  tensor by tensor, which a shard does not have);
- the optimizers' state is gathered to full tensors for a checkpoint, and each
  learner keeps its shard of it on restore.
"""

from __future__ import annotations

import torch
from ray.rllib.core import COMPONENT_OPTIMIZER
from ray.rllib.utils import force_list

from ragen_rllib.distributed.collectives import full
from ragen_rllib.distributed.fsdp import shard_module, sharded_units
from ragen_rllib.records.metrics import learner_log
from ragen_rllib.rl_module.scoring import response_logprobs


class FSDPLearnerMixin:
    @property
    def _fsdp(self) -> bool:
        return self.config.learner_strategy == "fsdp" and self.config.num_learners > 1

    def _shard_before_optimizers(self, module_id: str) -> None:
        """Under FSDP, shard the module (once) so that the optimizers made next hold
        the shards."""
        if self._fsdp and not sharded_units(self.module[module_id]):
            bf16 = self.config.model_dtype_used == "bfloat16"
            shard_module(
                self.module[module_id],
                entry_point=("score_responses", response_logprobs),
                param_dtype=torch.bfloat16 if bf16 else None,
            )

    def _make_modules_ddp_if_necessary(self) -> None:
        if not self._fsdp:
            super()._make_modules_ddp_if_necessary()

    def _sharded_units(self) -> list[torch.nn.Module]:
        if not self._fsdp:
            return []
        return [u for mid in self.module.keys() for u in sharded_units(self.module[mid])]

    def postprocess_gradients_for_module(self, *, module_id, config=None, module_gradients_dict):
        if not self._fsdp:
            return super().postprocess_gradients_for_module(
                module_id=module_id, config=config, module_gradients_dict=module_gradients_dict
            )
        config = config or self.config.get_config_for_module(module_id)
        for name, optimizer in self.get_optimizers_for_module(module_id):
            grads = self.filter_param_dict_for_optimizer(module_gradients_dict, optimizer)
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if config.grad_clip and grads:
                norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
                learner_log(
                    self.metrics, module_id, f"gradients_{name}_global_norm", full(norm).item()
                )
        return module_gradients_dict

    def get_state(self, components=None, *, not_components=None, **kwargs):
        """RLlib's learner state; under FSDP the optimizers' state is gathered to full
        tensors on the CPU (every learner calls this; the first, rank 0, gets the
        state and the others an empty one)."""
        if not self._fsdp:
            return super().get_state(components, not_components=not_components, **kwargs)
        skip = [COMPONENT_OPTIMIZER, *force_list(not_components)]
        state = super().get_state(components, not_components=skip, **kwargs)
        if self._check_component(COMPONENT_OPTIMIZER, components, not_components):
            state[COMPONENT_OPTIMIZER] = self._full_optimizer_state()
        return state

    def set_state(self, state) -> None:
        if not self._fsdp or COMPONENT_OPTIMIZER not in state:
            return super().set_state(state)
        super().set_state({k: v for k, v in state.items() if k != COMPONENT_OPTIMIZER})
        self._set_full_optimizer_state(state[COMPONENT_OPTIMIZER])

    def _named_module_optimizers(self):
        """(full name, module id, optimizer) of every optimizer, as RLlib names them."""
        return [
            (f"{mid}_{name}", mid, optim)
            for mid in self.module.keys()
            for name, optim in self.get_optimizers_for_module(mid)
        ]

    def _full_optimizer_state(self):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {
            name: {
                "module_id": mid,
                "fsdp_state": get_optimizer_state_dict(self.module[mid], optim, options=options),
            }
            for name, mid, optim in self._named_module_optimizers()
        }

    def _set_full_optimizer_state(self, state) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        optimizers = {name: optim for name, _, optim in self._named_module_optimizers()}
        for name, entry in state.items():
            if "fsdp_state" not in entry:
                raise ValueError(
                    f"optimizer {name!r}: the checkpoint was not written by FSDP learners; "
                    "restore it with the learner_strategy it was written with"
                )
            set_optimizer_state_dict(
                self.module[entry["module_id"]],
                optimizers[name],
                optim_state_dict=entry["fsdp_state"],
                options=StateDictOptions(full_state_dict=True),
            )
