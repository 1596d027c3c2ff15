"""What every term of StarPO's loss shares: the aggregation of token losses, the
clipped value loss, and what the log-ratio bound (``LOG_RATIO_BOUND``, in
:mod:`ragen_rllib.maths.log_ratio`) does to each term.

Data flow: the RL module's forward pass turns the response positions into
per-token log-probabilities and entropies (:mod:`ragen_rllib.rl_module.logprobs`);
the learner's loss (:mod:`ragen_rllib.learner.loss`) feeds those, the behaviour
log-probs (the rollout's), the advantages and the value targets into the policy
loss of its menu (:mod:`~ragen_rllib.learner.policy_losses`), ``value_loss`` and the
KL estimator of its menu (:mod:`~ragen_rllib.learner.kl_estimators`). Every tensor
is a right-padded [B, T] token tensor and ``mask`` is 1 on generated tokens only:
masked-out tokens never reach a loss or a gradient (``torch.where``, not
multiplication, so even inf/nan there is harmless).

Token log-ratios are clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND] before ``exp``
(GSPO's sequence log-ratio is bounded after its mean instead, and CISPO's log pi is
floored at the bound; see their rows): exp(88.7) overflows float32, and an infinite
ratio turns the backward pass into NaN even where the loss stays finite. Inside the
bound every ratio is exact. A token outside it gets no gradient at all from the
surrogate (the clamp's gradient is 0 there), and its loss term is the bound's ratio
times the advantage. With a positive advantage PPO's clip would have cut that
gradient anyway, and with a negative one the dual clip (on by default) would have.
With ``dual_clip: null`` and a negative advantage it would not: the unclipped
objective's gradient there is |A| e^lr, more than 5e8 |A|, and the bound drops it on
purpose, since a token whose probability rose e^20-fold since sampling is a
numerical fault or a stale sample, and one such gradient would swamp the whole step.
"""

from __future__ import annotations

import torch

LOSS_AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate_loss(
    loss_tok: torch.Tensor,
    mask: torch.Tensor,
    agg: str = "token-mean",
    denom: float | torch.Tensor | None = None,
    norm_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss  # [B, T] -> scalar.

    * ``"token-mean"``: sum over masked tokens / number of masked tokens in the batch;
    * ``"seq-mean-token-sum"``: per-sequence sum, averaged over sequences;
    * ``"seq-mean-token-mean"``: per-sequence masked mean, averaged over sequences;
    * ``"seq-mean-token-sum-norm"``: per-sequence sum divided by the constant
      ``norm_tokens`` (not by the sequence's own length, which favours short
      answers when advantages are negative and long ones when positive: Dr. GRPO),
      averaged over sequences.
    Sequences without any masked token are not counted. ``denom`` overrides the
    divisor (tokens, or sequences for the seq-mean modes), e.g. the whole batch's
    count when a batch is split into micro-batches whose losses are summed.
    """
    m = mask.bool()
    x = torch.where(m, loss_tok, torch.zeros_like(loss_tok))
    if agg == "token-mean":
        total, count = x.sum(), m.sum()
    elif agg in LOSS_AGGS:
        tokens = m.sum(dim=1)  # [B]
        per_seq = x.sum(dim=1)  # [B]
        if agg == "seq-mean-token-mean":
            per_seq = per_seq / tokens.clamp_min(1).to(per_seq.dtype)
        elif agg == "seq-mean-token-sum-norm":
            if not norm_tokens or norm_tokens < 1:
                raise ValueError(f"{agg} needs norm_tokens >= 1, got {norm_tokens!r}")
            per_seq = per_seq / norm_tokens
        total, count = per_seq.sum(), (tokens > 0).sum()
    else:
        raise ValueError(f"agg must be one of {LOSS_AGGS}, got {agg!r}")
    n = count if denom is None else torch.as_tensor(denom, device=x.device)
    return total / n.to(x.dtype).clamp_min(1)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = 0.5,
    agg: str = "token-mean",
    denom: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Clipped critic loss  # [B, T] -> scalar.

    Per token: 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -clip, clip) - R)^2);
    without ``clip`` just 0.5 * (V - R)^2. Taking the max keeps the critic from
    profiting from a step larger than ``clip`` away from the rollout's values.
    """
    old_values = old_values.to(values.dtype)
    returns = returns.to(values.dtype)
    err = (values - returns) ** 2  # [B, T]
    if clip is not None:
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        err = torch.maximum(err, (v_clipped - returns) ** 2)
    return 0.5 * aggregate_loss(err, mask, agg, denom)
