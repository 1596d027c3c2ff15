"""Every env's random agent (``env.random_actions``) and answer-language check
(``env.well_formed``).

The random agent is the demo's baseline: its answers must be ones the env
accepts in every state it meets (on Sudoku, legal placements), yet aim at
nothing. ``well_formed`` says whether an answer is written in the env's answer
language whatever the state: a refused answer (numbers that are not given, a
placement on a given cell) can still be well formed, like a move into a wall.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import walk_with

import ragen_envs
from ragen_envs.demo import random_agent


def _answer(env, actions):
    return f"<think>x</think><answer>{f' {env.parser.separator} '.join(actions)}</answer>"


@pytest.mark.parametrize("env_id", ragen_envs.ENV_IDS)
def test_random_answers_are_accepted_on_every_turn(env_id):
    env = gym.make(env_id).unwrapped
    rng = np.random.default_rng(1)

    def answer(e):
        text = _answer(e, e.random_actions(rng))
        assert e.well_formed(text), text
        return text

    assert walk_with(env, answer) >= 8
    env.reset(seed=0)
    assert random_agent(env, np.random.default_rng(5)) == env.random_actions(
        np.random.default_rng(5)
    )


def test_sudoku_random_placements_clash_with_nothing_yet_ignore_the_solution():
    env = gym.make("ragen/Sudoku9x9-v0").unwrapped
    rng = np.random.default_rng(0)
    wrong = 0
    for seed in range(20):
        env.reset(seed=seed)
        for part in env.random_actions(rng):
            cell, digit, error = env._read(part)
            assert not error, part
            env.grid[cell] = digit
            wrong += digit != env.solution[cell]
    assert wrong > 0  # legal is not correct: no policy leaks in


@pytest.mark.parametrize(
    ("env_id", "good", "bad"),
    [
        ("ragen/FrozenLakeNoSlip-v0", ["Up", "Left || Down"], ["Jump", ""]),
        ("ragen/Countdown-v0", ["(1 + 2) * 3", "7 / (3 - 3)"], ["(38 + (6 + 6) / 10", "5) + 9"]),
        ("ragen/Sudoku4x4-v0", ["r1c1=4", "r2c3=0 || r4c4=1"], ["r1c1=5", "r5c1=1", "place 4"]),
        ("ragen/MathWordProblems-v0", ["42", "The answer is 7", "no idea"], [" "]),  # any reply
        ("ragen/SearchQA-v0", ["search: capital of Karsk", "answer: Ilsa"], ["Ilsa", "search:"]),
    ],
)  # fmt: skip
def test_well_formed_reads_the_language_not_the_state(env_id, good, bad):
    env = gym.make(env_id).unwrapped
    env.reset(seed=0)
    for body in good:
        assert env.well_formed(f"<think>x</think><answer>{body}</answer>"), body
    for body in bad:
        assert not env.well_formed(f"<think>x</think><answer>{body}</answer>"), body
    assert not env.well_formed(f"<answer>{good[0]}</answer>")  # no think block


def test_a_refused_answer_can_be_well_formed():
    env = gym.make("ragen/Countdown-v0").unwrapped
    env.reset(seed=0)
    missing = next(n for n in range(1, 200) if n not in env.numbers)
    text = f"<think>x</think><answer>{missing} + {env.numbers[0]}</answer>"
    assert env.well_formed(text)
    info = env.step(text)[4]
    assert info["format_ok"] and not info["action_is_valid"]
