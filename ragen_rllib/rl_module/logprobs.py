"""Per-token log-probabilities and entropies of a forward pass, in chunks.

The RL module's forward (:mod:`~ragen_rllib.rl_module.scoring`) scores each
response token with :func:`selected_logprobs_and_entropy`, which runs the LM head
on the scored positions only; :func:`token_logprobs_and_entropy` does the same from
full logits. Both upcast one chunk at a time to fp32 and checkpoint each chunk when
gradients are needed, so at most one chunk's [c, V] softmax is alive.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32 (a copy); fp32/fp64 unchanged."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _logp_entropy_chunk(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    x = _upcast(logits)  # [B, c, V]: only this chunk is ever upcast
    if temperature != 1.0:
        x = x / temperature
    # Per chunk this is exactly the naive computation, so results match it bit for bit.
    logsm = torch.log_softmax(x, dim=-1)  # [B, c, V]
    logp = logsm.gather(-1, targets[..., None]).squeeze(-1)  # [B, c]
    # A masked entry (logit -inf) has p = 0 and log p = -inf: its term is 0, not
    # 0 * -inf = NaN. The finite terms are the naive products, bit for bit.
    finite_logsm = torch.where(torch.isfinite(logsm), logsm, torch.zeros_like(logsm))
    entropy = -(logsm.exp() * finite_logsm).sum(dim=-1)  # [B, c]
    return logp, entropy


def token_logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, chunk: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / temperature)[targets] and the entropy  # -> ([B, T], [B, T]).

    Outputs are fp32 (fp64 for fp64 logits).

    ``logits``  # [B, T, V]: position t scores ``targets[:, t]`` (shift before calling).
    The sequence axis is processed in chunks of about ``chunk`` tokens (B * c <= chunk),
    so only one chunk's fp32 [B, c, V] copy exists at a time. When gradients are
    needed each chunk is checkpointed: backward recomputes the chunk instead of
    keeping every chunk's softmax alive until then.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B = logits.shape[0]
    c = max(1, chunk // max(B, 1))  # tokens along T per chunk
    use_ckpt = torch.is_grad_enabled() and logits.requires_grad
    logps, entropies = [], []
    # split() (not slicing) so backward assembles the logits' gradient once.
    for lg, tg in zip(logits.split(c, dim=1), targets.split(c, dim=1), strict=True):
        if use_ckpt:
            lp, ent = checkpoint(_logp_entropy_chunk, lg, tg, temperature, use_reentrant=False)
        else:
            lp, ent = _logp_entropy_chunk(lg, tg, temperature)
        logps.append(lp)
        entropies.append(ent)
    return torch.cat(logps, dim=1), torch.cat(entropies, dim=1)


def _head_chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.nn.functional.linear(hidden, weight, bias)  # [c, V]
    return _logp_entropy_chunk(logits, targets, temperature)


def selected_logprobs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(head(hidden) / temperature)[targets] and the entropy, for selected
    positions only  # hidden [N, H], targets [N] -> ([N], [N]), fp32.

    ``hidden`` holds the final hidden states of just the positions whose next token
    is scored (the response tokens), so the LM head ``(weight [V, H], bias)`` runs
    on N rows instead of every position of the batch. It runs in chunks of
    ``chunk`` rows; with gradients each chunk is checkpointed, so at most one
    chunk's [chunk, V] logits exist at a time, in the forward and in the backward
    pass. Per row this is exactly :func:`token_logprobs_and_entropy` on the full
    logits.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros((0,), dtype=torch.float32)
        return empty, empty
    use_ckpt = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    logps, entropies = [], []
    for h, t in zip(hidden.split(chunk), targets.split(chunk), strict=True):
        if use_ckpt:
            lp, ent = checkpoint(_head_chunk, h, weight, bias, t, temperature, use_reentrant=False)
        else:
            lp, ent = _head_chunk(h, weight, bias, t, temperature)
        logps.append(lp)
        entropies.append(ent)
    return torch.cat(logps), torch.cat(entropies)
