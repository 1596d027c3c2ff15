"""Math word problems from a dataset file (or a generated set) as a text environment.

Each reset draws one question/answer pair with the env's seeded generator (or the
pair ``options={"index": i}`` names, to walk a whole file in evaluation) and shows
the question. The agent replies with its final answer, e.g. ``<answer>42</answer>``;
a ``\\boxed{...}``, a ``#### 42`` line or "The answer is 42" inside ``<answer>`` is
read as well (:func:`.qa_answers.extract_final_answer`), and the answer is compared
with the gold one by :func:`.qa_answers.answers_match`: the same exact number when the
gold answer is a number (``1,234`` = ``1234``, ``3/4`` = ``0.75``, ``$5`` = ``5``, ``50%``
= ``50``), else the same string up to whitespace.

Reward 1.0 for the right answer (success, the episode ends), 0.0 otherwise.
Single-turn by default (``max_attempts=1``): the first answer read ends the
episode. With more attempts a wrong answer brings "... is incorrect, try again"
and another turn, until the answer is right or the attempts are spent. As in
Countdown, an answer that cannot be read (broken tags, or no final answer in it,
such as an empty ``\\boxed{}``) gets the format penalty and a message, and spends
no attempt: the trainer's turn limit bounds the episode (``max_turns=1`` makes it
strictly one turn).

Data (:mod:`.qa_data`): ``path`` names a JSONL or Parquet file, GSM8K-shaped
(``question``, ``answer`` ending in ``#### 42``), MetaMathQA-shaped (``query``,
``response`` ending in "The answer is: 42"), or any other with ``question_field``
and ``answer_field``; ``answer_format`` says how the gold answer is read from its
field. Without ``path``, the 1000 generated arithmetic problems of
:mod:`.word_problems`. A file is read once per process, at the first env's
construction, so a bad file is reported there, naming the keyword argument.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.answer_env import OBS_CHARSET, AnswerEnv, AnswerResult, quote
from .qa_answers import answers_match, extract_final_answer
from .qa_data import load_qa_dataset

CORRECT_REWARD = 1.0
_QUESTION = "Question: "


def _attempts(n: int) -> str:
    return f"{n} attempt" + ("" if n == 1 else "s")


class DatasetQAEnv(AnswerEnv):
    """Question answering over a dataset of question/final-answer pairs.

    Args:
        path: a JSONL (``.jsonl``, ``.ndjson``, ``.json``; a ``.json`` file may hold
            one JSON array instead) or Parquet (``.parquet``, ``.pq``) file; None: the
            generated arithmetic word problems.
        question_field: the question's field (default: the first of ``question``,
            ``query``, ``problem`` the file has).
        answer_field: the answer's field (default: the first of ``answer``,
            ``response``, ``solution``).
        answer_format: how the gold answer is read from its field: ``"auto"`` (the
            rules a reply is read by: ``\\boxed{}``, ``####``, "The answer is", else the
            whole field), ``"gsm8k"`` (the ``####`` line), ``"boxed"`` (the last
            ``\\boxed{}``) or ``"plain"`` (the whole field).
        max_attempts: answers the agent may give (1: single-turn); the default
            ``action_budget``.
        **kwargs: passed to :class:`AnswerEnv` / :class:`TextEnv`.
    """

    open_vocabulary = True
    answer_example = "42"
    turn_info_defaults = {"extracted_answer": ""}

    def __init__(
        self,
        path: Any = None,
        question_field: str | None = None,
        answer_field: str | None = None,
        answer_format: str = "auto",
        max_attempts: int = 1,
        **kwargs: Any,
    ) -> None:
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool):
            raise ValueError(f"max_attempts must be an int in [1, 100], got {max_attempts!r}")
        if not 1 <= max_attempts <= 100:
            raise ValueError(f"max_attempts must be an int in [1, 100], got {max_attempts!r}")
        self.dataset = load_qa_dataset(path, question_field, answer_field, answer_format)
        self.max_attempts = max_attempts
        # Questions are shown as they are: the observation may use their characters.
        self.obs_charset = "".join(sorted(set(OBS_CHARSET) | self.dataset.charset))
        self.state_max_length = len(_QUESTION) + self.dataset.max_question_length
        kwargs.setdefault("action_budget", max_attempts)
        super().__init__(**kwargs)
        self.index = 0
        self._wanted: int | None = None
        self._solved = False
        self._attempts = 0

    @property
    def question(self) -> str:
        return self.dataset.questions[self.index]

    @property
    def gold(self) -> str:
        """The gold final answer of this episode."""
        return self.dataset.answers[self.index]

    # ----- episode ------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """``options={"index": i}`` plays the i-th record instead of a seeded draw."""
        wanted = (options or {}).get("index")
        if wanted is not None and (
            not isinstance(wanted, int)
            or isinstance(wanted, bool)
            or not 0 <= wanted < len(self.dataset)
        ):
            raise ValueError(
                f"options['index'] must be an int in [0, {len(self.dataset) - 1}], got {wanted!r}"
            )
        self._wanted = wanted
        return super().reset(seed=seed, options=options)

    def _new_episode(self) -> None:
        drawn = int(self.np_random.integers(len(self.dataset)))
        self.index = drawn if self._wanted is None else self._wanted
        self._solved = False
        self._attempts = 0

    def _well_formed_body(self, answer: str) -> bool:
        """A final answer can be extracted."""
        return bool(extract_final_answer(answer))

    def random_actions(self, rng: np.random.Generator) -> list[str]:
        """A random whole number from 0 to 200."""
        return [str(int(rng.integers(0, 201)))]

    def _is_success(self) -> bool:
        return self._solved

    def _extra_info(self) -> dict[str, Any]:
        return {"attempts": self._attempts}

    def _judge(self, answer: str) -> AnswerResult:
        extracted = extract_final_answer(answer)
        if not extracted:
            return AnswerResult(
                feedback="No final answer found in your answer: write it alone, e.g. 42.",
                rejected=(answer,),
            )
        self._attempts += 1
        left = self.max_attempts - self._attempts
        self._solved = answers_match(extracted, self.gold)
        shown = quote(" ".join(extracted.split()), 60)
        if self._solved:
            feedback = f"{shown} is correct!"
        elif left:
            feedback = f"{shown} is incorrect, try again ({_attempts(left)} left)."
        else:
            feedback = f"{shown} is incorrect; the answer was {quote(self.gold, 60)}."
        return AnswerResult(
            reward=CORRECT_REWARD if self._solved else 0.0,
            feedback=feedback,
            executed=(extracted,),
            terminated=self._solved or left <= 0,
            info={"extracted_answer": extracted[:200]},
        )

    # ----- text ----------------------------------------------------------------------
    def _render_state(self) -> str:
        return _QUESTION + self.question

    def _compact_instructions(self) -> str:
        return f"Solve the problem. Answer with the final answer alone, e.g. {self.answer_example}"

    def _full_instructions(self) -> str:
        tries = (
            "You have 1 attempt."
            if self.max_attempts == 1
            else f"You have {self.max_attempts} attempts; after a wrong answer you are told "
            "to try again."
        )
        return (
            "Solve the math word problem in the question. Work it out step by step, then "
            "give the final answer alone, a number without units, in the answer block, e.g. "
            f"{self.parser.wrap(self.answer_example)}. A \\boxed{{...}} or 'The answer is ...' "
            "inside the answer block is read too; 1,234 and 1234, 3/4 and 0.75 are the same "
            f"answer. Reward 1 for the right answer. {tries}"
        )
