"""Sudoku: generated puzzles have one solution and come fast; placements are made,
overwritten, emptied, or refused with the reason named; solving ends the episode."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_envs.puzzles.sudoku import SudokuEnv
from ragen_envs.puzzles.sudoku_solver import count_solutions, generate_puzzle, geometry, solve


def answer(*placements: str) -> str:
    return f"<think>t</think><answer>{' || '.join(placements)}</answer>"


def is_solution(grid: list[int], box: int) -> bool:
    n = box * box
    digits = set(range(1, n + 1))
    for unit in geometry(box):
        for k in range(n):
            if {grid[i] for i in range(n * n) if unit[i] == k} != digits:
                return False
    return True


@pytest.mark.parametrize("box, holes", [(2, 10), (3, 45), (3, 55)])
def test_generated_puzzles_have_exactly_one_solution(box, holes):
    for seed in range(25):
        puzzle, solution = generate_puzzle(np.random.default_rng(seed), box, holes)
        assert is_solution(solution, box)
        assert all(p in (0, s) for p, s in zip(puzzle, solution, strict=True))
        assert count_solutions(puzzle, box, limit=3) == (1, solution)
        assert holes - 3 <= puzzle.count(0) <= holes


def test_solver_counts_and_refuses_clashing_givens():
    empty = [0] * 16
    assert count_solutions(empty, 2, limit=5)[0] == 5
    assert is_solution(solve(empty, 2), 2)
    clash = [1, 1] + [0] * 14
    assert count_solutions(clash, 2) == (0, None) and solve(clash, 2) is None
    # Two cells whose digits can be swapped: two solutions.
    grid = [1, 2, 3, 4, 3, 4, 1, 2, 2, 1, 4, 3, 4, 3, 2, 1]
    holes = grid.copy()
    for cell in (0, 1, 8, 9):  # r1c1 r1c2 r3c1 r3c2: 1 2 / 2 1 swaps with 2 1 / 1 2
        holes[cell] = 0
    assert count_solutions(holes, 2)[0] == 2


def test_nine_by_nine_puzzles_are_unique_and_seeds_differ():
    # Reset speed (~3.5 ms a 9x9 puzzle here) is a figure for the env bench, not a
    # test: a wall-clock bound failed in CI when one reset was descheduled.
    env = gym.make("ragen/Sudoku9x9-v0").unwrapped
    for seed in range(20):
        env.reset(seed=seed)
        assert env.grid.count(0) == 45
        assert count_solutions(env.grid, env.box, limit=2) == (1, env.solution)
        assert all(g in (0, s) for g, s in zip(env.grid, env.solution, strict=True))
    firsts = {gym.make("ragen/Sudoku9x9-v0").reset(seed=s)[0] for s in range(10)}
    assert len(firsts) == 10


def _empty_cells(env: SudokuEnv) -> list[int]:
    return [i for i, v in enumerate(env.grid) if v == 0]


def _name(env: SudokuEnv, cell: int) -> str:
    return f"r{cell // env.size + 1}c{cell % env.size + 1}"


def test_refusals_name_the_reason():
    env = gym.make("ragen/Sudoku9x9-v0").unwrapped
    env.reset(seed=2)
    n = env.size
    given = next(i for i, v in enumerate(env.grid) if v)
    empty = _empty_cells(env)[0]
    row = empty // n
    in_row = next(env.grid[row * n + c] for c in range(n) if env.grid[row * n + c])
    obs, reward, term, trunc, info = env.step(
        answer(
            f"{_name(env, given)}={env.solution[given]}",
            f"{_name(env, empty)}={in_row}",
            "r10c1=1",
            f"{_name(env, empty)}=10",
            "r\u0661c1=1",  # an Arabic-Indic digit
            "put 5 in r1c1",
        )
    )
    assert f"{_name(env, given)}={env.solution[given]} (a given cell)" in obs
    assert f"({in_row} is already in row {row + 1}" in obs
    assert "r10c1=1 (rows and columns go from 1 to 9)" in obs
    assert "=10 (digits go from 1 to 9, or 0 to empty a cell)" in obs
    assert "r?c1=1 (not a placement like r1c2=3)" in obs  # quoted into the charset
    assert "put 5 in r1c1 (not a placement" in obs
    assert reward == env.format_penalty and not info["action_is_valid"]
    assert info["num_invalid_actions"] == 6 and info["num_actions"] == 0
    assert info["actions_left"] == env.action_budget  # refusals spend nothing
    assert env.observation_space.contains(obs)


def test_column_and_box_conflicts_are_named():
    env = SudokuEnv(size=4)
    for seed in range(50):
        env.reset(seed=seed)
        for cell in _empty_cells(env):
            r, c = divmod(cell, 4)
            column = [env.grid[k * 4 + c] for k in range(4) if env.grid[k * 4 + c]]
            row = [env.grid[r * 4 + k] for k in range(4) if env.grid[r * 4 + k]]
            only_col = [d for d in column if d not in row]
            if only_col:
                obs, *_ = env.step(answer(f"{_name(env, cell)}={only_col[0]}"))
                assert f"{only_col[0]} is already in column {c + 1}" in obs
                return
    pytest.fail("no column conflict found")


def test_wrong_but_legal_digits_stay_until_overwritten_and_solving_ends():
    env = SudokuEnv(size=4)
    for seed in range(50):
        env.reset(seed=seed)
        wrong = [
            (cell, d)
            for cell in _empty_cells(env)
            for d in range(1, 5)
            if d != env.solution[cell]
            and not any(env.grid[k] == d for k in _units_of(cell) if k != cell)
        ]
        if wrong:
            break
    cell, digit = wrong[0]
    obs, reward, term, trunc, info = env.step(answer(f"{_name(env, cell)}={digit}"))
    assert f"Placed {_name(env, cell)}={digit}." in obs and env.grid[cell] == digit
    assert reward == 0.0 and info["action_is_valid"] and info["action_is_effective"]
    assert info["actions_left"] == env.action_budget - 1
    # Emptied, then the solution placed turn by turn: success on the last placement.
    obs, *_ = env.step(answer(f"{_name(env, cell)}=0"))
    assert f"Emptied {_name(env, cell)}." in obs and env.grid[cell] == 0
    todo = [f"{_name(env, i)}={env.solution[i]}" for i in _empty_cells(env)]
    while todo:
        obs, reward, term, trunc, info = env.step(answer(*todo[:4]))
        todo = todo[4:]
    assert term and not trunc and info["success"] and reward == 1.0
    assert "Solved!" in obs and info["empty_cells"] == 0


def _units_of(cell: int, box: int = 2) -> list[int]:
    rows, cols, boxes = geometry(box)
    return [
        k
        for k in range(len(rows))
        if rows[k] == rows[cell] or cols[k] == cols[cell] or boxes[k] == boxes[cell]
    ]


def test_per_turn_limit_and_budget():
    env = SudokuEnv(size=9, action_budget=5)
    env.reset(seed=0)
    assert env.parser.max_actions == 9
    moves = [f"{_name(env, i)}={env.solution[i]}" for i in _empty_cells(env)]
    obs, reward, term, trunc, info = env.step(answer(*moves[:12]))
    assert info["num_actions"] == 5 and "Ignored 7 more (at most 5 placements" in obs
    assert trunc and not term and info["actions_left"] == 0 and reward == 0.0
    env = SudokuEnv(size=9)
    env.reset(seed=0)
    obs, _, _, _, info = env.step(answer(*moves[:12]))
    assert info["num_actions"] == 9 and "Ignored 3 more" in obs
    _, reward, *_ = env.step("<think>t</think><answer> || || </answer>")
    assert reward == env.format_penalty


def test_options_are_checked():
    with pytest.raises(ValueError, match="size must be 4 or 9"):
        SudokuEnv(size=6)
    with pytest.raises(ValueError, match="holes"):
        SudokuEnv(size=4, holes=16)
    env = SudokuEnv(size=9, separator=";", holes=20)
    assert env.answer_example == "r1c2=3 ; r4c4=1" and env.action_budget == 40
