"""Countdown and the free-text answer base: the safe evaluator (right values, clear
refusals, bounded work on hostile text), generated instances solvable, the env's turns."""

from __future__ import annotations

import time
from collections import Counter
from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_envs.core.answer_env import AnswerEnv, AnswerResult, quote
from ragen_envs.puzzles.countdown import CountdownEnv
from ragen_envs.puzzles.countdown_expr import (
    MAX_DEPTH,
    ExpressionError,
    evaluate,
    format_value,
    generate,
    solve,
)


def answer(body: str) -> str:
    return f"<think>t</think><answer>{body}</answer>"


# ----- the evaluator ------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, numbers, value",
    [
        ("1 + 2 * 3", [1, 2, 3], 7),
        ("(1 + 2) * 3", [1, 2, 3], 9),
        ("10 - 4 - 3", [10, 4, 3], 3),  # left to right
        ("100 / 10 / 5", [100, 10, 5], 2),
        ("7 / 2", [7, 2], Fraction(7, 2)),
        ("3 - 7", [3, 7], -4),
        ("(8 - 3 / 3) * 1", [8, 3, 3, 1], 7),  # a number given twice may be used twice
        ("((((5))))", [5], 5),
        ("6/(1-3/4)", [6, 1, 3, 4], 24),  # exact fractions along the way
        (" 25\t+\n3 ", [25, 3], 28),
        ("03 + 4", [3, 4], 7),
    ],
)
def test_evaluate_computes_exact_values(text, numbers, value):
    got, used = evaluate(text, numbers)
    assert got == value and isinstance(got, Fraction)
    assert Counter(used) <= Counter(numbers)


@pytest.mark.parametrize(
    "text, message",
    [
        ("2 + 5", "5 is not one of the numbers"),
        ("2 + 2", "2 is used more times than it is given"),
        ("2 ** 3", "powers are not allowed"),
        ("2 ^ 3", "powers are not allowed"),
        ("-2 + 3", "minus sign"),
        ("3 - -2", "minus sign"),
        ("3 +", "found the end"),
        ("(3 + 2", "'\\(' is not closed"),
        ("3 + 2)", "unexpected '\\)'"),
        ("3 2", "unexpected 2"),
        ("()", "found '\\)'"),
        ("", "empty"),
        ("   ", "empty"),
        ("3 / (2 - 2)", "used more times"),
        ("3 / (8 - 8)", "division by zero"),
        ("3 x 2", "use \\* for multiplication"),
        ("3 \u00d7 2", "use \\* for multiplication"),
        ("8 \u00f7 2", "use / for division"),
        ("3 + 2 = 5", "without '='"),
        ("\u0663 + 2", "U\\+0663"),  # an Arabic-Indic digit is not a digit here
        ("\uff13 + 2", "U\\+FF13"),  # nor is a full-width one
        ("3.0 + 2", "'.'"),
        ("1234567 + 2", "too long"),
    ],
)
def test_evaluate_refuses_with_a_clear_message(text, message):
    with pytest.raises(ExpressionError, match=message):
        evaluate(text, [3, 2, 8, 8])


def test_nesting_is_bounded():
    deep = "(" * MAX_DEPTH + "3" + ")" * MAX_DEPTH
    assert evaluate(deep, [3])[0] == 3
    with pytest.raises(ExpressionError, match="nest deeper"):
        evaluate("(" + deep + ")", [3])


@pytest.mark.parametrize(
    "text",
    [
        "(" * 1_000_000 + "1" + ")" * 1_000_000,
        "9" * 1_000_000,
        "1+" * 500_000 + "1",
        "\U0001f600" * 1_000_000,
        "(" * 199,
    ],
)
def test_hostile_text_is_refused_quickly(text):
    # CPU time of this process (others' load on the machine does not count): the bound
    # catches super-linear work, e.g. regex backtracking, ~100x over today's cost.
    start = time.process_time()
    with pytest.raises(ExpressionError):
        evaluate(text, [1, 9])
    assert time.process_time() - start < 0.5


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=60), st.text("0123456789+-*/() x=^.", max_size=60)))
def test_any_text_is_a_value_or_an_expression_error(text):
    try:
        value, used = evaluate(text, [1, 2, 3, 4, 0, 10])
    except ExpressionError:
        return
    assert isinstance(value, Fraction) and len(used) <= 6


