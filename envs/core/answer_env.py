"""A base for envs whose answer is free text: an expression, placements, a reply.

:class:`TextEnv` reads ``<answer>`` as a list of action names from a fixed
vocabulary. Some tasks do not fit that: Countdown's answer is an arithmetic
expression, Sudoku's a list of placements such as ``r2c3=4``, a question's a
short reply. :class:`AnswerEnv` keeps TextEnv's turn protocol (budgets, format
penalty, the ``info`` keys, instructions styles) and changes only how an answer
is read:

1. the tag structure is checked by :func:`.parsing.read_answer_block` (linear
   time, never raises); a broken structure, an empty answer or one longer than
   ``max_answer_length`` characters is a format failure, which the subclass
   never sees;
2. otherwise the stripped answer text goes to the subclass's :meth:`AnswerEnv._judge`,
   which returns an :class:`AnswerResult`: the reward, what was carried out,
   what was refused (refusals bring the format penalty), and a feedback line;
3. the next observation is that feedback followed by the state
   (:meth:`AnswerEnv._render_state`). Feedback is clipped to
   ``feedback_max_length`` characters; text quoted from the answer should go
   through :func:`quote`, which keeps it inside the observation's charset.

A subclass implements ``_new_episode``, ``_judge``, ``_render_state``,
``_is_success`` and the two instructions styles, and sets ``answer_example``
(a well-formed answer body, named in both instruction styles) and
``state_max_length``. It has no action vocabulary: ``action_names`` is empty.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .base import TextEnv
from .parsing import ParsedAnswer, read_answer_block

#: Printable ASCII and the newline: every character an AnswerEnv observation may hold.
OBS_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n"


def quote(text: str, limit: int = 40, newlines: bool = False) -> str:
    """``text`` made safe to show in an observation: characters outside
    :data:`OBS_CHARSET` (and newlines, unless ``newlines``) become ``?``, and text
    longer than ``limit`` is cut and ends in ``...``.

    >>> quote("r1c1=\\u0663 and more", limit=12)
    'r1c1=? an...'
    """
    clipped = text[: limit + 1]
    keep = OBS_CHARSET if newlines else OBS_CHARSET.replace("\n", "")
    safe = "".join(ch if ch in keep else "?" for ch in clipped)
    return safe if len(safe) <= limit else safe[: max(limit - 3, 0)] + "..."


@dataclass(frozen=True)
class AnswerResult:
    """What a free-text env made of one answer (the return of :meth:`AnswerEnv._judge`).

    reward: the env reward of the turn (the format penalty is added by the base).
    feedback: the line(s) that open the next observation, e.g. "37 is not 50.".
    executed: the parts of the answer that were carried out, in order, e.g. the
        placements made (shown in ``info["executed_actions"]``).
    rejected: the parts refused as invalid; any rejection brings the format
        penalty once and sets ``info["action_is_valid"]`` False.
    spent: actions taken from the trajectory's budget (default: ``len(executed)``).
    effective: how many executed parts changed the state (default: all of them).
    terminated: the episode is over (solved, or lost for good).
    info: extra entries for this turn's ``info``, over the env's
        ``turn_info_defaults`` (which unread answers get alone).
    """

    reward: float = 0.0
    feedback: str = ""
    executed: tuple[str, ...] = ()
    rejected: tuple[str, ...] = ()
    spent: int | None = None
    effective: int | None = None
    terminated: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)


class AnswerEnv(TextEnv):
    """A :class:`TextEnv` whose ``<answer>`` holds free text, judged by the subclass.

    Args:
        max_answer_length: answers (the stripped ``<answer>`` body) longer than this
            are a format failure without being read.
        feedback_max_length: the feedback part of an observation is cut to this.
        **kwargs: passed to :class:`TextEnv` (``action_budget``, ``max_turns``,
            ``max_actions_per_turn``, ``separator``, ``format_penalty``, ...).
    """

    obs_charset = OBS_CHARSET
    #: A well-formed answer body, named in both instructions styles.
    answer_example: str = ""
    #: Upper bound on the length of :meth:`_render_state` (set by subclasses).
    state_max_length: int = 512
    #: Entries every turn's ``info`` holds, whatever the answer (so that each turn
    #: has the same keys); :attr:`AnswerResult.info` overrides them.
    turn_info_defaults: Mapping[str, Any] = {}

    def __init__(
        self, *, max_answer_length: int = 1000, feedback_max_length: int = 400, **kwargs: Any
    ) -> None:
        for name, value in (
            ("max_answer_length", max_answer_length),
            ("feedback_max_length", feedback_max_length),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.max_answer_length = max_answer_length
        self.feedback_max_length = feedback_max_length
        self.obs_max_length = self.state_max_length + 1 + feedback_max_length
        super().__init__(**kwargs)
        self._feedback = ""

    # ----- hooks for subclasses -------------------------------------------------
    def _judge(self, answer: str) -> AnswerResult:
        """Read and carry out one answer: the stripped, non-empty ``<answer>`` body of
        at most ``max_answer_length`` characters. Must not raise on any text."""
        raise NotImplementedError

    def _render_state(self) -> str:
        """The current state as text, at most ``state_max_length`` characters."""
        raise NotImplementedError

    def _well_formed_body(self, answer: str) -> bool:
        """Whether the stripped ``<answer>`` body has the syntax of this env's answers
        (see :meth:`well_formed`); must not raise on any text."""
        raise NotImplementedError

    def well_formed(self, answer: str) -> bool:
        block = read_answer_block(answer, self.parser.require_think, self.parser.tags)
        body = block.body.strip()
        if not block.format_ok or not body or len(body) > self.max_answer_length:
            return False
        return self._well_formed_body(body)

    @property
    def action_names(self) -> tuple[str, ...]:
        """Free-text envs have no action vocabulary."""
        return ()

    def _execute(self, action: str) -> tuple[float, bool, bool]:
        raise NotImplementedError("an AnswerEnv judges whole answers in _judge()")

    # ----- helpers ----------------------------------------------------------------
    def split_parts(self, answer: str) -> list[str]:
        """``answer`` cut at the env's separator into stripped, non-empty parts."""
        parts = (part.strip() for part in answer.split(self.parser.separator))
        return [part for part in parts if part]

    # ----- the turn ---------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        self._feedback = ""
        return super().reset(seed=seed, options=options)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one turn: ``action`` is the model's raw answer text."""
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"step() takes the model's answer as str, got {type(action).__name__}")
        block = read_answer_block(action, self.parser.require_think, self.parser.tags)
        answer = block.body.strip()
        error = block.error
        if block.format_ok and not answer:
            error = f"empty {self.parser.answer_tags[0]}"
        elif block.format_ok and len(answer) > self.max_answer_length:
            error = f"the answer is longer than {self.max_answer_length} characters"
        if error:
            result = AnswerResult(feedback=f"Your answer could not be read: {error}.")
            parsed = ParsedAnswer(format_ok=False, think=block.think, error=error)
        else:
            result = self._judge(answer)
            parsed = ParsedAnswer(
                format_ok=True, think=block.think, actions=result.executed, invalid=result.rejected
            )
        spent = len(result.executed) if result.spent is None else result.spent
        effective = len(result.executed) if result.effective is None else result.effective
        self._actions_left = max(self._actions_left - spent, 0)
        penalty = 0.0 if parsed.is_valid else self.format_penalty
        self._feedback = result.feedback
        self._turn += 1
        terminated = bool(result.terminated)
        out_of_turns = self.max_turns is not None and self._turn >= self.max_turns
        truncated = not terminated and (self._actions_left <= 0 or out_of_turns)
        self._done = terminated or truncated
        reward = float(result.reward)
        info = self._turn_info(parsed, list(result.executed), effective, reward, penalty)
        info.update(self.turn_info_defaults)
        info.update(result.info)
        return self._observe(), reward + penalty, terminated, truncated, info

    def _render_text(self) -> str:
        state = self._render_state()
        if not self._feedback:
            return state
        feedback = quote(self._feedback, self.feedback_max_length, newlines=True)
        return feedback.rstrip() + "\n" + state
