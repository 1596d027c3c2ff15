"""Padding removal and prefix sharing in the learner: a micro-batch's rows packed into
one sequence, each distinct token prefix encoded once.

Where it sits: :func:`ragen_rllib.rl_module.scoring.response_logprobs` (and the critic's
value pass) run the transformer over a micro-batch of right-padded rows. Packed,
the rows' real tokens are laid end to end in one row of N tokens, with positions
restarting at 0 for each row, so the embeddings, the projections, the MLPs and
the norms (nearly all of the compute) see no padding.

Rows of a batch often begin alike: every row starts with the run's system
message and the env's instructions, a group's N rollouts start from one first
prompt, and with a context window the turns of one trajectory repeat its
history. With ``share_prefixes`` the packing is a prefix tree: rows are sorted
so that rows with a common beginning are neighbours, and a row lays down only
the tokens after its longest common prefix with the row before it (all of them
for the first). A shared token is one packed token that several rows point at
(``Packed.index``); it is embedded, projected and run through the MLPs once,
and every row's attention reads its keys and values. Its gradient is the sum
over the rows that read it, which is what encoding it once per row would give.

Attention must stay within each row. :func:`varlen_attention` does that from the
rows' packed positions: it gathers each row's keys and values (shared ones
included) into a small padded tensor, and the queries of the tokens the row
laid down itself; runs SDPA on them, causal along the row; and scatters the
result back. Attention so costs the sum of the rows' lengths times the tokens
they lay down, not N squared. The function is registered with transformers under
:data:`IMPLEMENTATION`; without packed rows it is transformers' SDPA attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ragen_rllib.maths import batching
from ragen_rllib.maths.batching import MIN_SHARED_SAVING, PrefixTree, prefix_tree

IMPLEMENTATION = "ragen_varlen"


@dataclass
class SharedQueries:
    """The attention's layout when rows share prefixes: each row's own tokens (those
    it lays down) in chunks, each chunk's queries against the row's tokens up to it.

    query_index: [Q, Lq] the packed positions of each chunk's tokens (N: padding),
    so that the real entries, read chunk by chunk, are 0..N-1 in order;
    key_index: [Q, Lk] the packed position of each token of the chunk's row up to
    the chunk's end (N: padding);
    visible: [Q, 1, Lq, Lk] whether the chunk's i-th token sees the row's token j
    (causal along the row)."""

    query_index: torch.Tensor
    key_index: torch.Tensor
    visible: torch.Tensor
    _masks: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)

    def mask(self, dtype: torch.dtype) -> torch.Tensor:
        """``visible`` as an additive mask in ``dtype`` (0 or -inf), made once per
        forward: every layer's attention keeps the same tensor for its backward pass."""
        if dtype not in self._masks:
            zero = torch.zeros((), dtype=dtype, device=self.visible.device)
            self._masks[dtype] = zero.masked_fill(~self.visible, float("-inf"))
        return self._masks[dtype]


