"""Log-ratios between two policies' token log-probs: the one bound they are clamped
to before ``exp``, and the k3 estimate of KL built on them.

Every log-ratio the project exponentiates (the loss's token ratios, the KL
estimators', the rollout correction's importance weights) is first clamped to
[-LOG_RATIO_BOUND, LOG_RATIO_BOUND]: exp(88.7) overflows float32, and e^20 is
already far past any ratio a trust region lets through. The learner's loss says
what the bound means for each term's gradient (``learner/loss_terms.py``).
"""

from __future__ import annotations

import torch

#: the bound on every log-ratio before exp (finite in float32, exact inside)
LOG_RATIO_BOUND = 20.0


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(p || q) from tokens sampled from p, with
    ``log_ratio = log q - log p``: ``(q/p - 1) - log(q/p)``, unbiased and >= 0.

    The one convention every caller follows: the policy that sampled the tokens
    is ``p``, below the fraction. The KL penalty's ``d = log pi - log pi_ref``
    (tokens from pi) passes ``-d``; the loss's ``approx_kl`` (tokens from pi_old,
    ``log r = log pi_new - log pi_old``) passes ``log r``."""
    x = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return torch.expm1(x) - x
