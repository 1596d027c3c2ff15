"""Rollout filtering (StarPO-S, RAGEN-2): keep the groups whose rewards vary most.

Data flow: after a rollout, every group holds the trajectories started from one
initial state. A group whose trajectories all score the same teaches the policy
little (a group baseline gives it zero advantage; with a critic it mostly adds
noise), so groups are scored by the spread of their trajectory rewards and only
some are kept before advantages are computed. The sample-stage connector
(:class:`~ragen_rllib.connectors.sample_batch.RolloutFilter`) calls :func:`filter_groups`.

A group's score (``metric``) is the SAMPLE standard deviation (n - 1) of its
trajectories' rewards (``"reward_std"``, StarPO-S) or its square
(``"reward_variance"``, RAGEN-2). Groups are ordered by score, highest first
(``direction="largest"``) or lowest first (``"smallest"``, an ablation); equal
scores keep group-id order. A strategy then picks a prefix of that order:

* ``"top_k"``: a share ``value`` in (0, 1] of the batch's groups, rounded up
  (StarPO-S keeps 0.25);
* ``"top_k_abs"``: ``value`` groups (an integer >= 1);
* ``"top_p"``: the shortest prefix whose scores add up to at least ``value``
  in (0, 1] of the total score (RAGEN-2 recommends 0.9 with zero-score groups
  excluded); ``value = 1`` keeps every group;
* ``"min_p"``: with ``"largest"``, the groups whose score is at least
  ``value`` times the highest score; with ``"smallest"``, those whose score is
  at most ``1 - value`` times it (``value`` in [0, 1]).

``include_zero=False`` removes the groups whose score is 0 (all rewards equal)
before any strategy runs; otherwise they can be kept like any other. Every
strategy keeps at least one group when one is left to keep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ragen_rllib.maths.advantages import group_stats

FILTER_STRATEGIES = ("top_k", "top_k_abs", "top_p", "min_p")
FILTER_DIRECTIONS = ("largest", "smallest")
FILTER_METRICS = ("reward_std", "reward_variance")


def in_group_std(rewards: Any, group_ids: Any) -> torch.Tensor:
    """Each group's SAMPLE standard deviation (n - 1) of its trajectories' rewards
    # -> [G] float64, groups in ascending id order; a group of one has std 0.

    The project's one in-group std: the filter scores groups by it, the
    ``rollout/in_group_reward_std`` metric and the filter's ``in_group_reward_std_*``
    metrics average it, and GRPO divides by it."""
    return group_stats(rewards, group_ids)[4]


def num_groups_to_keep(num_groups: int, keep_ratio: float, min_groups: int = 1) -> int:
    """ceil(keep_ratio * num_groups), at least ``min_groups``, at most ``num_groups``.

    Rounding up means any positive ratio keeps at least one group; a 1e-9 slack
    stops float noise (e.g. 0.3 * 10 = 3.0000000000000004) from adding a group.
    """
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio!r}")
    if min_groups < 0:
        raise ValueError(f"min_groups must be >= 0, got {min_groups!r}")
    n = math.ceil(keep_ratio * num_groups - 1e-9)
    return min(max(n, min_groups), num_groups)


def check_filter(strategy: str, value: float, direction: str, metric: str) -> None:
    """Raise ``ValueError`` naming what is wrong with a filter setting."""
    if strategy not in FILTER_STRATEGIES:
        raise ValueError(f"strategy must be one of {FILTER_STRATEGIES}, got {strategy!r}")
    if direction not in FILTER_DIRECTIONS:
        raise ValueError(f"direction must be one of {FILTER_DIRECTIONS}, got {direction!r}")
    if metric not in FILTER_METRICS:
        raise ValueError(f"metric must be one of {FILTER_METRICS}, got {metric!r}")
    if strategy == "top_k_abs":
        if isinstance(value, bool) or not float(value).is_integer() or value < 1:
            raise ValueError(f"top_k_abs takes a whole number of groups >= 1, got {value!r}")
    elif strategy == "min_p":
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"min_p takes a value in [0, 1], got {value!r}")
    elif not 0.0 < value <= 1.0:
        raise ValueError(f"{strategy} takes a value in (0, 1], got {value!r}")


def select_groups(
    score: torch.Tensor,
    strategy: str,
    value: float,
    direction: str = "largest",
    include_zero: bool = True,
) -> torch.Tensor:
    """Which groups to keep  # score [G] (>= 0) -> bool [G] (see the module docstring)."""
    check_filter(strategy, value, direction, "reward_std")
    score = torch.as_tensor(score, dtype=torch.float64).reshape(-1)
    g = score.numel()
    keep = torch.zeros(g, dtype=torch.bool)
    # A group whose score is not finite (a NaN reward) is never kept: sorted, a NaN
    # would come first.
    usable = torch.isfinite(score) & ((score >= 0) if include_zero else (score > 0))
    candidates = torch.nonzero(usable).flatten()
    if candidates.numel() == 0:
        return keep
    cand_score = score[candidates]
    # Stable sort: equal scores stay in group order (candidates are ascending).
    order = candidates[torch.sort(cand_score, descending=direction == "largest", stable=True)[1]]
    ordered = score[order]
    if strategy == "top_k":
        n = num_groups_to_keep(g, value)
    elif strategy == "top_k_abs":
        n = int(value)
    elif strategy == "top_p":
        total = float(ordered.sum())
        if value >= 1.0 or total <= 0.0:
            n = len(order)
        else:
            reached = torch.cumsum(ordered, 0) >= value * total - 1e-12
            n = int(torch.nonzero(reached).flatten()[0]) + 1
    else:  # min_p
        top = float(ordered.max())
        if direction == "largest":
            n = int((ordered >= value * top - 1e-12).sum())
        else:
            n = int((ordered <= (1.0 - value) * top + 1e-12).sum())
    keep[order[: max(1, min(n, len(order)))]] = True
    return keep


@dataclass
class FilterResult:
    """What :func:`filter_groups` kept: ``keep`` [N] per trajectory, and the number of
    groups and the mean in-group reward std before and after."""

    keep: torch.Tensor
    groups_before: int
    groups_after: int
    std_before: float
    std_after: float


def filter_groups(
    rewards: Any,
    group_ids: Any,
    strategy: str = "top_k",
    value: float = 0.25,
    direction: str = "largest",
    include_zero: bool = True,
    metric: str = "reward_std",
) -> FilterResult:
    """Keep ALL trajectories of the selected groups  # rewards, group_ids [N].

    Each group is scored by ``metric`` on its trajectories' ``rewards``; then
    :func:`select_groups` picks the groups to keep."""
    check_filter(strategy, value, direction, metric)
    _, inverse, _, _, std = group_stats(rewards, group_ids)
    score = std if metric == "reward_std" else std**2
    keep_group = select_groups(score, strategy, value, direction, include_zero)
    kept = std[keep_group]
    return FilterResult(
        keep=keep_group[inverse],
        groups_before=std.numel(),
        groups_after=int(keep_group.sum()),
        std_before=float(std.mean()) if std.numel() else 0.0,
        std_after=float(kept.mean()) if kept.numel() else 0.0,
    )