@dataclass
class Packed:
    """A micro-batch's rows laid end to end, shared prefixes once.

    ids, positions: [1, N]; index: [R, L] the packed position of row r's token t
    (N for padding), L the longest row; lengths: [R]; shared: the attention's
    layout when rows share tokens (None: every row lays down all its tokens)."""

    ids: torch.Tensor
    positions: torch.Tensor
    index: torch.Tensor
    lengths: torch.Tensor
    shared: SharedQueries | None = None

    @property
    def encoded(self) -> int:
        """Tokens the transformer runs (N)."""
        return int(self.ids.shape[1])

    @classmethod
    def from_rows(
        cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, share_prefixes: bool = False
    ) -> Packed:
        """Pack right-padded rows (``attention_mask`` is 1 on each row's first tokens);
        with ``share_prefixes``, each distinct prefix once (see the module docstring),
        when that saves at least :data:`MIN_SHARED_SAVING` of the tokens."""
        lengths = attention_mask.sum(1)  # [R]
        if share_prefixes and input_ids.shape[0] > 1:
            tree = prefix_tree(input_ids.cpu().numpy(), lengths.cpu().numpy())
            total = int(lengths.sum())
            if total - tree.encoded >= MIN_SHARED_SAVING * total:
                return cls._shared(input_ids, lengths, tree)
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

    @classmethod
    def _shared(cls, input_ids: torch.Tensor, lengths: torch.Tensor, tree: PrefixTree) -> Packed:
        device = input_ids.device
        n = tree.encoded
        # Each row's own tokens, in chunks: a row that lays down a whole prompt does
        # not make every row's queries as wide as its own.
        chunks = []  # (row, first own position, end)
        for r in tree.order:
            own, length = tree.own[r], tree.lengths[r]
            size = max(batching.QUERY_CHUNK, -(-(length - own) // batching.MAX_CHUNKS_PER_ROW))
            for start in range(own, length, size):
                chunks.append((r, start, min(start + size, length)))
        lq = max(end - start for _, start, end in chunks)
        lk = max(end for _, _, end in chunks)
        query_index = np.full((len(chunks), lq), n, dtype=np.int64)
        key_index = np.full((len(chunks), lk), n, dtype=np.int64)
        first = np.zeros(len(chunks), dtype=np.int64)
        for c, (r, start, end) in enumerate(chunks):
            query_index[c, : end - start] = tree.index[r, start:end]
            key_index[c, :end] = tree.index[r, :end]
            first[c] = start
        i = np.arange(lq)[None, :, None]
        j = np.arange(lk)[None, None, :]
        visible = j <= first[:, None, None] + i  # [Q, Lq, Lk]: causal along the row
        flat_ids = np.zeros(n, dtype=np.int64)
        flat_pos = np.zeros(n, dtype=np.int64)
        ids = input_ids.cpu().numpy()
        for r, start, end in chunks:
            at = tree.index[r, start:end]
            flat_ids[at] = ids[r, start:end]
            flat_pos[at] = np.arange(start, end)
        return cls(
            ids=torch.from_numpy(flat_ids)[None].to(device),
            positions=torch.from_numpy(flat_pos)[None].to(device),
            index=torch.from_numpy(tree.index).to(device),
            lengths=lengths,
            shared=SharedQueries(
                query_index=torch.from_numpy(query_index).to(device),
                key_index=torch.from_numpy(key_index).to(device),
                visible=torch.from_numpy(visible)[:, None].to(device),
            ),
        )

    def unpack(self, packed: torch.Tensor, width: int) -> torch.Tensor:
        """[1, N, ...] back to right-padded rows [R, width, ...] (0 on padding); a
        shared token's value goes to every row that holds it."""
        flat = packed[0]
        flat = torch.cat([flat, flat.new_zeros((1, *flat.shape[1:]))])  # row N: padding
        rows = flat[self.index]  # [R, L, ...]
        if rows.shape[1] < width:
            pad = rows.new_zeros((rows.shape[0], width - rows.shape[1], *rows.shape[2:]))
            rows = torch.cat([rows, pad], 1)
        return rows


def _gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[1, h, N, d] -> [R, h, L, d] by packed positions ``index  # [R, L]``; N (padding)
    reads a zero row."""
    x = torch.cat([x[0], x.new_zeros((x.shape[1], 1, x.shape[3]))], dim=1)  # [h, N+1, d]
    return x[:, index].transpose(0, 1)


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
    n = query.shape[2]
    gqa = key.shape[1] != query.shape[1]
    shared = packed.shared
    if shared is None:
        index = packed.index  # [R, L]
        q, k, v = (_gather_rows(x, index) for x in (query, key, value))
        # Right padding: a real query's causal window holds only real keys, so no mask.
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=gqa
        )  # [R, heads, L, d]
        real = index < n
    else:
        q = _gather_rows(query, shared.query_index)  # [Q, heads, Lq, d]: own tokens only
        k, v = (_gather_rows(x, shared.key_index) for x in (key, value))  # [Q, kv, Lk, d]
        if gqa and q.is_cuda:  # CUDA's kernels that take a mask do not group query heads
            k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))
            gqa = False
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=shared.mask(q.dtype), dropout_p=dropout, scale=scaling,
            enable_gqa=gqa,
        )  # [Q, heads, Lq, d]  # fmt: skip
        real = shared.query_index < n
    flat = out.transpose(1, 2)[real]  # [N, heads, d], in packed order (row-major)
    return flat[None], None


AttentionInterface.register(IMPLEMENTATION, varlen_attention)
AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def unsupported(config) -> str | None:
    """Why a model with this transformers ``config`` cannot run packed rows (layers
    other than full attention, a sliding window or a logit soft-cap, which
    :func:`varlen_attention` does not apply), or None when it can."""
    types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in types):
        return f"its layers are not all full attention ({sorted(set(types))})"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "its attention has a sliding window"
    if getattr(config, "attn_logit_softcapping", None):
        return "its attention soft-caps the logits"
    return None


def enable(model) -> bool:
    """Switch a transformers model to this attention; False if it cannot take it
    (:func:`unsupported`, or no transformers attention interface)."""
    if unsupported(model.config) is not None:
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
