"""Countdown as a text environment: reach the target from the given numbers.

The agent sees a few numbers and a target, and answers with an arithmetic
expression (``+ - * /``, parentheses, the given numbers, each at most once),
e.g. ``<answer>(25 - 5) * 3</answer>``. The expression is read by the safe
evaluator of :mod:`.countdown_expr` with exact fractions, so ``7 / 2`` is 7/2
and intermediate fractions are allowed. Every instance is solvable: the
target is built from a random expression over all the numbers.

Reward: 1.0 when the expression equals the target exactly (the episode ends,
success), 0.0 for a readable expression with another value, and the format
penalty for an answer that cannot be read or computed (bad tags or syntax, a
number not given or used twice, division by zero); the observation says which.

Single-turn by default (``attempts=1``): the first expression that can be
computed ends the episode. An answer that cannot be read or computed spends no
attempt, as an invalid arm name leaves a Bandit episode open: the observation
says what is wrong and the trainer's turn limit bounds the episode (set
``max_turns=1`` for a strictly single turn). With more attempts the
observation after a miss says what the expression equals ("(25 - 5) * 3 = 60,
not 74.") and the agent tries again until it is right or the attempts are
spent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.answer_env import AnswerEnv, AnswerResult, quote
from .countdown_expr import (
    MAX_EXPRESSION_LENGTH,
    ExpressionError,
    evaluate,
    format_value,
    generate,
    random_expression,
    tokenize,
)

SOLVED_REWARD = 1.0


class CountdownEnv(AnswerEnv):
    """Countdown with generated, always solvable instances.

    Args:
        num_numbers: how many numbers are drawn, 2 to 6.
        max_number: the numbers are drawn uniformly from [1, max_number].
        max_target: the target lies in [1, max_target] (at least ``max_number``).
        attempts: computed expressions the agent may give (1: single-turn); the
            default ``action_budget``.
        **kwargs: passed to :class:`AnswerEnv` / :class:`TextEnv` (format_penalty,
            require_think, instructions, ...).
    """

    answer_example = "(25 - 5) * 3"
    state_max_length = 120
    turn_info_defaults = {"expression_value": None, "numbers_used": 0}

    def __init__(
        self,
        num_numbers: int = 4,
        max_number: int = 100,
        max_target: int = 100,
        attempts: int = 1,
        **kwargs: Any,
    ) -> None:
        for name, value, low, high in (
            ("num_numbers", num_numbers, 2, 6),
            ("max_number", max_number, 1, 9999),
            ("max_target", max_target, max_number, 10**6),
            ("attempts", attempts, 1, 1000),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")
        self.num_numbers = num_numbers
        self.max_number = max_number
        self.max_target = max_target
        self.attempts = attempts
        kwargs.setdefault("action_budget", attempts)
        super().__init__(**kwargs)
        self.numbers: list[int] = []
        self.target = 0
        #: The expression the target was built from (one solution among possibly many).
        self.construction = ""
        self._solved = False

    def _new_episode(self) -> None:
        self.numbers, self.target, self.construction = generate(
            self.np_random, self.num_numbers, self.max_number, self.max_target
        )
        self._solved = False

    def _judge(self, answer: str) -> AnswerResult:
        try:
            value, used = evaluate(answer, self.numbers)
        except ExpressionError as err:
            return AnswerResult(
                feedback=f"Invalid expression: {err}.",
                rejected=(answer,),
            )
        self._solved = value == self.target
        shown = f"{quote(' '.join(answer.split()), 80)} = {format_value(value)}"
        if self._solved:
            feedback = f"{shown}, the target. Solved!"
        else:
            feedback = f"{shown}, not {self.target}."
        return AnswerResult(
            reward=SOLVED_REWARD if self._solved else 0.0,
            feedback=feedback,
            executed=(answer,),
            terminated=self._solved,
            info={"expression_value": format_value(value), "numbers_used": len(used)},
        )

    def _well_formed_body(self, answer: str) -> bool:
        """An arithmetic expression, over whichever numbers it names."""
        try:
            literals = [tok for tok in tokenize(answer) if isinstance(tok, int)]
            evaluate(answer, literals)
        except ExpressionError as err:
            return str(err) == "division by zero"
        return True

    def random_actions(self, rng: np.random.Generator) -> list[str]:
        """A random expression over this episode's numbers (see :func:`random_expression`)."""
        return [random_expression(rng, self.numbers)]

    def _is_success(self) -> bool:
        return self._solved

    def _render_state(self) -> str:
        return f"Numbers: {' '.join(map(str, self.numbers))}\nTarget: {self.target}"

    def _compact_instructions(self) -> str:
        return (
            "Make the target from the numbers with + - * / and parentheses, each number at "
            f"most once. Answer with the expression, e.g. {self.answer_example}"
        )

    def _full_instructions(self) -> str:
        tries = (
            "You have 1 attempt."
            if self.action_budget == 1
            else f"You have {self.action_budget} attempts; after a miss you are told what "
            "your expression equals."
        )
        return (
            "Countdown: combine the given numbers with +, -, *, / and parentheses so that "
            "the expression equals the target. Use each number at most once; you need not "
            "use all of them. Division is exact (fractions are allowed along the way); "
            "there is no unary minus and no power.\n"
            f"Answer with the expression alone, at most {MAX_EXPRESSION_LENGTH} characters, "
            f"e.g. {self.parser.wrap(self.answer_example)}. Reward 1 when it equals the "
            f"target. {tries}"
        )
