"""LLMRLModule: the causal LM (the actor) and an optional critic as an RLlib TorchRLModule.

Lives in the learner. ``forward_train`` takes a right-padded token batch and
returns, for every response position t, the log-probability and entropy of
token t given tokens < t (0 elsewhere: the LM head runs on the response
positions only) and, when the critic is on, the value of the state before
token t. Sampling does not
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

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from torch import nn

from . import packing
from .core.losses import selected_logprobs_and_entropy
from .lora import LoraSettings, adapter_weights
from .lora import wrap as wrap_lora
from .packing import Packed, packed_hidden

ACTOR_PREFIX = "actor."
logger = logging.getLogger(__name__)


def scored_positions(batch: dict[str, Any]) -> torch.Tensor:
    """Which positions' next-token distributions a loss reads  # -> bool [B, T-1].

    Position t-1 scores token t; a loss reads the response tokens only (the batch's
    ``response_mask``), or, without one, every real token after the first."""
    mask = batch.get("response_mask")
    if mask is None:
        mask = batch["attention_mask"]
    return mask[:, 1:] > 0


def response_logprobs(
    model: nn.Module,
    batch: dict[str, Any],
    temperature: float,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    share_prompts: bool = True,
) -> dict[str, torch.Tensor]:
    """``logp`` and ``entropy`` of a causal LM  # -> [B, T] each, fp32, 0 where unscored.

    The transformer runs over the batch, but the LM head only over the positions
    :func:`scored_positions` selects, in checkpointed chunks: no [B, T, V] logits
    tensor is built (for a 150k-token vocabulary that tensor, not the model, is
    what runs out of memory). With ``share_prompts``, rows whose context before
    their first response token is identical (the N rollouts of a group) encode
    that context once (:func:`_shared_prefix_hidden`)."""
    input_ids = batch["input_ids"]  # [B, T]
    chosen = scored_positions(batch)  # [B, T-1]
    head = model.get_output_embeddings()
    with autocast():
        hidden = None
        if share_prompts and not _checkpointing(model):
            hidden = _shared_prefix_hidden(model, input_ids, batch["attention_mask"], chosen)
        if hidden is None and packs(model):
            packed = Packed.from_rows(input_ids, batch["attention_mask"])
            flat = packed_hidden(model.base_model, packed)[0]  # [sum of lengths, H]
            index = F.pad(packed.index, (0, input_ids.shape[1] - packed.index.shape[1]))
            hidden = flat[index[:, :-1][chosen]]  # [N, H], row-major like the padded path
        if hidden is None:
            hidden = model.base_model(
                input_ids=input_ids, attention_mask=batch["attention_mask"]
            ).last_hidden_state[:, :-1][chosen]  # [N, H]
        logp, entropy = selected_logprobs_and_entropy(
            hidden,
            head.weight,
            getattr(head, "bias", None),
            input_ids[:, 1:][chosen],
            temperature=temperature,
        )
    zeros = logp.new_zeros(input_ids.shape)  # [B, T]
    return {
        "logp": zeros.masked_scatter(F.pad(chosen, (1, 0)), logp),
        "entropy": zeros.masked_scatter(F.pad(chosen, (1, 0)), entropy),
    }


def packs(model: nn.Module) -> bool:
    """Whether the model runs packed rows (its attention is :mod:`ragen_rllib.packing`'s)."""
    return getattr(model.config, "_attn_implementation", None) == packing.IMPLEMENTATION


def _checkpointing(model: nn.Module) -> bool:
    """Whether the model recomputes activations (then it keeps no cache to share)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


#: The same, as a method of the actor (FSDP registers it as a forward method).
score_responses = response_logprobs

#: Share prompts only when that saves at least this share of the batch's tokens.
MIN_SHARED_SAVING = 0.2


def _shared_prefix_hidden(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, chosen: torch.Tensor
) -> torch.Tensor | None:
    """Final hidden states at the ``chosen`` positions  # -> [N, H] (row-major order),
    encoding each distinct prefix once; None when that would save too little.

    A row's prefix is everything before its first scored position (its prompt but
    the prompt's last token). The distinct prefixes go through the transformer
    once, left-padded; their keys and values are copied to the rows that share
    them (a differentiable index, so their gradients add up), and each row's
    suffix (the prompt's last token onwards) runs on top with positions that
    continue its prefix. The log-probabilities equal those of the plain path."""
    lengths = attention_mask.sum(1)  # [B]
    if not bool(chosen.any(1).all()):
        return None
    start = chosen.float().argmax(1)  # [B]: first scored position = prefix length
    if int(start.min()) < 1:
        return None
    ids, starts = input_ids.tolist(), start.tolist()
    owner: dict[tuple[int, ...], int] = {}
    row_prefix = [owner.setdefault(tuple(ids[r][: starts[r]]), len(owner)) for r in range(len(ids))]
    saved = sum(starts) - sum(len(p) for p in owner)
    if saved < MIN_SHARED_SAVING * int(lengths.sum()):
        return None
    device = input_ids.device
    prefixes = list(owner)  # in order of first appearance
    width = max(len(p) for p in prefixes)
    pre_ids = torch.zeros((len(prefixes), width), dtype=torch.long)
    pre_mask = torch.zeros((len(prefixes), width), dtype=torch.long)
    for u, p in enumerate(prefixes):  # left-padded: every prefix ends at the last column
        pre_ids[u, width - len(p) :] = torch.tensor(p)
        pre_mask[u, width - len(p) :] = 1
    pre_ids, pre_mask = pre_ids.to(device), pre_mask.to(device)
    pre_pos = (pre_mask.cumsum(-1) - 1).clamp(min=0)
    past = model.base_model(
        input_ids=pre_ids, attention_mask=pre_mask, position_ids=pre_pos, use_cache=True
    ).past_key_values
    rows = torch.tensor(row_prefix, device=device)
    past.batch_select_indices(rows)  # [U, ...] -> [B, ...]

    suffix_len = lengths - start  # [B]
    s_width = int(suffix_len.max())
    j = torch.arange(s_width, device=device)
    source = (start[:, None] + j).clamp(max=input_ids.shape[1] - 1)  # [B, S]
    in_suffix = j[None, :] < suffix_len[:, None]
    suf_ids = torch.where(in_suffix, input_ids.gather(1, source), 0)
    last = chosen.shape[1] - 1
    suf_chosen = chosen.gather(1, source.clamp(max=last)) & in_suffix & (source <= last)
    attention = torch.cat([pre_mask[rows], in_suffix.long()], dim=1)
    hidden = model.base_model(
        input_ids=suf_ids,
        attention_mask=attention,
        position_ids=start[:, None] + j,
        past_key_values=past,
        use_cache=True,
    ).last_hidden_state  # [B, S, H]
    return hidden[suf_chosen]


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
        if cfg.get("pack_sequences", True) and not self.inference_only:
            for net in (self.actor, getattr(self, "critic", None)):
                if net is not None:
                    packing.enable(net)
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
    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        out = self.lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return {"logits": out.logits}

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        if hasattr(self.actor, "score_responses"):  # FSDP: inside the root unit's hooks
            # Shared prompts would run each layer twice per forward, which FSDP's
            # per-layer gradient reduction does not expect: rows are encoded in full.
            out = self.actor.score_responses(
                batch, self.temperature, self._autocast, share_prompts=False
            )
        else:
            out = response_logprobs(self.lm, batch, self.temperature, self._autocast)
        if self.has_critic:
            out["values"] = self.compute_values(batch)
        return out

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """V(state before token t) for every position t  # [B, T] (0 at t=0)."""
        with self._autocast():
            if packs(self.critic):
                packed = Packed.from_rows(batch["input_ids"], batch["attention_mask"])
                hidden = packed.unpack(
                    packed_hidden(self.critic, packed), batch["input_ids"].shape[1]
                )  # [B, T, H], 0 on padding
            else:
                hidden = self.critic(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                ).last_hidden_state  # [B, T, H]
            values = self.value_head(hidden[:, :-1]).squeeze(-1).float()  # [B, T-1]
        return torch.cat([values.new_zeros((values.shape[0], 1)), values], 1)

    # ----- state --------------------------------------------------------------------
    def actor_weights(self) -> dict[str, torch.Tensor]:
        """The actor's weights under the rollout model's names (no copy on the CPU).

        A tied LM head is left out: it is the embedding matrix, which the engine
        already receives (for a 150k-token vocabulary, a fifth of a 0.5B model).
        Under LoRA only the adapter's matrices are returned; the rollout actor
        merges them into the base weights it holds."""
        from .fsdp import full

        if self.lora is not None:  # the adapters only: the engines hold the base model
            return adapter_weights(self.actor)
        n = len(ACTOR_PREFIX)
        tied = bool(getattr(self.actor.config, "tie_word_embeddings", False))
        return {
            k[n:]: full(v).detach().cpu()  # FSDP: gathered by every learner together
            for k, v in self.state_dict().items()
            if k.startswith(ACTOR_PREFIX) and not (tied and k[n:] == "lm_head.weight")
        }

    def get_state(self, components=None, *, not_components=None, inference_only=False, **kwargs):
        from .fsdp import full

        if inference_only:
            return {ACTOR_PREFIX + k: v for k, v in self.actor_weights().items()}
        return {k: full(v).detach().cpu() for k, v in self.state_dict().items()}

    def set_state(self, state: dict[str, Any]) -> None:
        from .fsdp import is_sharded

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
