"""The policy losses, one registry row each, and the loss of a micro-batch they share.

A row (:class:`PolicyLoss`) is a name, a function of one fixed signature
(:class:`LossInputs` -> :class:`LossTerms`: the per-token loss and where a clip or cap
acted), what the loss needs, and the knobs it reads: which two give its clip range
(``clip_low``/``clip_high``, or a loss's own pair), whether the dual clip applies,
and its own settings (``options``). Everything around the row is common:
:func:`policy_loss` takes the log-ratios against ``old_logp`` (masked, bounded to
+-``LOG_RATIO_BOUND`` before ``exp``), multiplies the rollout correction's weights,
aggregates with ``loss_agg`` and logs the same statistics for every row. The config's
choices (``policy_loss``), ``docs/config.md`` and :mod:`~ragen_rllib.learner.loss`
read :data:`POLICY_LOSSES`; a new loss is a function registered with
:func:`register_policy_loss` and its test.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from ragen_rllib.learner.loss_terms import aggregate_loss
from ragen_rllib.maths.advantages import masked_mean
from ragen_rllib.maths.log_ratio import LOG_RATIO_BOUND, k3


@dataclass(frozen=True)
class LossInputs:
    """What every policy loss is given, for one micro-batch  # [B, T] each.

    ``log_ratio`` is log pi - ``old_logp`` on the response tokens (0 elsewhere),
    bounded to +-LOG_RATIO_BOUND; ``ratio`` its exp; ``advantages`` are 0 off the
    mask. ``clip_low``/``clip_high`` come from the row's ``clip_knobs``; ``options``
    from its ``option_knobs``."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    log_ratio: torch.Tensor
    ratio: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    clip_low: float
    clip_high: float
    dual_clip: float | None
    options: Mapping[str, float]


@dataclass(frozen=True)
class LossTerms:
    """A row's result  # [B, T]: the loss per token (0 off the mask), where the clip or
    the cap acted on the gradient, and where the dual clip did."""

    loss: torch.Tensor
    clipped: torch.Tensor
    dual_clipped: torch.Tensor


@dataclass(frozen=True)
class PolicyLoss:
    """One registry row (see the module docstring)."""

    name: str
    terms: Callable[[LossInputs], LossTerms]
    summary: str
    #: the config keys of its clip range (below 1, above 1); None: it has no clip
    clip_knobs: tuple[str, str] | None = ("clip_low", "clip_high")
    #: option name -> the config key that sets it
    option_knobs: Mapping[str, str] = field(default_factory=dict)
    uses_dual_clip: bool = True
    #: the log-probs it needs besides the current policy's: the sampling policy's
    #: (or, under rollout correction, the proximal) for the ratio
    needs: frozenset[str] = frozenset({"old_logp"})


#: name -> row, in the order they were registered (the docs' order).
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(
    name: str,
    summary: str,
    *,
    clip_knobs: tuple[str, str] | None = ("clip_low", "clip_high"),
    option_knobs: Mapping[str, str] | None = None,
    uses_dual_clip: bool = True,
) -> Callable[[Callable[[LossInputs], LossTerms]], Callable[[LossInputs], LossTerms]]:
    """Register the decorated function as the policy loss ``name``."""

    def add(fn: Callable[[LossInputs], LossTerms]) -> Callable[[LossInputs], LossTerms]:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is registered already")
        POLICY_LOSSES[name] = PolicyLoss(
            name, fn, summary, clip_knobs, dict(option_knobs or {}), uses_dual_clip
        )
        return fn

    return add


