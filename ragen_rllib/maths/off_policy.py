"""Off-policy corrections: how far the sampling engine's log-probs are from the learner's.

Three log-probs exist for every sampled token:

* the **behaviour** log-prob, computed by the rollout engine when it sampled the
  token (HF or vLLM, perhaps in bf16, perhaps several policy versions back);
* the **proximal** log-prob, computed by the learner with its own weights at the
  start of the update, before any optimizer step (one forward without gradients);
* the **current** log-prob, with the weights being trained.

With ``rollout_correction`` on, PPO's ratio (and its clip) is current / proximal,
so the clip bounds the size of this update's step; the behaviour -> proximal
ratio is an importance weight that corrects for sampling from another policy.
That weight can be very large for a few tokens, so it is truncated at a cap
(``tis``: min(w, cap)) or the tokens outside a band [1/cap, cap] are dropped
(``mis``: weight 0 there, w inside), per token or per sequence (one weight per
training row: the product of its tokens' weights).

:func:`mismatch_stats` measures the engine-learner gap for the metrics. Every
function here is pure tensor code on right-padded [B, T] tensors with a 0/1
``mask`` of the response tokens; masked-out positions never matter.
"""

from __future__ import annotations

import torch

from ragen_rllib.maths.log_ratio import LOG_RATIO_BOUND, k3

CORRECTIONS = ("none", "tis", "mis")
LEVELS = ("token", "sequence")


def correction_weights(
    proximal_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    level: str = "token",
    cap: float = 2.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The importance weight of every token  # -> ([B, T] without gradient, stats).

    Raw weight w = pi_proximal / pi_behaviour: per token, or (``sequence``) the
    product over the row's response tokens given to each of them. ``tis`` returns
    min(w, cap); ``mis`` returns w inside [1/cap, cap] and 0 outside. Off the mask
    the weight is 0. Stats over the masked tokens: ``is_weight_mean`` and
    ``is_weight_max`` (raw), ``is_corrected_frac`` (the share truncated or masked).
    """
    if mode not in ("tis", "mis"):
        raise ValueError(f"mode must be 'tis' or 'mis', got {mode!r}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if not cap > 1.0:
        raise ValueError(f"cap must be > 1, got {cap}")
    with torch.no_grad():
        m = mask > 0
        dtype = torch.promote_types(proximal_logp.dtype, torch.float32)  # fp64 stays fp64
        d = (proximal_logp.to(dtype) - behaviour_logp.to(dtype)).masked_fill(~m, 0.0)
        if level == "sequence":
            d = d.sum(dim=1, keepdim=True).expand_as(d).masked_fill(~m, 0.0)
        raw = d.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()
        if mode == "tis":
            corrected = m & (raw > cap)
            weight = raw.clamp(max=cap)
        else:
            corrected = m & ((raw > cap) | (raw < 1.0 / cap))
            weight = torch.where(corrected, torch.zeros_like(raw), raw)
        weight = torch.where(m, weight, torch.zeros_like(weight))
        n = m.sum().clamp_min(1)
        stats = {
            "is_weight_mean": raw[m].sum() / n if bool(m.any()) else raw.new_ones(()),
            "is_weight_max": raw[m].max() if bool(m.any()) else raw.new_ones(()),
            "is_corrected_frac": corrected.sum() / n,
        }
    return weight, stats


def mismatch_sums(
    learner_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    mask: torch.Tensor,
    token_lag: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Sums, counts and maxima of the engine-learner gap over the response tokens,
    to be reduced over learners before :func:`mismatch_stats` divides.

    ``learner_logp`` is the learner's (the proximal log-prob), ``token_lag`` the
    policy versions between the weights that sampled each token and the learner's.
    Tokens of lag 0 were sampled with the learner's own weights: their gap is the
    engines' numerical mismatch alone. Over all tokens the gap adds the policy's
    drift since sampling."""
    m = mask > 0
    same = m & (token_lag == 0)
    d = (learner_logp.float() - behaviour_logp.float()).masked_fill(~m, 0.0)
    kl = k3(d).masked_fill(~m, 0.0)
    lag = token_lag.float().masked_fill(~m, 0.0)
    zero = d.new_zeros(())
    return {
        "same_kl_sum": kl[same].sum() if bool(same.any()) else zero,
        "same_tokens": same.sum().float(),
        "same_abs_max": d.abs()[same].max() if bool(same.any()) else zero,
        "all_kl_sum": kl.sum(),
        "all_tokens": m.sum().float(),
        "lag_sum": lag.sum(),
        "lag_max": lag.max() if bool(m.any()) else zero,
    }


#: which of :func:`mismatch_sums`'s entries are maxima (reduced by max, not sum)
MAXIMA = ("same_abs_max", "lag_max")


def merged_sums(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Several micro-batches' :func:`mismatch_sums` as one batch's (sums added,
    maxima maximised; all 0 when there are none)."""
    empty = torch.zeros((1, 1))
    out = {k: v.double() for k, v in mismatch_sums(empty, empty, empty, empty).items()}
    for part in parts:
        for key, value in part.items():
            value = value.detach().double().cpu()
            out[key] = torch.maximum(out[key], value) if key in MAXIMA else out[key] + value
    return out


def mismatch_stats(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    """The logged metrics from (reduced) :func:`mismatch_sums`. The same-weights
    figures are absent when no token was sampled with the learner's weights."""
    out = {
        "off_policy_kl": float(sums["all_kl_sum"] / sums["all_tokens"].clamp_min(1)),
        "token_lag_mean": float(sums["lag_sum"] / sums["all_tokens"].clamp_min(1)),
        "token_lag_max": float(sums["lag_max"]),
        "rollout_mismatch_tokens": float(sums["same_tokens"]),
    }
    if float(sums["same_tokens"]) > 0:
        out["rollout_mismatch_kl"] = float(sums["same_kl_sum"] / sums["same_tokens"])
        out["rollout_mismatch_max_abs"] = float(sums["same_abs_max"])
    return out
