"""StarPOTorchLearner: the token-level PPO/GRPO loss on RLlib's TorchLearner.

Receives the batch built by the learner connector pipeline
(:mod:`ragen_rllib.connectors`): tokens, the response mask (1 on generated
tokens only), the rollout's log-probabilities, advantages and, with a critic,
value targets. The loss is the clipped policy surrogate (asymmetric clip,
dual clip, token-mean), minus the entropy bonus, plus an optional KL term to the
frozen initial model and the clipped value loss. Actor and critic have their
own AdamW optimizers and learning rates; RLlib clips the gradients per
optimizer by global norm.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

from .core.advantages import masked_mean
from .core.losses import kl_penalty, policy_loss, token_logprobs_and_entropy, value_loss


class StarPOTorchLearner(TorchLearner):
    def build(self) -> None:
        super().build()
        self._reference = None
        if self.config.kl_coeff > 0:
            from transformers import AutoModelForCausalLM

            cfg = self.config.llm_module_config()
            self._reference = AutoModelForCausalLM.from_pretrained(
                cfg["model_path"], dtype=getattr(torch, cfg["dtype"])
            ).to(self._device)
            self._reference.eval().requires_grad_(False)

    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        module = self._module[module_id]
        module = module.unwrapped() if hasattr(module, "unwrapped") else module
        actor_params = module.actor_parameters()
        self.register_optimizer(
            module_id=module_id,
            optimizer_name="actor",
            optimizer=torch.optim.AdamW(actor_params, weight_decay=config.weight_decay),
            params=actor_params,
            lr_or_lr_schedule=config.lr,
        )
        critic_params = module.critic_parameters()
        if critic_params:
            self.register_optimizer(
                module_id=module_id,
                optimizer_name="critic",
                optimizer=torch.optim.AdamW(critic_params, weight_decay=config.weight_decay),
                params=critic_params,
                lr_or_lr_schedule=config.critic_lr,
            )

    def compute_loss_for_module(
        self, *, module_id: str, config, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        mask = batch["response_mask"].float()  # [B, T], 1 on generated tokens
        logp_new = fwd_out["logp"]  # [B, T]
        pg_loss, stats = policy_loss(
            logp_new,
            batch["old_logp"],
            batch["advantages"],
            mask,
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            dual_clip=config.dual_clip,
            agg=config.loss_agg,
        )
        entropy = masked_mean(fwd_out["entropy"], mask)
        total = pg_loss - config.entropy_coeff * entropy
        logs = {"policy_loss": pg_loss, "entropy": entropy, **stats}

        if self._reference is not None:
            with torch.no_grad():
                ref_logits = self._reference(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                ).logits
                ref_logp, _ = token_logprobs_and_entropy(
                    ref_logits[:, :-1],
                    batch["input_ids"][:, 1:],
                    temperature=config.temperature or 1.0,
                )
                ref_logp = torch.cat([ref_logp.new_zeros((ref_logp.shape[0], 1)), ref_logp], 1)
            kl = masked_mean(kl_penalty(logp_new, ref_logp, kind=config.kl_estimator), mask)
            total = total + config.kl_coeff * kl
            logs["kl_to_reference"] = kl

        if "values" in fwd_out:
            vf_loss = value_loss(
                fwd_out["values"],
                batch["old_values"],
                batch["value_targets"],
                mask,
                clip=config.vf_clip,
            )
            total = total + config.vf_loss_coeff * vf_loss
            logs["value_loss"] = vf_loss
            logs["value_mean"] = masked_mean(fwd_out["values"].detach(), mask)

        logs["response_tokens"] = mask.sum()
        for key, value in logs.items():
            value = value.detach() if isinstance(value, torch.Tensor) else value
            self.metrics.log_value((module_id, key), value, window=1)
        return total
