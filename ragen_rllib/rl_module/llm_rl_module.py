"""LLMRLModule: the causal LM (the actor) and an optional critic as an RLlib TorchRLModule.

Lives in the learner. ``forward_train`` takes a right-padded token batch and
returns, for every response position t, the log-probability and entropy of
token t given tokens < t (0 elsewhere: the LM head runs on the response
positions only) and, when the critic is on, the value of the state before
token t. Sampling does not
go through this module: the env runners' rollout engines hold their own copy of
the actor and receive its weights after each update.

Precision (``dtype``, the config's ``model_dtype``): every weight that trains is
float32, the optimizer's master copy, so AdamW's moments are float32 too. With
``dtype="bfloat16"`` the forward passes run under bfloat16 autocast (matrix
products in bfloat16; the log-softmax, entropy and value head in float32), frozen
weights (LoRA's base model) are held in bfloat16, and the weights sent to the
rollout engines are cast to bfloat16 before they leave the learner. State
handling: ``get_state`` returns torch tensors as they are (no numpy conversion,
which fails on bfloat16, and no copies on the CPU); with ``inference_only=True``
only the actor's weights, under the names the rollout model expects (what the
algorithm pushes to the env runners' engines).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from torch import nn

from ragen_rllib.console import no_progress_bars, quiet
from ragen_rllib.distributed.collectives import full, is_sharded
from ragen_rllib.models.lora import LoraSettings, adapter_weights
from ragen_rllib.models.lora import wrap as wrap_lora
from ragen_rllib.models.runtime import avoid_per_shape_attention_kernels, keep_freed_memory
from ragen_rllib.rl_module import packing
from ragen_rllib.rl_module.packing import Packed, packed_hidden
from ragen_rllib.rl_module.scoring import packs, response_logprobs

#: The actor's parameter names in the module's state dict start with this.
_ACTOR = "actor."
logger = logging.getLogger(__name__)


quiet()


class LLMRLModule(TorchRLModule, ValueFunctionAPI):
    """model_config keys: ``model_path``, ``dtype`` ("float32"/"bfloat16"), ``critic`` (bool),
    ``temperature`` (the rollout temperature the log-probabilities are computed at)."""

    def setup(self) -> None:
        from transformers import AutoModel, AutoModelForCausalLM

        cfg = self.model_config
        avoid_per_shape_attention_kernels()
        keep_freed_memory()  # a CPU learner's large tensors are reused, not page-faulted
        # Trained weights (and so the optimizer's updates and moments) stay float32:
        # an update of lr=1e-6 is far below bfloat16's resolution and would round
        # away. "bfloat16" is the compute dtype, through autocast, as in mixed precision.
        self.compute_dtype = getattr(torch, cfg.get("dtype", "float32"))
        self.temperature = float(cfg.get("temperature", 1.0)) or 1.0
        with no_progress_bars():
            self.actor = AutoModelForCausalLM.from_pretrained(
                cfg["model_path"], dtype=torch.float32
            )
        self.actor.config.use_cache = False
        self.has_critic = bool(cfg.get("critic", False)) and not self.inference_only
        if self.has_critic:
            # A separate critic network, as in the paper: the same architecture
            # (initialised from the same weights) with a scalar value head.
            with no_progress_bars():
                self.critic = AutoModel.from_pretrained(cfg["model_path"], dtype=torch.float32)
            hidden = self.critic.config.hidden_size
            self.value_head = nn.Linear(hidden, 1)
            nn.init.normal_(self.value_head.weight, std=1.0 / (hidden + 1))
            nn.init.zeros_(self.value_head.bias)
        if cfg.get("pack_sequences", True) and not self.inference_only:
            for net in (self.actor, getattr(self, "critic", None)):
                if net is not None:
                    packing.enable(net)
        #: each token prefix the rows of a pass share is encoded once (packed rows only)
        self.shares_prefixes = bool(cfg.get("share_prefixes", True)) and packs(self.actor)
        if cfg.get("gradient_checkpointing") and not self.inference_only:
            for net in (self.actor, getattr(self, "critic", None)):
                if net is not None:
                    net.gradient_checkpointing_enable({"use_reentrant": False})
        self.lora = LoraSettings.from_dict(cfg.get("lora"))
        if self.lora is not None:
            # Adapters on the actor (and the critic's transformer); the value head
            # stays fully trainable.
            self.actor = wrap_lora(self.actor, self.lora)
            if self.has_critic:
                self.critic = wrap_lora(self.critic, self.lora)
            # The frozen base is held in the compute dtype: it never takes an update,
            # autocast rounds its matrices to that dtype in every forward anyway, and
            # it is most of the module's memory. The adapters stay float32.
            for net in (self.actor, getattr(self, "critic", None)):
                if net is not None:
                    hold_frozen_in(net, self.compute_dtype)
        if not self.inference_only:
            trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
            total = sum(p.numel() for p in self.parameters())
            logger.info("LLM module: %d of %d parameters trainable", trainable, total)

    @property
    def lm(self) -> nn.Module:
        """The actor's causal LM (under LoRA: the base model with its adapters in place)."""
        return self.actor.get_base_model() if self.lora is not None else self.actor

    def _autocast(self):
        device = next(self.lm.parameters()).device
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
        critic = [p for p in self.critic.parameters() if p.requires_grad]
        return [*critic, *self.value_head.parameters()]

    # ----- forward passes ---------------------------------------------------------
    # Only the learner runs this module (the env runners sample with their rollout
    # engines), so RLlib's inference and exploration passes are left as RLlib has them.
    def score(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The actor's ``logp`` and ``entropy`` of the batch's response tokens  # [B, T]
        (:func:`~ragen_rllib.rl_module.scoring.response_logprobs`). Under FSDP every
        learner must call it together (each forward gathers the layers)."""
        share = self.shares_prefixes
        if hasattr(self.actor, "score_responses"):  # FSDP: inside the root unit's hooks
            return self.actor.score_responses(batch, self.temperature, self._autocast, share)
        return response_logprobs(self.lm, batch, self.temperature, self._autocast, share)

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        out = self.score(batch)
        if self.has_critic:
            out["values"] = self.compute_values(batch)
        return out

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """V(state before token t) for every position t  # [B, T] (0 at t=0)."""
        with self._autocast():
            if packs(self.critic):
                packed = Packed.from_rows(
                    batch["input_ids"], batch["attention_mask"], self.shares_prefixes
                )
                hidden = packed.unpack(
                    packed_hidden(self.critic, packed), batch["input_ids"].shape[1]
                )  # [B, T, H], 0 on padding
            else:
                hidden = self.critic(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                ).last_hidden_state  # [B, T, H]
        # The value head in float32 (one [H] -> 1 product): a bfloat16 value carries
        # 8 significant bits, too coarse for the value loss's small differences.
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            values = self.value_head(hidden[:, :-1].float()).squeeze(-1)  # [B, T-1]
        return torch.cat([values.new_zeros((values.shape[0], 1)), values], 1)

    # ----- state --------------------------------------------------------------------
    def actor_weights(self) -> dict[str, torch.Tensor]:
        """The actor's weights under the rollout model's names, in the compute dtype
        (the engines' dtype): with bfloat16, half the bytes of the float32 master
        weights travel (with float32, no copy on the CPU).

        A tied LM head is left out: it is the embedding matrix, which the engine
        already receives (for a 150k-token vocabulary, a fifth of a 0.5B model).
        Under LoRA only the adapter's matrices are returned, in float32 (a few MB);
        the rollout actor merges them into its float32 base weights, so the merged
        weight is rounded once, when the engine loads it."""
        if self.lora is not None:  # the adapters only: the engines hold the base model
            return adapter_weights(self.actor)
        n = len(_ACTOR)
        tied = bool(getattr(self.actor.config, "tie_word_embeddings", False))
        dtype = self.compute_dtype
        return {
            # FSDP: each shard is cast, then gathered by every learner together.
            k[n:]: full(v.detach().to(dtype)).cpu()
            for k, v in self.state_dict().items()
            if k.startswith(_ACTOR) and not (tied and k[n:] == "lm_head.weight")
        }

    def get_state(self, components=None, *, not_components=None, inference_only=False, **kwargs):
        """The module's full state, or with ``inference_only`` what the rollout engines
        load: :meth:`actor_weights`, under the rollout model's own names."""
        if inference_only:
            return self.actor_weights()
        return {k: full(v).detach().cpu() for k, v in self.state_dict().items()}

    def set_state(self, state: dict[str, Any]) -> None:
        tensors = {k: torch.as_tensor(v) for k, v in state.items()}
        unexpected = sorted(set(tensors) - set(self.state_dict()))
        if unexpected:
            raise ValueError(f"state has keys this module lacks: {unexpected[:5]}")
        if any(is_sharded(p) for p in self.parameters()):
            # FSDP: every learner gets the full state and keeps its shard of it.
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
            )

            set_model_state_dict(
                self, tensors, options=StateDictOptions(full_state_dict=True, strict=False)
            )
            return
        self.load_state_dict(tensors, strict=False)


def hold_frozen_in(net: nn.Module, dtype: torch.dtype) -> None:
    """Cast ``net``'s frozen floating-point parameters to ``dtype`` in place (trainable
    ones stay as they are; a parameter shared by two modules, a tied head, is cast
    once and stays shared)."""
    for p in net.parameters():
        if not p.requires_grad and p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
