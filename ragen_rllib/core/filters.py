"""StarPO-S uncertainty filtering: keep the rollout groups whose rewards vary most.

Data flow: after a rollout, every group holds the trajectories started from
one initial state. A group whose trajectories all score the same teaches the
policy little (GRPO gives it zero advantage; with a critic it mostly adds
noise), so StarPO-S ranks groups by the standard deviation of their
trajectory rewards and keeps only the top share before advantages are
computed. The sample-stage connector calls ``select_groups_by_reward_std``;
``group_reward_std`` exposes the per-group values for metrics.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .advantages import group_stats

FILTER_MODES = ("top_std", "bottom_std")


def group_reward_std(scores: Any, group_ids: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(group ids [G] ascending, std [G] float64)``: each group's SAMPLE std (n - 1).

    Same definition as the GRPO normaliser; a group of size 1 has std 0.
    """
    unique_ids, _, _, _, std = group_stats(scores, group_ids)
    return unique_ids, std


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


def select_groups_by_reward_std(
    scores: Any,
    group_ids: Any,
    keep_ratio: float = 0.25,
    mode: str = "top_std",
    min_groups: int = 1,
) -> torch.Tensor:
    """Bool mask [N] keeping ALL trajectories of the selected groups.

    ``scores``     # [N] trajectory rewards (torch, numpy or list)
    ``group_ids``  # [N] group of each trajectory
    Groups are ranked by in-group reward std, highest first for ``"top_std"``
    (StarPO-S) and lowest first for ``"bottom_std"`` (an ablation); ties go to
    the smaller group id, so the result is deterministic. The number kept is
    ``num_groups_to_keep`` (ceil); ``keep_ratio == 1.0`` keeps everything.
    """
    if mode not in FILTER_MODES:
        raise ValueError(f"mode must be one of {FILTER_MODES}, got {mode!r}")
    unique_ids, inverse, _, _, std = group_stats(scores, group_ids)
    n_keep = num_groups_to_keep(unique_ids.numel(), keep_ratio, min_groups)
    # unique_ids is ascending and the sort is stable, so equal stds keep id order.
    order = torch.sort(std, descending=(mode == "top_std"), stable=True).indices  # [G]
    keep_group = torch.zeros(unique_ids.numel(), dtype=torch.bool, device=std.device)
    keep_group[order[:n_keep]] = True
    return keep_group[inverse]  # [N]
