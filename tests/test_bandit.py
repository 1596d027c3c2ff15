"""Bandit: payout statistics, presets, success definition."""

from __future__ import annotations

import pytest

from ragen_envs.puzzles.bandit import Arm, BanditEnv, preset_arms


def pull(name: str) -> str:
    return f"<think>t</think><answer>{name}</answer>"


def test_mean_payout_matches_spec_over_100k_pulls():
    # Every preset uses the same two payout distributions; names are all that differ.
    env = BanditEnv(preset="phoenix_dragon")
    for arm in env.arms:
        total, n = 0.0, 100_000
        for seed in range(n):
            env.reset(seed=seed)
            _, reward, term, _, info = env.step(pull(arm.name))
            assert term and info["chosen_arm"] == arm.name
            total += reward
        assert abs(total / n - arm.mean) <= 0.01 * arm.mean, (arm, total / n)


def test_custom_payout_distribution():
    arms = [
        {"name": "Left", "payouts": [[2.0, 0.5], [0.0, 0.5]]},
        {"name": "Right", "payouts": [[0.5, 1.0]]},
        {"name": "Middle", "payouts": [[3.0, 0.1], [0.0, 0.9]]},
    ]
    env = BanditEnv(arms=arms)
    counts = {}
    for seed in range(200):
        obs, _ = env.reset(seed=seed)
        counts[obs] = counts.get(obs, 0) + 1
        _, r, _, _, info = env.step(pull("left"))
        assert r in (0.0, 2.0) and info["success"]  # Left has the best mean (1.0)
    assert len(counts) == 6  # every order of three arms shows up


def test_presets_and_reversal():
    low, high = preset_arms("librarian_trader")
    assert (low.name, high.name) == ("Librarian", "Trader") and high.mean > low.mean
    low, high = preset_arms("librarian_trader_rev")
    assert (low.name, high.name) == ("Trader", "Librarian")
    assert high.mean == pytest.approx(0.25) and low.mean == pytest.approx(0.1)


def test_success_means_the_high_ev_arm():
    env = BanditEnv(preset="librarian_trader_rev")
    env.reset(seed=0)
    assert env.step(pull("Librarian"))[4]["success"]
    env.reset(seed=0)
    assert not env.step(pull("Trader"))[4]["success"]


def test_arm_order_is_drawn_per_seed_and_deterministic():
    env = BanditEnv()
    orders = {env.reset(seed=s)[0] for s in range(50)}
    assert orders == {"Arms: Phoenix, Dragon", "Arms: Dragon, Phoenix"}
    assert env.reset(seed=11)[0] == env.reset(seed=11)[0]


def test_no_valid_pull_keeps_the_episode_open():
    env = BanditEnv()
    env.reset(seed=0)
    _, r, term, trunc, info = env.step(pull("Unicorn"))
    assert (r, term, trunc, info["num_actions"]) == (pytest.approx(-0.1), False, False, 0)
    strict = BanditEnv(max_turns=1)
    strict.reset(seed=0)
    assert strict.step(pull("Unicorn"))[3] is True


@pytest.mark.parametrize(
    "arms, match",
    [
        ([{"name": "A", "payouts": [[1.0, 0.5]]}, {"name": "B", "payouts": [[1, 1]]}], "sum to 1"),
        ([{"name": "A", "payouts": [[1.0, 1.0]]}], "at least two"),
        ([{"name": "A", "payouts": [[1, 1]]}, {"name": "a", "payouts": [[1, 1]]}], "distinct"),
        ([{"name": "A||B", "payouts": [[1, 1]]}, {"name": "C", "payouts": [[1, 1]]}], "'\\|'"),
        ([{"label": "A"}, {"name": "C", "payouts": [[1, 1]]}], "name"),
    ],
)
def test_bad_arms_are_rejected(arms, match):
    with pytest.raises(ValueError, match=match):
        BanditEnv(arms=arms)


def test_unknown_preset():
    with pytest.raises(ValueError, match="phoenix_dragon"):
        BanditEnv(preset="nope")
    assert Arm("X", ((1.0, 1.0),)).mean == 1.0
