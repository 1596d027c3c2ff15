"""Collapse ("Echo Trap") indicators: reasoning diversity, prompt-reasoning mutual
information, and an early warning over the training signals.

RAGEN describes a collapse of multi-turn RL: the in-group reward spread and the
policy's entropy fall before success does, the reasoning converges to repeated
templates, and a spike of the gradient norm or of the policy's step marks the
point of no return. RAGEN-2 measures whether the reasoning Z still depends on
the prompt X with a mutual-information estimate from a matrix of
log-likelihoods. Everything here is pure (no Ray, no model): the algorithm
feeds it the batch's texts, the actor's scores and the per-iteration metrics.

* :func:`own_reasoning`, :func:`distinct_n` and :func:`template_repetition`:
  diversity of the reasoning the model wrote itself (never the prefill's text).
* :func:`pair_information`: from ``L[i, j] = log p(z_j | x_i)`` (reasoning j scored
  under prompt i) the MI estimate, its z-score against the mismatched pairs, the
  conditional entropy per token and retrieval accuracy.
* :class:`EarlyWarning`: a documented rule over the EMAs of the in-group reward
  std, the policy's step (approximate KL to the behaviour policy), the
  gradient norm and the policy's entropy.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

#: Numbers and coordinates ("3", "2,3", "-0.1") become "#" before templates compare.
_NUMBERS = re.compile(r"-?\d+(?:[.,]\d+)*")


_TAG = re.compile(r"</?\w+>")


def own_reasoning(answer: str, prefill: str = "") -> str:
    """The reasoning the model wrote in ``answer`` (which starts with the ``prefill``
    the runner placed before its generation): its own text up to ``</think>``, or all
    of it when it writes none (a prefill that closes the think block leaves it only
    the answer to write), with the tags removed. A fixed prefill's words never count:
    they would read as one repeated template."""
    own = answer[len(prefill) :] if prefill and answer.startswith(prefill) else answer
    end = own.find("</think>")
    return " ".join(_TAG.sub(" ", own if end < 0 else own[:end]).split())


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct n-grams over all n-grams of the texts' whitespace tokens (1.0: no
    n-gram repeats; 0.0 when there is no n-gram at all)."""
    grams = [
        tuple(words[i : i + n])
        for words in (t.split() for t in texts)
        for i in range(len(words) - n + 1)
    ]
    return len(set(grams)) / len(grams) if grams else 0.0


def distinct_n_within_groups(texts: Sequence[str], groups: Sequence[Hashable], n: int) -> float:
    """:func:`distinct_n` of each group's texts (the rollouts of one initial state),
    averaged over the groups that have an n-gram."""
    by_group: dict[Hashable, list[str]] = {}
    for text, group in zip(texts, groups, strict=True):
        by_group.setdefault(group, []).append(text)
    values = [distinct_n(ts, n) for ts in by_group.values() if any(len(t.split()) >= n for t in ts)]
    return sum(values) / len(values) if values else 0.0


def template_repetition(texts: Sequence[str]) -> float:
    """The share of texts equal to the batch's most common one once numbers and
    coordinates are masked and whitespace is folded (1/len for all-different texts,
    1.0 for one template)."""
    if not texts:
        return 0.0
    masked = Counter(" ".join(_NUMBERS.sub("#", t).split()) for t in texts)
    return masked.most_common(1)[0][1] / len(texts)


@dataclass(frozen=True)
class PairInformation:
    """What :func:`pair_information` derives from an M x M log-likelihood matrix."""

    mutual_information: float  # nats; at most log M, about 0 when the prompt changes nothing
    mi_zscore: float  # how far matched pairs stand above mismatched ones, in their stds
    conditional_entropy: float  # nats per reasoning token, H(Z | X)
    retrieval_acc_at_1: float
    retrieval_acc_at_k: float
    k: int
    chance_at_1: float  # 1 / M


