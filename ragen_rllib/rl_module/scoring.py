"""Scoring responses: the log-probability and entropy of each generated token under
a causal LM, without building the [B, T, V] logits.

The RL module's actor (and, under LoRA, the KL reference: the actor with its
adapter switched off) scores a batch through :func:`response_logprobs`: the
transformer runs over the batch (packed rows, each prefix the rows share
encoded once), and the LM head only over the response positions, in
checkpointed chunks (:func:`~ragen_rllib.rl_module.logprobs.selected_logprobs_and_entropy`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ragen_rllib.rl_module import packing
from ragen_rllib.rl_module.logprobs import selected_logprobs_and_entropy
from ragen_rllib.rl_module.packing import Packed, packed_hidden


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
    share_prefixes: bool = True,
) -> dict[str, torch.Tensor]:
    """``logp`` and ``entropy`` of a causal LM  # -> [B, T] each, fp32, 0 where unscored.

    The transformer runs over the batch, but the LM head only over the positions
    :func:`scored_positions` selects, in checkpointed chunks: no [B, T, V] logits
    tensor is built (for a 150k-token vocabulary that tensor, not the model, is
    what runs out of memory). A model that packs rows
    (:func:`~ragen_rllib.rl_module.packing.enable`) runs them end to end, and with
    ``share_prefixes`` encodes each token prefix the rows share once (the system
    message, a group's first prompt, a trajectory's earlier turns)."""
    input_ids = batch["input_ids"]  # [B, T]
    chosen = scored_positions(batch)  # [B, T-1]
    head = model.get_output_embeddings()
    with autocast():
        if packs(model):
            packed = Packed.from_rows(input_ids, batch["attention_mask"], share_prefixes)
            flat = packed_hidden(model.base_model, packed)[0]  # [encoded tokens, H]
            index = F.pad(packed.index, (0, input_ids.shape[1] - packed.index.shape[1]))
            hidden = flat[index[:, :-1][chosen]]  # [N, H], row-major like the padded path
        else:
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
    """Whether the model runs packed rows (its attention is
    :mod:`~ragen_rllib.rl_module.packing`'s)."""
    return getattr(model.config, "_attn_implementation", None) == packing.IMPLEMENTATION
