"""The control envs of bench/: one fixed map or room, whatever the seed, with the
answer their docstrings give.

``FixedLake-v0`` (bench/fixed_lake.py) and ``FixedSokoban-v0``
(bench/fixed_sokoban.py) are what the random-map examples are judged against,
so they must really be one task: the same observation after every reset, and a
known shortest solution that the env rewards as a success.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import fixed_lake  # noqa: E402,F401  (registers FixedLake-v0)
import fixed_sokoban  # noqa: E402,F401  (registers FixedSokoban-v0)

from ragen_envs.grids.frozenlake import shortest_path  # noqa: E402
from ragen_envs.grids.sokoban import MOVES  # noqa: E402
from ragen_envs.grids.sokoban_solver import solve  # noqa: E402


def answer(move: str) -> str:
    return f"<think> go </think> <answer> {move} </answer>"


def _observations(env_id: str, seeds, **kwargs) -> set[str]:
    env = gym.make(env_id, coordinates=True, **kwargs).unwrapped
    return {env.reset(seed=seed)[0] for seed in seeds}


@pytest.mark.parametrize("env_id", ["FixedLake-v0", "FixedSokoban-v0"])
def test_every_reset_gives_the_same_task(env_id):
    assert len(_observations(env_id, range(20))) == 1
    # ... and a new episode on the same env object too (no reseeding).
    env = gym.make(env_id).unwrapped
    first = env.reset(seed=0)[0]
    env.step(answer("Up"))
    assert env.reset()[0] == first


def test_fixed_lake_is_a_four_move_path_past_two_holes():
    env = gym.make("FixedLake-v0").unwrapped
    env.reset(seed=5)
    path = shortest_path(env.holes, env.start, env.goal)
    assert len(path) == 4 and int(env.holes.sum()) >= 2
    for move in path:
        _, reward, terminated, _, info = env.step(answer(move))
    assert terminated and info["success"] and reward > 0


def test_fixed_sokoban_is_five_moves_with_three_pushes():
    env = gym.make("FixedSokoban-v0").unwrapped
    env.reset(seed=11)
    room = env.state()
    path = solve(room)
    assert path == ["Up", "Up", "Right", "Up", "Left"]
    player, boxes, pushes = room.player, set(room.boxes), 0
    for move in path:
        dr, dc = MOVES[move]
        player = (player[0] + dr, player[1] + dc)
        if player in boxes:
            boxes.remove(player)
            boxes.add((player[0] + dr, player[1] + dc))
            pushes += 1
    assert pushes == 3 and boxes <= room.targets
    for move in path:
        _, _, terminated, _, info = env.step(answer(move))
    assert terminated and info["success"]
