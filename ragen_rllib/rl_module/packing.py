"""Padding removal in the learner: the rows of a micro-batch packed into one sequence.

Where it sits: :func:`ragen_rllib.rl_module.scoring.response_logprobs` (and the critic's
value pass) run the transformer over a micro-batch of right-padded rows. Packed,
the rows' real tokens are laid end to end in one row of N = sum of lengths
tokens, with positions restarting at 0 for each row, so the embeddings, the
projections, the MLPs and the norms (nearly all of the compute) see no padding.

Attention must stay within each row. :func:`varlen_attention` does that from the
rows' boundaries (``cu_seqlens``, as in FlashAttention's varlen interface): it
gathers each row's queries, keys and values into a small padded tensor, runs
causal SDPA on it and scatters the result back, so attention costs the sum of
the rows' squares rather than N squared (a dense block-diagonal mask would be
N x N). Rows are sorted by length within a micro-batch, so the padding inside
attention is small. The function is registered with transformers under
:data:`IMPLEMENTATION`; without packed rows it is transformers' SDPA attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

IMPLEMENTATION = "ragen_varlen"


@dataclass
class Packed:
    """A micro-batch's rows laid end to end.

    ids, positions: [1, N]; index: [R, L] the packed position of row r's token t
    (N for padding), L the longest row; lengths: [R]."""

    ids: torch.Tensor
    positions: torch.Tensor
    index: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def from_rows(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Packed:
        """Pack right-padded rows (``attention_mask`` is 1 on each row's first tokens)."""
        lengths = attention_mask.sum(1)  # [R]
        width = int(lengths.max())
        t = torch.arange(width, device=input_ids.device)
        real = t[None, :] < lengths[:, None]  # [R, L]
        starts = torch.cumsum(lengths, 0) - lengths  # [R]
        n = int(lengths.sum())
        index = torch.where(real, starts[:, None] + t[None, :], n)  # [R, L]
        return cls(
            ids=input_ids[:, :width][real][None, :],
            positions=t.expand_as(index)[real][None, :],
            index=index,
            lengths=lengths,
        )

    def unpack(self, packed: torch.Tensor, width: int) -> torch.Tensor:
        """[1, N, ...] back to right-padded rows [R, width, ...] (0 on padding)."""
        flat = packed[0]
        flat = torch.cat([flat, flat.new_zeros((1, *flat.shape[1:]))])  # row N: padding
        rows = flat[self.index]  # [R, L, ...]
        if rows.shape[1] < width:
            pad = rows.new_zeros((rows.shape[0], width - rows.shape[1], *rows.shape[2:]))
            rows = torch.cat([rows, pad], 1)
        return rows


def varlen_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """Causal attention within each packed row (``packed`` keyword), else SDPA.

    query [1, heads, N, d], key and value [1, kv_heads, N, d]. Returns
    [1, N, heads, d], as transformers expects."""
    packed: Packed | None = kwargs.pop("packed", None)
    if packed is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    index = packed.index  # [R, L]

    def rows(x):  # [1, h, N, d] -> [R, h, L, d]; padding reads a zero row
        x = torch.cat([x[0], x.new_zeros((x.shape[1], 1, x.shape[3]))], dim=1)  # [h, N+1, d]
        return x[:, index].transpose(0, 1)

    q, k, v = rows(query), rows(key), rows(value)
    # Right padding: a real query's causal window holds only real keys, so no mask.
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        dropout_p=dropout,
        is_causal=True,
        scale=scaling,
        enable_gqa=k.shape[1] != q.shape[1],
    )  # [R, heads, L, d]
    real = index < query.shape[2]
    flat = out.transpose(1, 2)[real]  # [N, heads, d], in packed order (row-major)
    return flat[None], None


AttentionInterface.register(IMPLEMENTATION, varlen_attention)
AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def enable(model) -> bool:
    """Switch a transformers model to this attention; False if it cannot take it
    (no transformers attention interface, layers other than full attention, a
    sliding window or a logit soft-cap, which this attention does not apply)."""
    config = model.config
    types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in types):
        return False
    window = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    if window or getattr(config, "attn_logit_softcapping", None):
        return False
    try:
        model.set_attn_implementation(IMPLEMENTATION)
    except (ValueError, NotImplementedError, AttributeError, ImportError):
        return False
    return True


#: Given as the attention mask of a packed forward: transformers passes a 4-D mask on
#: as it is (every architecture's mask builder does), so it builds no [N, N] mask of its
#: own; :func:`varlen_attention` reads the rows from ``packed`` and never this mask.
_NO_MASK = torch.ones((1, 1, 1, 1), dtype=torch.bool)


def packed_hidden(model, packed: Packed) -> torch.Tensor:
    """Final hidden states of the packed rows  # [1, N, H]."""
    return model(
        input_ids=packed.ids,
        position_ids=packed.positions,
        attention_mask=_NO_MASK.to(packed.ids.device),
        packed=packed,
    ).last_hidden_state