def pair_information(
    loglik: torch.Tensor, tokens: Sequence[int] | torch.Tensor, k: int = 3
) -> PairInformation:
    """Prompt-reasoning information from ``loglik[i, j] = log p(z_j | x_i)``  # [M, M].

    ``tokens[j]``: the number of tokens of reasoning j (for the per-token entropy).

    * MI estimate: mean over j of ``L[j, j] - log mean_i exp L[i, j]``, the log-ratio
      of a reasoning's likelihood under its own prompt to its likelihood under the
      prompts of the batch (their mixture standing for p(z)). It is log M when each
      reasoning is likely only under its own prompt, and 0 when the prompt changes
      nothing; as an estimate from M samples it can fall slightly below 0.
    * z-score: for each j, ``(L[j, j] - mean_{i != j} L[i, j]) / std_{i != j} L[i, j]``,
      averaged over j (0 when the mismatched scores do not vary).
    * conditional entropy per token: ``-sum_j L[j, j] / sum_j tokens[j]``.
    * retrieval accuracy@k: the share of reasonings whose own prompt is among the k
      prompts that score them highest (chance: k / M). Prompts that score a
      reasoning exactly as its own prompt does are a tie, broken at random: the
      own prompt counts with the probability that a random order of the tied
      ones puts it among the k (equal scores everywhere give chance, k / M).

    A log-likelihood that is not finite (NaN, or -inf from an overflow) makes every
    figure NaN: it is a fault of the scoring, and a number computed around it would
    hide it.
    """
    L = torch.as_tensor(loglik, dtype=torch.float64)
    if L.dim() != 2 or L.shape[0] != L.shape[1] or L.shape[0] < 2:
        raise ValueError(f"loglik must be a square matrix of at least 2 x 2, got {tuple(L.shape)}")
    m = L.shape[0]
    tokens = torch.as_tensor(tokens, dtype=torch.float64)
    if tokens.shape != (m,) or bool((tokens <= 0).any()):
        raise ValueError(f"tokens must hold {m} positive counts, got {tokens.tolist()}")
    k = max(1, min(k, m))
    if not bool(torch.isfinite(L).all()):
        nan = math.nan
        return PairInformation(nan, nan, nan, nan, nan, k=k, chance_at_1=1.0 / m)
    matched = L.diagonal()
    marginal = torch.logsumexp(L, dim=0) - math.log(m)  # log mean_i p(z_j | x_i)
    mi = float((matched - marginal).mean())
    off = ~torch.eye(m, dtype=torch.bool)
    mismatched = L.T[off].reshape(m, m - 1)  # row j: L[i, j] for i != j
    # With two prompts each reasoning has one mismatched score: no spread to divide by.
    spread = mismatched.std(dim=1, unbiased=True) if m > 2 else torch.zeros_like(matched)
    gap = matched - mismatched.mean(dim=1)
    z = torch.where(spread > 1e-12, gap / spread.clamp_min(1e-12), torch.zeros_like(gap))
    # Prompts scoring a reasoning above its own, and those tied with it: in a random
    # order of the tied ones the own prompt is at rank above + 1 .. above + tied + 1.
    above = (L > matched[None, :]).sum(dim=0).double()
    tied = ((L == matched[None, :]) & off).sum(dim=0).double()

    def among_top(n: int) -> float:
        return float(((n - above) / (tied + 1)).clamp(0.0, 1.0).mean())

    return PairInformation(
        mutual_information=mi,
        mi_zscore=float(z.mean()),
        conditional_entropy=float(-matched.sum() / tokens.sum()),
        retrieval_acc_at_1=among_top(1),
        retrieval_acc_at_k=among_top(k),
        k=k,
        chance_at_1=1.0 / m,
    )


@dataclass
class EarlyWarning:
    """A warning of collapse from the per-iteration training signals.

    The rule, from RAGEN's findings (the in-group reward spread falls before
    success does; a spike of the policy's step or of the gradient marks the point
    of no return) and from a collapse measured here (once every rollout of a group
    succeeds, the policy gradient vanishes, the entropy bonus alone moves Adam's
    full-size steps, and the entropy runs away until the answers break): it fires
    at the first iteration, after ``warmup`` iterations, where

    * the EMA of the in-group reward std has fallen below ``std_drop`` times its
      running peak, **and**
    * the EMA of the approximate KL between the behaviour policy and the updated
      one, or the EMA of the actor's gradient norm, exceeds ``spike`` times its
      running median (the median of all its earlier EMA values), or the EMA of
      the policy's entropy exceeds ``entropy_spike`` times its running median.

    A falling reward spread alone is what a policy that has learnt its task also
    shows; a jump of the step size alone happens in healthy runs too. Both
    together are the collapse's signature. EMAs use ``alpha`` (weight of the
    newest value). Feed every iteration to :meth:`update`; it returns the reason
    when the warning fires (once), else None.
    """

    alpha: float = 0.1
    std_drop: float = 0.5
    spike: float = 3.0
    warmup: int = 20
    entropy_spike: float = 2.0
    # What the rule has seen so far (a checkpoint keeps it).
    ema: dict[str, float] = field(default_factory=dict)
    iteration: int = 0
    fired_at: int | None = None
    peak_std: float = 0.0
    history: dict[str, list[float]] = field(default_factory=dict)

    def _smooth(self, key: str, value: float) -> float:
        old = self.ema.get(key)
        self.ema[key] = value if old is None else (1 - self.alpha) * old + self.alpha * value
        return self.ema[key]

    def update(
        self, in_group_std: float, step_kl: float, grad_norm: float, entropy: float = math.nan
    ) -> str | None:
        self.iteration += 1
        values = {"step_kl": step_kl, "grad_norm": grad_norm, "entropy": entropy}
        limits = {"step_kl": self.spike, "grad_norm": self.spike, "entropy": self.entropy_spike}
        if math.isfinite(in_group_std):
            std = self._smooth("in_group_reward_std", in_group_std)
            self.peak_std = max(self.peak_std, std)
        else:  # a missing or NaN spread leaves the EMA (and so the rule) as it was
            std = self.ema.get("in_group_reward_std", math.nan)
        spikes = []
        for key, value in values.items():
            if not math.isfinite(value):
                if key != "entropy":  # entropy is optional; a NaN step or gradient is not
                    spikes.append(f"{key} is {value}")
                continue
            smoothed = self._smooth(key, value)
            past = self.history.setdefault(key, [])
            if past:
                median = sorted(past)[len(past) // 2]
                if median > 0 and smoothed > limits[key] * median:
                    spikes.append(
                        f"{key} EMA {smoothed:.3g} > {limits[key]:g} x median {median:.3g}"
                    )
            past.append(smoothed)
        if self.fired_at is not None or self.iteration <= self.warmup:
            return None
        dropped = self.peak_std > 0 and std < self.std_drop * self.peak_std
        if dropped and spikes:
            self.fired_at = self.iteration
            return (
                f"in-group reward std EMA {std:.3g} < {self.std_drop:g} x its peak "
                f"{self.peak_std:.3g}, and " + "; ".join(spikes)
            )
        return None
