"""The outcome statistics of a batch: how its groups' rollouts agree (all succeeded,
all failed, mixed, the very same answers)."""

from __future__ import annotations

import pytest

from ragen_rllib.env_runner.metrics import group_outcomes, rollout_metrics
from ragen_rllib.records.trajectory import Trajectory


def rollout(group: int, success: bool, answers: list[str]) -> Trajectory:
    return Trajectory(
        env_id="x",
        seed=group,
        group=group,
        answers=answers,
        success=success,
        turn_rewards=[float(success)] * len(answers),
    )


def test_groups_are_counted_by_outcome_and_by_identical_answers():
    batch = [
        # group 0: both won, with different answers
        rollout(0, True, ["Up", "Right"]),
        rollout(0, True, ["Right", "Up"]),
        # group 1: both lost with the same answers turn by turn
        rollout(1, False, ["Left", "Left"]),
        rollout(1, False, ["Left", "Left"]),
        # group 2: one won, one lost
        rollout(2, True, ["Down"]),
        rollout(2, False, ["Up"]),
        # group 3: both lost, the same first answer but not the same second
        rollout(3, False, ["Up", "Down"]),
        rollout(3, False, ["Up", "Left"]),
    ]
    stats = rollout_metrics(batch)
    assert stats["groups_all_success"] == pytest.approx(1 / 4)
    assert stats["groups_all_fail"] == pytest.approx(2 / 4)
    assert stats["groups_mixed"] == pytest.approx(1 / 4)
    assert stats["groups_same_answers"] == pytest.approx(1 / 4)
    assert stats["success_rate"] == pytest.approx(3 / 8)


def test_groups_of_one_rollout_are_left_out():
    # One answer per evaluation state: a group of one agrees with itself, which
    # says nothing, so the statistics are not reported.
    singles = [rollout(g, g % 2 == 0, ["Up"]) for g in range(4)]
    assert group_outcomes(singles) == {}
    assert "groups_mixed" not in rollout_metrics(singles)
    pair = singles + [rollout(0, False, ["Down"])]
    assert group_outcomes(pair) == {
        "groups_all_success": 0.0,
        "groups_all_fail": 0.0,
        "groups_mixed": 1.0,
        "groups_same_answers": 0.0,
    }
