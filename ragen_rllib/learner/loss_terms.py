"""Token-level losses of StarPO: clipped policy surrogate, clipped value loss, KL, entropy.

Data flow: the RL module's forward pass turns the response positions into
per-token log-probabilities and entropies (:mod:`ragen_rllib.rl_module.logprobs`);
the learner's loss
(:mod:`ragen_rllib.learner.loss`) feeds those, the behaviour log-probs (the
rollout's), the advantages and the value targets into ``policy_loss``,
``value_loss`` and ``kl_penalty``. Every tensor is a right-padded [B, T] token
tensor and ``mask`` is 1 on generated tokens only: masked-out tokens never
reach a loss or a gradient (``torch.where``, not multiplication, so even
inf/nan there is harmless).

Log-ratios are clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND] before ``exp``:
exp(88.7) overflows float32, and an infinite ratio turns the backward pass into
NaN even where the loss stays finite. Inside the bound every ratio is exact. A
token outside it gets no gradient at all from the surrogate (the clamp's
gradient is 0 there), and its loss term is the bound's ratio times the
advantage. In most cases PPO's clipping would have cut that gradient anyway;
the exception is a negative advantage with a log-ratio above the bound and no
dual clip (``dual_clip: null``), where the unclipped objective's gradient is
|A| e^lr, more than 5e8 |A|. The code drops it on purpose: a token whose
probability rose e^20-fold since sampling is a numerical fault or a stale
sample, and one such gradient would swamp the whole step (``dual_clip`` bounds
the same case by design).
"""

from __future__ import annotations

import torch

from ragen_rllib.maths.advantages import masked_mean

#: Log-ratios (log pi - log pi_behaviour, log pi - log pi_ref) are clamped to
#: [-LOG_RATIO_BOUND, LOG_RATIO_BOUND] before exp (see the module docstring).
LOG_RATIO_BOUND = 20.0

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


def policy_loss(
    logp_new: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
    denom: float | torch.Tensor | None = None,
    norm_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with asymmetric clip and dual clip  # -> (loss, stats).

    Per token, with r = exp(clamp(logp_new - behaviour_logp, -20, 20)):
        l = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))
        if A < 0 and dual_clip = c:  l = min(l, -A * c)       (loss capped at c * |A|)
    The dual clip stops a token whose ratio exploded from dominating the batch
    when its advantage is negative. ``c`` must be > 1.

    Stats (detached scalars, over masked tokens):
    ``clip_frac`` where the clipped term was selected (gradient cut), split into
    ``clip_frac_high`` (A > 0, r > 1 + clip_high) and ``clip_frac_low`` (A < 0,
    r < 1 - clip_low); ``dual_clip_frac`` where the dual-clip cap was selected;
    ``approx_kl`` the k3 estimator of KL(pi_old || pi_new) on the rollout's
    samples, mean of (r - 1) - log r (unbiased and >= 0); ``ratio_mean``, ``ratio_max``.
    """
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be None or > 1, got {dual_clip}")
    m = mask.bool()
    zeros = torch.zeros_like(logp_new)
    # 0 off-mask, so the gradient there is exactly 0; clamped, so exp() stays finite.
    log_ratio = torch.where(m, logp_new - behaviour_logp.to(logp_new.dtype), zeros)  # [B, T]
    log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = log_ratio.exp()  # [B, T]
    adv = torch.where(m, advantages.to(logp_new.dtype), zeros)  # [B, T]

    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(pg_unclipped, pg_clipped)  # [B, T]
    dual_active = torch.zeros_like(m)
    if dual_clip is not None:
        cap = -adv * dual_clip
        dual_active = m & (adv < 0) & (cap < pg)
        pg = torch.where(adv < 0, torch.minimum(pg, cap), pg)
    loss = aggregate_loss(pg, m, agg, denom, norm_tokens)

    with torch.no_grad():
        n = m.sum().clamp_min(1).to(ratio.dtype)
        clipped = m & (pg_clipped > pg_unclipped)

        def frac(x: torch.Tensor) -> torch.Tensor:
            return x.sum().to(ratio.dtype) / n

        has_tokens = bool(m.any())
        stats = {
            "clip_frac": frac(clipped),
            "clip_frac_high": frac(clipped & (adv > 0)),
            "clip_frac_low": frac(clipped & (adv < 0)),
            "dual_clip_frac": frac(dual_active),
            "approx_kl": masked_mean(ratio - 1.0 - log_ratio, m),
            "ratio_mean": masked_mean(ratio, m),
            "ratio_max": ratio[m].max() if has_tokens else ratio.new_zeros(()),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


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


def _k3(d: torch.Tensor) -> torch.Tensor:
    d = d.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # exp(-d) stays finite
    return torch.expm1(-d) + d


def _k3_st(d: torch.Tensor) -> torch.Tensor:
    k2 = 0.5 * d**2
    return _k3(d).detach() + (k2 - k2.detach())


#: name -> per-token estimator of d = log pi - log pi_ref (see :func:`kl_penalty`).
_KL = {
    "k1": lambda d: d,
    "k2": lambda d: 0.5 * d**2,
    "k3": _k3,
    "k3_st": _k3_st,
    "abs": torch.abs,
}
KL_ESTIMATORS = tuple(_KL)


def kl_penalty(
    logp: torch.Tensor, reference_logp: torch.Tensor, kind: str = "k3_st"
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) on tokens sampled from pi  # [B, T].

    With d = logp - reference_logp (reference_logp has no gradient). As a loss term, what
    matters is the expected gradient over tokens y ~ pi, with
    g = grad log pi(y) and E_pi[g] = 0:

    * ``k1 = d``: unbiased value; gradient E[g] = 0 in expectation, so the
      penalty pulls nowhere (only noise).
    * ``k2 = d^2 / 2``: biased value (>= 0); gradient E[d g], which IS the
      gradient of KL(pi || pi_ref).
    * ``k3 = exp(-d) - 1 + d``: unbiased, low-variance, >= 0 value (Schulman
      2020); gradient E[(1 - pi_ref/pi) g] = -grad E_ref[log pi], the gradient
      of the FORWARD divergence KL(pi_ref || pi), not of the one it estimates.
    * ``k3_st``: k3's value with k2's gradient (straight-through: the value is
      k3, what flows back is d g), so both the logged number and the pull are
      those of KL(pi || pi_ref).
    * ``abs = |d|``: gradient E[sign(d) g], no divergence's gradient.

    k3's exp takes d clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND], so its value
    and gradient stay finite (beyond the bound k3's gradient is 0; k3_st's
    gradient, k2's, needs no clamp). The paper's runs used k3; k3_st is the
    default here because its gradient matches the divergence it names.
    """
    if kind not in _KL:
        raise ValueError(f"kind must be one of {KL_ESTIMATORS}, got {kind!r}")
    return _KL[kind](logp - reference_logp.to(logp.dtype))
