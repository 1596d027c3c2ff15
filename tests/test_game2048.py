"""2048: the merge rules, moves that change nothing, rewards, success and game over,
and tile spawns drawn from the seed (2 with p=0.9, else 4, in a uniform empty cell)."""

from __future__ import annotations

from collections import Counter

import gymnasium as gym
import numpy as np
import pytest

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_envs.grids.game2048 import (
    DIRECTIONS,
    Game2048Env,
    can_move,
    move,
    plan_moves,
    slide,
    spawn,
)


def answer(*moves: str) -> str:
    return f"<think>t</think><answer>{' || '.join(moves)}</answer>"


@pytest.mark.parametrize(
    "line, slid, merged",
    [
        ([2, 2, 2, 2], [4, 4, 0, 0], 8),
        ([2, 2, 4, 0], [4, 4, 0, 0], 4),  # the new 4 does not merge again
        ([4, 4, 8, 0], [8, 8, 0, 0], 8),
        ([0, 2, 0, 2], [4, 0, 0, 0], 4),
        ([2, 0, 2, 4], [4, 4, 0, 0], 4),
        ([8, 8, 8, 0], [16, 8, 0, 0], 16),  # the pair nearest the edge merges first
        ([2, 4, 8, 16], [2, 4, 8, 16], 0),
        ([0, 0, 0, 2], [2, 0, 0, 0], 0),
        ([0, 0, 0, 0], [0, 0, 0, 0], 0),
        ([4, 4, 4, 4, 4], [8, 8, 4, 0, 0], 16),
    ],
)
def test_slide_merges_each_pair_once(line, slid, merged):
    assert slide(line) == (slid, merged)


def test_moves_slide_towards_their_edge():
    board = (
        2, 0, 0, 2,
        2, 4, 0, 0,
        0, 4, 0, 0,
        0, 0, 0, 8,
    )  # fmt: skip
    assert move(board, "Left", 4) == ((4, 0, 0, 0, 2, 4, 0, 0, 4, 0, 0, 0, 8, 0, 0, 0), 4)
    assert move(board, "Right", 4) == ((0, 0, 0, 4, 0, 0, 2, 4, 0, 0, 0, 4, 0, 0, 0, 8), 4)
    assert move(board, "Up", 4) == ((4, 8, 0, 2, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0), 12)
    assert move(board, "Down", 4) == ((0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 4, 8, 0, 8), 12)


def test_stuck_boards_cannot_move():
    assert not can_move((2, 4, 4, 2), 2)
    assert can_move((2, 4, 2, 4), 2)  # columns merge
    assert can_move((2, 4, 8, 0), 2)  # an empty cell


def test_a_move_that_changes_nothing_is_valid_but_not_effective():
    env = Game2048Env()
    env.reset(seed=0)
    env.board = (2, 4, 2, 4) + (0,) * 12
    obs, reward, term, trunc, info = env.step(answer("Up", "Left"))
    assert env.board[:4] == (2, 4, 2, 4) and sum(v > 0 for v in env.board) == 4  # no new tile
    assert obs == "2 4 2 4\n. . . .\n. . . .\n. . . ."
    assert reward == 0.0 and info["action_is_valid"] and not info["action_is_effective"]
    assert info["num_actions"] == 2 and info["num_effective_actions"] == 0
    assert info["actions_left"] == env.action_budget - 2


def test_reward_is_the_merged_sum_scaled_and_the_target_ends_the_episode():
    env = Game2048Env(target_tile=64)
    env.reset(seed=0)
    env.board = (16, 16, 32, 0) + (0,) * 12
    _, reward, term, _, info = env.step(answer("Left"))
    assert env.board[:2] == (32, 32) and reward == pytest.approx(32 / 64)
    assert not term and info["score"] == 32 and info["max_tile"] == 32
    _, reward, term, trunc, info = env.step(answer("Left", "Right"))
    assert reward == pytest.approx(64 / 64) and term and not trunc and info["success"]
    assert info["num_actions"] == 1  # the episode ended at the merge into 64
    scaled = Game2048Env(reward_scale=1.0)
    scaled.reset(seed=0)
    scaled.board = (2, 2) + (0,) * 14
    assert scaled.step(answer("Left"))[1] == 4.0


def test_episode_ends_exactly_when_no_move_is_left():
    env = Game2048Env(size=2, target_tile=64, action_budget=200)
    ended = 0
    for seed in range(30):
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        term = trunc = False
        while not (term or trunc):
            _, _, term, trunc, info = env.step(answer(DIRECTIONS[int(rng.integers(4))]))
            assert term == (info["success"] or not can_move(env.board, 2))
        ended += term and not info["success"]
    assert ended == 30  # a 2x2 board fills up long before 64


def test_spawns_follow_the_seed_and_the_distribution():
    rng = np.random.default_rng(5)
    values, cells = Counter(), Counter()
    board = (0, 8, 0, 8, 0, 8, 0, 8, 8, 8, 8, 8, 8, 8, 8, 8)  # empty: 0, 2, 4, 6
    for _ in range(20_000):
        new = spawn(board, rng)
        (cell,) = [i for i in range(16) if new[i] != board[i]]
        values[new[cell]] += 1
        cells[cell] += 1
    assert set(values) == {2, 4} and 0.09 < values[4] / 20_000 < 0.11
    assert set(cells) == {0, 2, 4, 6} and all(4500 < n < 5500 for n in cells.values())

    def boards(seed):
        env = gym.make("ragen/2048-v0").unwrapped
        out = [env.reset(seed=seed)[0]]
        for direction in ("Left", "Down", "Right", "Up", "Left"):
            out.append(env.step(answer(direction))[0])
        return out

    assert boards(3) == boards(3) and boards(3) != boards(4)
    assert len({gym.make("ragen/2048-v0").reset(seed=s)[0] for s in range(20)}) > 10


def test_the_first_board_holds_two_small_tiles():
    env = Game2048Env()
    for seed in range(20):
        env.reset(seed=seed)
        assert sorted(v for v in env.board if v) in ([2, 2], [2, 4], [4, 4])


def test_planner_plays_legal_moves():
    rng = np.random.default_rng(0)
    board = (2, 2, 0, 0) + (0,) * 12
    moves = plan_moves(board, 4, 5, rng)
    assert 1 <= len(moves) <= 5 and set(moves) <= set(DIRECTIONS)
    assert plan_moves((2, 4, 4, 2), 2, 3, rng) == ["Up"]  # stuck: a harmless default


def test_options_are_checked():
    for bad in ({"target_tile": 100}, {"target_tile": 4}, {"size": 9}, {"reward_scale": 0}):
        with pytest.raises(ValueError):
            Game2048Env(**bad)
    env = Game2048Env(target_tile=2048, action_budget=1000)
    assert "Make a tile of 2048." in env.instructions() and "divided by 2048" in env.instructions()