def _random_tree(rng: np.random.Generator, numbers: list[int]) -> tuple[Fraction, str] | None:
    """A random fully parenthesised expression over ``numbers`` and its value, computed
    here without the parser (None when a division by zero comes up)."""
    items = [(Fraction(n), str(n)) for n in numbers]
    while len(items) > 1:
        i, j = rng.choice(len(items), size=2, replace=False)
        (a, ea), (b, eb) = items[i], items[j]
        op = "+-*/"[int(rng.integers(4))]
        if op == "/" and b == 0:
            return None
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else 0}[op]
        items = [item for k, item in enumerate(items) if k not in (i, j)]
        items.append((value, f"({ea} {op} {eb})"))
    return items[0]


def test_evaluate_agrees_with_a_direct_computation():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(500):
        numbers = [int(x) for x in rng.integers(0, 30, size=int(rng.integers(1, 7)))]
        tree = _random_tree(rng, numbers)
        if tree is None:
            continue
        value, text = tree
        assert evaluate(text, numbers)[0] == value, text
        checked += 1
    assert checked > 400


def test_format_value():
    assert format_value(Fraction(37)) == "37"
    assert format_value(Fraction(-3)) == "-3"
    assert format_value(Fraction(37, 4)) == "37/4"


# ----- generated instances --------------------------------------------------------------
@pytest.mark.parametrize("num_numbers, max_number, max_target", [(4, 100, 100), (3, 20, 50)])
def test_generated_instances_are_solvable(num_numbers, max_number, max_target):
    rng = np.random.default_rng(7)
    targets = set()
    for _ in range(200):
        numbers, target, construction = generate(rng, num_numbers, max_number, max_target)
        assert len(numbers) == num_numbers and all(1 <= n <= max_number for n in numbers)
        assert 1 <= target <= max_target
        value, used = evaluate(construction, numbers)
        assert value == target and sorted(used) == sorted(numbers)  # all numbers, once each
        found = solve(numbers, target)  # the demo's planner finds a solution too
        assert found is not None and evaluate(found, numbers)[0] == target
        targets.add(target)
    assert len(targets) > 30


def test_solver_says_none_when_there_is_no_solution():
    assert solve([1, 1], 5) is None
    assert solve([2, 3], 6) == "2 * 3"


# ----- the env ------------------------------------------------------------------------------
def test_single_turn_episode():
    env = gym.make("ragen/Countdown-v0").unwrapped
    obs, _ = env.reset(seed=0)
    assert obs == f"Numbers: {' '.join(map(str, env.numbers))}\nTarget: {env.target}"
    # An expression that cannot be computed: the penalty, no attempt spent, the episode open.
    obs, reward, term, trunc, info = env.step(answer(f"{env.numbers[0]} + 1000"))
    assert reward == env.format_penalty and not (term or trunc)
    assert "Invalid expression: 1000 is not one of the numbers." in obs
    assert info["format_ok"] and not info["action_is_valid"] and info["actions_left"] == 1
    # A wrong value ends the single-turn episode without reward.
    wrong = f"{env.numbers[0]} * {env.numbers[1]}"
    obs, reward, term, trunc, info = env.step(answer(wrong))
    value = env.numbers[0] * env.numbers[1]
    assert reward == 0.0 and trunc and not term and not info["success"]
    assert obs.startswith(f"{wrong} = {value}, not {env.target}.")
    assert info["expression_value"] == str(value) and info["numbers_used"] == 2
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step(answer(env.construction))
    assert reward == 1.0 and term and info["success"] and "Solved!" in obs


