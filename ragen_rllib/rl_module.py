"""LLMRLModule: the causal LM (the actor) and an optional critic as an RLlib TorchRLModule.

Lives in the learner. ``forward_train`` takes a right-padded token batch and
returns, for every position t, the log-probability and entropy of token t
given tokens < t (``logp[:, 0]`` is 0: nothing predicts the first token) and,
when the critic is on, the value of the state before token t. Sampling does not
go through this module: the env runners' rollout engines hold their own copy of
the actor and receive its weights after each update.

Precision: the weights are float32 (the optimizer's master copy); with
``dtype="bfloat16"`` the forward passes run under bfloat16 autocast, and the
rollout engines hold bfloat16 copies. State handling: ``get_state`` returns
torch tensors as they are (no numpy conversion, which fails on bfloat16, and no
copies on the CPU); with ``inference_only=True`` only the actor's weights,
under the names the rollout model expects.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from torch import nn

from .core.losses import token_logprobs_and_entropy

ACTOR_PREFIX = "actor."


class LLMRLModule(TorchRLModule, ValueFunctionAPI):
    """model_config keys: ``model_path``, ``dtype`` ("float32"/"bfloat16"), ``critic`` (bool),
    ``temperature`` (the rollout temperature the log-probabilities are computed at)."""

    def setup(self) -> None:
        from transformers import AutoModel, AutoModelForCausalLM

        cfg = self.model_config
        # Weights (and so the optimizer's updates) stay float32: an update of
        # lr=1e-6 is far below bfloat16's resolution and would round away.
        # "bfloat16" is the compute dtype, through autocast, as in mixed precision.
        self.compute_dtype = getattr(torch, cfg.get("dtype", "float32"))
        self.temperature = float(cfg.get("temperature", 1.0)) or 1.0
        self.actor = AutoModelForCausalLM.from_pretrained(cfg["model_path"], dtype=torch.float32)
        self.actor.config.use_cache = False
        self.has_critic = bool(cfg.get("critic", False)) and not self.inference_only
        if self.has_critic:
            # A separate critic network, as in the paper: the same architecture
            # (initialised from the same weights) with a scalar value head.
            self.critic = AutoModel.from_pretrained(cfg["model_path"], dtype=torch.float32)
            hidden = self.critic.config.hidden_size
            self.value_head = nn.Linear(hidden, 1)
            nn.init.normal_(self.value_head.weight, std=1.0 / (hidden + 1))
            nn.init.zeros_(self.value_head.bias)

    def _autocast(self):
        device = next(self.actor.parameters()).device
        return torch.autocast(
            device_type=device.type,
            dtype=self.compute_dtype,
            enabled=self.compute_dtype != torch.float32,
        )

    # ----- parameters by role (the learner gives each its own optimizer) ------------
    def actor_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.actor.parameters() if p.requires_grad]

    def critic_parameters(self) -> list[nn.Parameter]:
        if not self.has_critic:
            return []
        return [*self.critic.parameters(), *self.value_head.parameters()]

    # ----- forward passes ---------------------------------------------------------
    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        out = self.actor(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return {"logits": out.logits}

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        input_ids = batch["input_ids"]  # [B, T]
        with self._autocast():
            logits = self.actor(input_ids=input_ids, attention_mask=batch["attention_mask"]).logits
        logp, entropy = token_logprobs_and_entropy(
            logits[:, :-1], input_ids[:, 1:], temperature=self.temperature
        )  # [B, T-1] each: position t-1 predicts token t
        pad = logp.new_zeros((logp.shape[0], 1))
        out = {"logp": torch.cat([pad, logp], 1), "entropy": torch.cat([pad, entropy], 1)}
        if self.has_critic:
            out["values"] = self.compute_values(batch)
        return out

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """V(state before token t) for every position t  # [B, T] (0 at t=0)."""
        with self._autocast():
            hidden = self.critic(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).last_hidden_state  # [B, T, H]
            values = self.value_head(hidden[:, :-1]).squeeze(-1).float()  # [B, T-1]
        return torch.cat([values.new_zeros((values.shape[0], 1)), values], 1)

    # ----- state --------------------------------------------------------------------
    def actor_weights(self) -> dict[str, torch.Tensor]:
        """The actor's weights under the rollout model's names (no copy on the CPU).

        A tied LM head is left out: it is the embedding matrix, which the engine
        already receives (for a 150k-token vocabulary, a fifth of a 0.5B model)."""
        n = len(ACTOR_PREFIX)
        tied = bool(getattr(self.actor.config, "tie_word_embeddings", False))
        return {
            k[n:]: v.detach().cpu()
            for k, v in self.state_dict().items()
            if k.startswith(ACTOR_PREFIX) and not (tied and k[n:] == "lm_head.weight")
        }

    def get_state(self, components=None, *, not_components=None, inference_only=False, **kwargs):
        if inference_only:
            return {ACTOR_PREFIX + k: v for k, v in self.actor_weights().items()}
        return {k: v.detach().cpu() for k, v in self.state_dict().items()}

    def set_state(self, state: dict[str, Any]) -> None:
        tensors = {k: torch.as_tensor(v) for k, v in state.items()}
        missing, unexpected = self.load_state_dict(tensors, strict=False)
        if unexpected:
            raise ValueError(f"state has keys this module lacks: {unexpected[:5]}")
