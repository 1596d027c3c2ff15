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

Token log-ratios are clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND] before ``exp``
(GSPO's sequence log-ratio is bounded after its mean instead, and CISPO's log pi is
floored at the bound; see ``policy_loss``):
exp(88.7) overflows float32, and an infinite ratio turns the backward pass into
NaN even where the loss stays finite. Inside the bound every ratio is exact. A
token outside it gets no gradient at all from the surrogate (the clamp's
gradient is 0 there), and its loss term is the bound's ratio times the
advantage. With a positive advantage PPO's clip would have cut that gradient
anyway, and with a negative one the dual clip (on by default) would have. With
``dual_clip: null`` and a negative advantage it would not: the unclipped
objective's gradient there is |A| e^lr, more than 5e8 |A|, and the bound drops
it on purpose, since a token whose probability rose e^20-fold since sampling is
a numerical fault or a stale sample, and one such gradient would swamp the
whole step.
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


POLICY_LOSSES = ("ppo", "gspo", "cispo")


def _gspo_sequence_ratio(
    logp_new: torch.Tensor, old_logp: torch.Tensor, m: torch.Tensor
) -> torch.Tensor:
    """GSPO's sequence ratio s = exp(mean of the row's token log-ratios), per token
    # [B, T]: the value s on every token of the row, the gradient s * grad log pi.

    The bound is applied to the sequence's mean log-ratio, not to each token before
    the mean: one token far outside it (a log-ratio of +25 among small negative ones)
    moves the mean a little and must not cut its row's gradient. A row whose mean is
    outside the bound (or not finite) carries the bound's value and no gradient.
    """
    zeros = torch.zeros_like(logp_new)
    raw = torch.where(m, logp_new.detach() - old_logp.to(logp_new.dtype), zeros)  # [B, T]
    tokens = m.sum(dim=1, keepdim=True).clamp_min(1).to(raw.dtype)
    seq = raw.sum(dim=1, keepdim=True) / tokens  # [B, 1]
    inside = seq.abs() <= LOG_RATIO_BOUND  # [B, 1]; False for NaN too
    seq = torch.nan_to_num(seq, nan=0.0).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    # value 0, gradient d log pi, on the finite response tokens of rows inside the bound
    live = torch.where(m & inside & torch.isfinite(logp_new), logp_new, zeros)
    return torch.exp(seq + live - live.detach())


def policy_loss(
    logp_new: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    kind: str = "ppo",
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
    denom: float | torch.Tensor | None = None,
    norm_tokens: int | None = None,
    weights: torch.Tensor | None = None,
    cispo_cap: float = 5.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy-gradient loss of one micro-batch  # -> (loss, stats).

    ``old_logp`` is what the ratio is taken against: the behaviour log-probs, or the
    proximal ones under rollout correction. ``weights`` (no gradient; default 1) is
    the rollout correction's importance weight per token, which multiplies each
    token's loss. ``kind``, with r = exp(clamp(logp_new - old_logp, -20, 20)) per token:

    * ``ppo``: l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)); with
      ``dual_clip`` c and A < 0, l = min(l, -A c) (loss capped at c |A|, so a token
      whose ratio exploded cannot dominate the batch; c must be > 1).
    * ``gspo``: the same with the row's sequence ratio s = exp(mean of the row's
      token log-ratios, the mean bounded to +-20) in place of r. Each token carries
      s's value and the gradient s * grad log pi(token) (the token form of GSPO), so per-token
      advantages (per turn, GAE) and every ``loss_agg`` compose with it; with one
      advantage per row and ``seq-mean-token-mean`` it is GSPO's sequence loss
      exactly. The clip range is GSPO's own, far narrower (``clip_low``/``clip_high``
      are passed GSPO's values). A row is a training sequence: the whole
      trajectory with the whole history in context, one turn under a window.
    * ``cispo``: l = -sg(min(r, cispo_cap)) A log pi: the importance weight is
      capped, not the update, so every token keeps a gradient; ``clip_low``,
      ``clip_high`` and the dual clip do not apply (the weight is bounded already).
      log pi is floored at log pi_old - 20, so a token of probability 0 under the
      current policy gives a finite term and no gradient.

    Stats (detached scalars, over masked tokens): ``clip_frac`` where the clip
    acted on the gradient (ppo/gspo: the clipped term was selected; cispo: the
    weight was capped), split into ``clip_frac_high`` (A > 0) and
    ``clip_frac_low`` (A < 0); ``dual_clip_frac``; ``approx_kl``, the k3 estimate of
    KL(pi_old || pi_new), mean of (r - 1) - log r; ``ratio_mean``, ``ratio_max``
    (the token ratios r in every kind).
    """
    if kind not in POLICY_LOSSES:
        raise ValueError(f"kind must be one of {POLICY_LOSSES}, got {kind!r}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be None or > 1, got {dual_clip}")
    m = mask.bool()
    zeros = torch.zeros_like(logp_new)
    # 0 off-mask, so the gradient there is exactly 0; clamped, so exp() stays finite.
    log_ratio = torch.where(m, logp_new - old_logp.to(logp_new.dtype), zeros)  # [B, T]
    log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = log_ratio.exp()  # [B, T]
    adv = torch.where(m, advantages.to(logp_new.dtype), zeros)  # [B, T]
    dual_active = torch.zeros_like(m)
    if kind == "cispo":
        capped = ratio.detach().clamp(max=cispo_cap)
        # log pi floored at the bound's log-ratio below the behaviour's: a token the
        # policy now gives probability 0 (log pi = -inf) has weight e^-20 and would
        # make the loss infinite; floored, its term is finite and its gradient 0.
        floor = (old_logp.to(logp_new.dtype) - LOG_RATIO_BOUND).detach()
        logp_floored = torch.where(m, torch.maximum(logp_new, floor), zeros)
        pg = -capped * adv * logp_floored
        clipped = m & (ratio.detach() > cispo_cap)
    else:
        if kind == "gspo":
            surrogate = _gspo_sequence_ratio(logp_new, old_logp, m)
        else:
            surrogate = ratio
        pg_unclipped = -adv * surrogate
        pg_clipped = -adv * surrogate.clamp(1.0 - clip_low, 1.0 + clip_high)
        pg = torch.maximum(pg_unclipped, pg_clipped)  # [B, T]
        if dual_clip is not None:
            cap = -adv * dual_clip
            dual_active = m & (adv < 0) & (cap < pg)
            pg = torch.where(adv < 0, torch.minimum(pg, cap), pg)
        clipped = m & (pg_clipped > pg_unclipped)
    if weights is not None:
        pg = pg * weights.detach().to(pg.dtype)
    loss = aggregate_loss(pg, m, agg, denom, norm_tokens)

    with torch.no_grad():
        n = m.sum().clamp_min(1).to(ratio.dtype)

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