def test_multi_turn_gives_the_value_and_another_try():
    env = gym.make("ragen/CountdownMultiTurn-v0").unwrapped
    env.reset(seed=3)
    assert env.action_budget == 4 and "4 attempts" in env.instructions()
    for left in (3, 2):
        obs, reward, term, trunc, info = env.step(answer(str(env.numbers[0])))
        assert reward == 0.0 and not (term or trunc) and info["actions_left"] == left
        assert f"= {env.numbers[0]}, not {env.target}." in obs
    obs, reward, term, trunc, info = env.step(answer(env.construction))
    assert term and info["success"] and reward == 1.0


def test_format_failures_and_over_long_answers():
    env = CountdownEnv(attempts=2)
    env.reset(seed=1)
    obs, reward, term, trunc, info = env.step("(1 + 2)")
    assert not info["format_ok"] and reward == env.format_penalty and not (term or trunc)
    assert obs.startswith("Your answer could not be read: expected exactly one <answer>")
    _, _, _, _, info = env.step(answer("  "))
    assert info["format_error"] == "empty <answer>"
    _, _, _, _, info = env.step(answer("1" * 1001))
    assert "longer than 1000 characters" in info["format_error"]
    assert info["actions_left"] == 2
    with pytest.raises(ValueError, match="num_numbers"):
        CountdownEnv(num_numbers=7)
    with pytest.raises(ValueError, match="max_target"):
        CountdownEnv(max_number=100, max_target=50)


# ----- the free-text base ---------------------------------------------------------------
class _Echo(AnswerEnv):
    """Echoes the answer; counts the answers it was handed."""

    answer_example = "hello"
    state_max_length = 10

    def __init__(self, **kwargs):
        super().__init__(action_budget=3, max_answer_length=20, feedback_max_length=30, **kwargs)
        self.seen: list[str] = []

    def _new_episode(self):
        self.seen = []

    def _judge(self, text):
        self.seen.append(text)
        bad = tuple(part for part in self.split_parts(text) if part == "bad")
        good = tuple(part for part in self.split_parts(text) if part != "bad")
        return AnswerResult(reward=0.5, feedback=f"echo {quote(text)}", executed=good, rejected=bad)

    def _render_state(self):
        return "state"

    def _is_success(self):
        return False

    def _full_instructions(self):
        return "Say hello, e.g. <answer>hello</answer>."

    def _compact_instructions(self):
        return "hello"


def test_answer_env_turn_protocol():
    env = _Echo()
    env.reset(seed=0)
    assert env.action_names == ()
    obs, reward, term, trunc, info = env.step(answer(" a || b \u00e9 "))
    assert env.seen == ["a || b \u00e9"]  # stripped, never re-split by the base
    assert obs == "echo a || b ?\nstate" and reward == 0.5
    assert info["executed_actions"] == ("a", "b \u00e9") and info["actions_left"] == 1
    assert info["action_is_valid"] and info["action_is_effective"]
    obs, reward, term, trunc, info = env.step(answer("x" * 21))  # never handed over
    assert env.seen == ["a || b \u00e9"] and not info["format_ok"] and reward == -0.1
    assert len(obs.split("\n")[0]) <= 30 and obs.endswith("...\nstate")
    obs, reward, term, trunc, info = env.step(answer("c||bad"))
    assert reward == pytest.approx(0.5 - 0.1) and not info["action_is_valid"]
    assert info["num_invalid_actions"] == 1 and trunc  # the budget of 3 is spent
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step(answer("a"))


def test_quote_keeps_the_observation_charset():
    assert quote("abc") == "abc"
    assert quote("a\nb\u00e9") == "a?b?"
    assert quote("a\nb", newlines=True) == "a\nb"
    assert quote("x" * 100, limit=10) == "x" * 7 + "..."
