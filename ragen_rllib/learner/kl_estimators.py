"""The KL estimators of the penalty to the reference model, one registry row each.

A row (:class:`KLEstimator`) is a name, a function of one fixed signature (d = log pi
- log pi_ref per token  # [B, T] -> the per-token estimate  # [B, T]), what it
needs (the reference model's log-probs, which every row does) and which divergence
its gradient is the gradient of. The config's choices (``kl_estimator``) and
``docs/config.md`` read :data:`KL_ESTIMATORS`; a new estimator is a function
registered with :func:`register_kl_estimator` and its test.

On tokens y sampled from pi, with g = grad log pi(y) and E_pi[g] = 0, what matters
for a loss term is its expected gradient:

* ``k1 = d``: unbiased value; gradient E[g] = 0 in expectation, so the penalty pulls
  nowhere (only noise).
* ``k2 = d^2 / 2``: biased value (>= 0); gradient E[d g], which IS the gradient of
  KL(pi || pi_ref).
* ``k3 = exp(-d) - 1 + d``: unbiased, low-variance, >= 0 value (Schulman 2020);
  gradient E[(1 - pi_ref/pi) g] = -grad E_ref[log pi], the gradient of the FORWARD
  divergence KL(pi_ref || pi), not of the one it estimates.
* ``k3_st``: k3's value with k2's gradient (straight-through: the value is k3, what
  flows back is d g), so both the logged number and the pull are those of
  KL(pi || pi_ref).
* ``abs = |d|``: gradient E[sign(d) g], no divergence's gradient.

k3's exp takes d clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND], so its value and
gradient stay finite (beyond the bound k3's gradient is 0; k3_st's gradient, k2's,
needs no clamp). The paper's runs used k3; k3_st is the default because its gradient
matches the divergence it names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ragen_rllib.maths.log_ratio import k3 as k3_of


@dataclass(frozen=True)
class KLEstimator:
    """One registry row (see the module docstring)."""

    name: str
    estimate: Callable[[torch.Tensor], torch.Tensor]
    summary: str
    #: the divergence whose gradient the row's expected gradient is (None: none)
    gradient_of: str | None
    needs: frozenset[str] = frozenset({"reference"})


#: name -> row, in the order they were registered (the docs' order).
KL_ESTIMATORS: dict[str, KLEstimator] = {}


def register_kl_estimator(
    name: str, summary: str, gradient_of: str | None
) -> Callable[[Callable[[torch.Tensor], torch.Tensor]], Callable[[torch.Tensor], torch.Tensor]]:
    """Register the decorated function (d  # [B, T] -> estimate  # [B, T]) as ``name``."""

    def add(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        if name in KL_ESTIMATORS:
            raise ValueError(f"KL estimator {name!r} is registered already")
        KL_ESTIMATORS[name] = KLEstimator(name, fn, summary, gradient_of)
        return fn

    return add


@register_kl_estimator("k1", "d (unbiased value, no pull in expectation)", None)
def k1(d: torch.Tensor) -> torch.Tensor:
    return d


@register_kl_estimator("k2", "d^2 / 2", "KL(pi || pi_ref)")
def k2(d: torch.Tensor) -> torch.Tensor:
    return 0.5 * d**2


@register_kl_estimator("k3", "exp(-d) - 1 + d (the paper's)", "KL(pi_ref || pi)")
def k3(d: torch.Tensor) -> torch.Tensor:
    return k3_of(-d)  # tokens from pi: log(pi_ref / pi) = -d; exp(-d) bounded there


@register_kl_estimator("k3_st", "k3's value, k2's gradient", "KL(pi || pi_ref)")
def k3_st(d: torch.Tensor) -> torch.Tensor:
    k2 = 0.5 * d**2
    return k3(d).detach() + (k2 - k2.detach())


@register_kl_estimator("abs", "|d|", None)
def absolute(d: torch.Tensor) -> torch.Tensor:
    return torch.abs(d)


def kl_penalty(
    logp: torch.Tensor, reference_logp: torch.Tensor, kind: str = "k3_st"
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) on tokens sampled from pi  # [B, T], by
    the row ``kind`` of :data:`KL_ESTIMATORS`, with d = logp - reference_logp
    (reference_logp has no gradient)."""
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"kind must be one of {list(KL_ESTIMATORS)}, got {kind!r}")
    return KL_ESTIMATORS[kind].estimate(logp - reference_logp.to(logp.dtype))
