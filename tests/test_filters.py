"""Rollout filtering (ragen_rllib.maths.filters and its connector), no Ray.

The batch: 8 groups of 4 trajectories; group g's rewards are [0, 0, 0, a_g], so its
sample std is a_g / 2 and its variance a_g^2 / 4:

    group     0     1     2     3     4     5     6     7
    std     0.05  0.25  0.10  0.45  0     0.15  0.40  0.20      (sum 1.6)
    order (largest first): 3, 6, 1, 7, 5, 2, 0, 4
"""

from __future__ import annotations

import pytest
import torch

from ragen_rllib.connectors.sample_batch import RolloutFilter
from ragen_rllib.maths.filters import (
    check_filter,
    filter_groups,
    in_group_std,
    num_groups_to_keep,
)
from ragen_rllib.records.trajectory import Trajectory

A = [0.1, 0.5, 0.2, 0.9, 0.0, 0.3, 0.8, 0.4]


def batch():
    rewards = [x for g in range(8) for x in (0.0, 0.0, 0.0, A[g])]
    groups = [g for g in range(8) for _ in range(4)]
    return torch.tensor(rewards), torch.tensor(groups)


def kept(strategy, value, **kw) -> set[int]:
    rewards, groups = batch()
    result = filter_groups(rewards, groups, strategy, value, **kw)
    chosen = set(groups[result.keep].tolist())
    assert int(result.keep.sum()) == 4 * len(chosen)  # whole groups only
    assert result.groups_after == len(chosen) and result.groups_before == 8
    return chosen


@pytest.mark.parametrize(
    "strategy, value, kw, groups",
    [
        ("top_k", 0.25, {}, {3, 6}),
        ("top_k", 0.5, {}, {3, 6, 1, 7}),
        ("top_k", 0.26, {}, {3, 6, 1}),  # ceil(2.08) = 3
        ("top_k", 1.0, {}, set(range(8))),
        ("top_k", 1.0, {"include_zero": False}, set(range(8)) - {4}),
        ("top_k", 0.25, {"direction": "smallest"}, {4, 0}),
        ("top_k", 0.25, {"direction": "smallest", "include_zero": False}, {0, 2}),
        ("top_k_abs", 3, {}, {3, 6, 1}),
        ("top_k_abs", 20, {}, set(range(8))),  # more than there are: all
        # top_p on std: the total is 1.6; 0.5 of it is reached by 0.45 + 0.40 = 0.85.
        ("top_p", 0.5, {}, {3, 6}),
        # 0.9 of 1.6 = 1.44: 0.45 + 0.40 + 0.25 + 0.20 + 0.15 = 1.45.
        ("top_p", 0.9, {}, {3, 6, 1, 7, 5}),
        # On variance (total 0.5): 0.9 of it = 0.45 is reached by 0.2025+0.16+0.0625+0.04.
        ("top_p", 0.9, {"metric": "reward_variance"}, {3, 6, 1, 7}),
        ("top_p", 1.0, {}, set(range(8))),
        # min_p: at least 0.5 x 0.45 = 0.225 of std; on variance 0.5 x 0.2025 = 0.10125.
        ("min_p", 0.5, {}, {3, 6, 1}),
        ("min_p", 0.5, {"metric": "reward_variance"}, {3, 6}),
        ("min_p", 1.0, {}, {3}),
        ("min_p", 0.0, {}, set(range(8))),
        # smallest: at most (1 - 0.5) x 0.45 = 0.225.
        ("min_p", 0.5, {"direction": "smallest"}, {4, 0, 2, 5, 7}),
    ],
)
def test_each_strategy_keeps_the_hand_computed_groups(strategy, value, kw, groups):
    assert kept(strategy, value, **kw) == groups


def test_the_in_group_std_before_and_after_is_reported():
    rewards, groups = batch()
    result = filter_groups(rewards, groups, "top_k", 0.25)
    assert result.std_before == pytest.approx(1.6 / 8)
    assert result.std_after == pytest.approx((0.45 + 0.40) / 2)


