"""pass@k: the chance that at least one of k answers to a state succeeds.

Estimated without bias from n >= k samples per state, c of them successes, as
1 - C(n - c, k) / C(n, k) (the probability that k samples drawn without
replacement from the n all fail, subtracted from one), then averaged over
states. Drawing exactly k samples and taking the best would also be unbiased
but has a higher variance; with k = 1 the estimator is the success rate.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pass_at_k(num_samples: int, num_successes: int, k: int) -> float:
    """pass@k of one state with ``num_successes`` of ``num_samples`` samples correct."""
    n, c = int(num_samples), int(num_successes)
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= samples per state, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"successes must lie in [0, {n}], got {c}")
    if n - c < k:  # every draw of k contains a success
        return 1.0
    # C(n-c, k) / C(n, k) as a product of k ratios: no large binomials.
    fail = np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64))
    return float(1.0 - fail)


def mean_pass_at_k(successes_per_state: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over states, each given as the list of its samples' successes."""
    if not successes_per_state:
        raise ValueError("pass@k needs at least one state")
    return float(
        np.mean([pass_at_k(len(s), int(sum(bool(x) for x in s)), k) for s in successes_per_state])
    )
