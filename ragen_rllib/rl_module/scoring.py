"""Scoring responses: the log-probability and entropy of each generated token under
a causal LM, without building the [B, T, V] logits.

The RL module's actor (and, under LoRA, the KL reference: the actor with its
adapter switched off) scores a batch through :func:`response_logprobs`: the
transformer runs over the batch (packed rows, or each distinct prompt of a
group once), and the LM head only over the response positions, in
checkpointed chunks (:func:`~ragen_rllib.rl_module.logprobs.selected_logprobs_and_entropy`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ragen_rllib.maths.batching import MIN_SHARED_SAVING
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
    """Whether the model runs packed rows (its attention is
    :mod:`~ragen_rllib.rl_module.packing`'s)."""
    return getattr(model.config, "_attn_implementation", None) == packing.IMPLEMENTATION


def _checkpointing(model: nn.Module) -> bool:
    """Whether the model recomputes activations (then it keeps no cache to share)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


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