def policy_loss_row(name: str) -> PolicyLoss:
    """The registry row of ``name``; a ValueError names the registered ones."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        allowed = list(POLICY_LOSSES)
        raise ValueError(f"policy_loss must be one of {allowed}, got {name!r}") from None


def _clipped_surrogate(x: LossInputs, surrogate: torch.Tensor) -> LossTerms:
    """PPO's clip on ``surrogate`` (the ratio, or GSPO's sequence ratio), with the dual
    clip for negative advantages."""
    adv, m = x.advantages, x.mask
    unclipped = -adv * surrogate
    clipped = -adv * surrogate.clamp(1.0 - x.clip_low, 1.0 + x.clip_high)
    loss = torch.maximum(unclipped, clipped)  # [B, T]
    dual = torch.zeros_like(m)
    if x.dual_clip is not None:
        cap = -adv * x.dual_clip
        dual = m & (adv < 0) & (cap < loss)
        loss = torch.where(adv < 0, torch.minimum(loss, cap), loss)
    return LossTerms(loss, m & (clipped > unclipped), dual)


@register_policy_loss("ppo", "clipped ratio, clip-higher and dual clip (the paper's)")
def ppo(x: LossInputs) -> LossTerms:
    """l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)); with ``dual_clip`` c
    and A < 0, l = min(l, -A c) (loss capped at c |A|, so a token whose ratio exploded
    cannot dominate the batch)."""
    return _clipped_surrogate(x, x.ratio)


def gspo_sequence_ratio(
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


@register_policy_loss(
    "gspo",
    "sequence ratio with its own, far narrower clip",
    clip_knobs=("gspo_clip_low", "gspo_clip_high"),
)
def gspo(x: LossInputs) -> LossTerms:
    """PPO's loss with the row's sequence ratio s in place of r
    (:func:`gspo_sequence_ratio`). Each token carries s's value and the gradient
    s * grad log pi(token) (the token form of GSPO), so per-token advantages (per turn,
    GAE) and every ``loss_agg`` compose with it; with one advantage per row and
    ``seq-mean-token-mean`` it is GSPO's sequence loss exactly. A row is a training
    sequence: the whole trajectory with the whole history in context, one turn under
    a window."""
    return _clipped_surrogate(x, gspo_sequence_ratio(x.logp, x.old_logp, x.mask))


@register_policy_loss(
    "cispo",
    "clipped stop-gradient importance weight (every token keeps a gradient)",
    clip_knobs=None,
    option_knobs={"cap": "cispo_weight_cap"},
    uses_dual_clip=False,
)
def cispo(x: LossInputs) -> LossTerms:
    """l = -sg(min(r, cap)) A log pi: the importance weight is capped, not the update,
    so every token keeps a gradient (the clip range and the dual clip do not apply).
    log pi is floored at log pi_old - LOG_RATIO_BOUND: a token of probability 0 under
    the current policy (log pi = -inf, weight e^-20) gives a finite term and no
    gradient instead of an infinite loss."""
    m, zeros = x.mask, torch.zeros_like(x.logp)
    capped = x.ratio.detach().clamp(max=x.options["cap"])
    floor = (x.old_logp.to(x.logp.dtype) - LOG_RATIO_BOUND).detach()
    logp = torch.where(m, torch.maximum(x.logp, floor), zeros)
    return LossTerms(-capped * x.advantages * logp, m & (x.ratio.detach() > x.options["cap"]),
                     torch.zeros_like(m))  # fmt: skip


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
    options: Mapping[str, float] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy-gradient loss of one micro-batch  # -> (loss, stats).

    ``kind`` names a row of :data:`POLICY_LOSSES`. ``old_logp`` is what the ratio is
    taken against: the behaviour log-probs, or the proximal ones under rollout
    correction. ``weights`` (no gradient; default 1) is the rollout correction's
    importance weight per token, which multiplies each token's loss. ``options``: the
    row's own settings, each of its ``option_knobs`` (CISPO: ``cap``).

    Stats (detached scalars, over masked tokens): ``clip_frac`` where the clip acted on
    the gradient (the clipped term was selected, or CISPO's weight was capped), split
    into ``clip_frac_high`` (A > 0) and ``clip_frac_low`` (A < 0); ``dual_clip_frac``;
    ``approx_kl``, the k3 estimate of KL(pi_old || pi_new), mean of (r - 1) - log r;
    ``ratio_mean``, ``ratio_max`` (the token ratios r in every kind).
    """
    row = policy_loss_row(kind)
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be None or > 1, got {dual_clip}")
    m = mask.bool()
    zeros = torch.zeros_like(logp_new)
    # 0 off-mask, so the gradient there is exactly 0; bounded, so exp() stays finite.
    log_ratio = torch.where(m, logp_new - old_logp.to(logp_new.dtype), zeros)  # [B, T]
    log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = log_ratio.exp()  # [B, T]
    adv = torch.where(m, advantages.to(logp_new.dtype), zeros)  # [B, T]
    options = dict(options or {})
    if set(options) != set(row.option_knobs):
        raise ValueError(
            f"policy loss {kind!r} takes the options {sorted(row.option_knobs)}, "
            f"got {sorted(options)}"
        )
    terms = row.terms(
        LossInputs(logp_new, old_logp, log_ratio, ratio, adv, m, clip_low, clip_high,
                   dual_clip if row.uses_dual_clip else None, options)
    )  # fmt: skip
    pg = terms.loss
    if weights is not None:
        pg = pg * weights.detach().to(pg.dtype)
    loss = aggregate_loss(pg, m, agg, denom, norm_tokens)

    with torch.no_grad():
        n = m.sum().clamp_min(1).to(ratio.dtype)

        def frac(x: torch.Tensor) -> torch.Tensor:
            return x.sum().to(ratio.dtype) / n

        stats = {
            "clip_frac": frac(terms.clipped),
            "clip_frac_high": frac(terms.clipped & (adv > 0)),
            "clip_frac_low": frac(terms.clipped & (adv < 0)),
            "dual_clip_frac": frac(terms.dual_clipped),
            "approx_kl": masked_mean(k3(log_ratio), m),
            "ratio_mean": masked_mean(ratio, m),
            "ratio_max": ratio[m].max() if bool(m.any()) else ratio.new_zeros(()),
        }
    return loss, {k: v.detach() for k, v in stats.items()}