def test_ties_keep_group_order_and_ids_need_not_be_contiguous():
    rewards, groups = batch()
    perm = torch.randperm(32, generator=torch.Generator().manual_seed(0))
    ids = (groups * 10 + 5)[perm]
    result = filter_groups(rewards[perm].numpy(), ids.numpy(), "top_k", 0.25)
    assert set(ids[result.keep].tolist()) == {35, 65}
    flat = torch.zeros(32)  # every group has std 0: the smallest ids win the ties
    assert set(groups[filter_groups(flat, groups, "top_k", 0.25).keep].tolist()) == {0, 1}
    # Nothing varies and zero-score groups may not be kept: nothing is kept.
    assert not filter_groups(flat, groups, "top_p", 0.9, include_zero=False).keep.any()
    # With zero-score groups allowed, top_p has no total to share out: all are kept.
    assert bool(filter_groups(flat, groups, "top_p", 0.9).keep.all())


@pytest.mark.parametrize("strategy, value", [("top_k", 0.25), ("top_k_abs", 2), ("min_p", 0.5)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_group_with_a_non_finite_reward_is_never_kept(strategy, value, bad):
    """Its score is not finite; sorted, a NaN would come first and fill the kept share."""
    rewards, groups = batch()
    rewards[4 * 5] = bad  # group 5
    for direction in ("largest", "smallest"):
        result = filter_groups(rewards, groups, strategy, value, direction=direction)
        chosen = set(groups[result.keep].tolist())
        assert chosen and 5 not in chosen, (direction, chosen)
    assert kept(strategy, value) == set(
        groups[filter_groups(rewards, groups, strategy, value).keep].tolist()
    )


def test_in_group_std_and_num_groups_to_keep():
    std = in_group_std([1.0, 3.0, 5.0, 2.0], [4, 4, 4, 1])  # groups in id order: 1, 4
    assert std.tolist() == [0.0, pytest.approx(2.0)]  # sample std of 1, 3, 5
    assert num_groups_to_keep(8, 0.1) == 1 and num_groups_to_keep(10, 0.3) == 3


@pytest.mark.parametrize(
    "args, match",
    [
        (("top_k", 0.0, "largest", "reward_std"), "top_k takes a value in \\(0, 1\\]"),
        (("top_p", 1.5, "largest", "reward_std"), "top_p takes a value in \\(0, 1\\]"),
        (("top_k_abs", 2.5, "largest", "reward_std"), "whole number"),
        (("top_k_abs", 0, "largest", "reward_std"), "whole number"),
        (("min_p", -0.1, "largest", "reward_std"), "\\[0, 1\\]"),
        (("top_q", 0.5, "largest", "reward_std"), "strategy must be one of"),
        (("top_k", 0.5, "biggest", "reward_std"), "direction must be one of"),
        (("top_k", 0.5, "largest", "entropy"), "metric must be one of"),
    ],
)
def test_bad_settings_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        check_filter(*args)


class Logged:
    def __init__(self):
        self.values = {}

    def log_dict(self, values, key, window=None):
        self.values.update({f"{key}/{k}": v for k, v in values.items()})


def test_the_connector_keeps_whole_groups_and_logs_what_it_kept():
    rewards, groups = batch()
    trajs = [
        Trajectory(env_id="x", seed=0, group=int(g), turn_rewards=[float(r)])
        for r, g in zip(rewards, groups, strict=True)
    ]
    metrics = Logged()
    piece = RolloutFilter("top_p", 0.5, "largest", True, "reward_std")
    piece(rl_module=None, batch={}, episodes=trajs, metrics=metrics)
    assert {t.group for t in trajs} == {3, 6} and len(trajs) == 8
    assert metrics.values["filter/kept_fraction"] == 0.25
    assert metrics.values["filter/groups_kept"] == 2
    assert metrics.values["filter/in_group_reward_std_before"] == pytest.approx(0.2)
    assert metrics.values["filter/in_group_reward_std_after"] == pytest.approx(0.425)
    everything = RolloutFilter("top_k", 1.0, "largest", True, "reward_std")
    assert everything.keeps_everything
