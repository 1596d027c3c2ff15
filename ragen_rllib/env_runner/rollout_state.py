"""One trajectory's state while the runner plays it, and the two context modes.

A :class:`Rollout` holds what the runner's loop needs of one trajectory between
turns: its env, its prompt format, its turn limit and its :class:`Context`, which
owns the token ids the engine gets at the next turn. The two contexts are the two
values of ``context_window``:

- :class:`WholeHistory` (null): the prompt is the whole trajectory, one token
  sequence that grows turn by turn (one training segment);
- :class:`Window` (k): the prompt is the env's instructions and the last k turns,
  rebuilt every turn, and each turn is its own training segment.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from ragen_rllib.chat.prompts import ChatFormat, PromptFormat
from ragen_rllib.records.trajectory import Trajectory

logger = logging.getLogger(__name__)


def check_observation(obs: Any) -> None:
    if not isinstance(obs, str):
        raise TypeError(
            f"the env returned an observation of type {type(obs).__name__}; a text env's "
            "reset() and step() must return str observations"
        )


def finite_reward(reward: Any) -> float:
    """The env's reward as a float; ValueError when it is not a finite number (a NaN
    would spread through its group's baseline and every loss after it)."""
    try:
        value = float(reward)
    except (TypeError, ValueError):
        raise ValueError(f"the env returned a reward of type {type(reward).__name__}") from None
    if not math.isfinite(value):
        raise ValueError(f"the env returned a reward of {value}: it must be a finite number")
    return value


class WholeHistory:
    """``context_window: null``: one growing sequence, one segment per trajectory."""

    def __init__(self, traj: Trajectory, chat: ChatFormat, first_ids: list[int]):
        self.traj, self.chat = traj, chat
        traj.start_segment(first_ids)
        self._next: list[int] = []

    @property
    def prompt(self) -> list[int]:
        return self.traj.segments[-1].input_ids

    def answer_begins(self) -> None:
        """The answer continues the one segment."""

    def following(self, user: str, answer: list[int], ended_with_eos: bool) -> int:
        """Prepare the next turn's prompt; its length in tokens."""
        self._next = self.chat.continuation_ids(user, ended_with_eos)
        return len(self.prompt) + len(self._next)

    def advance(self) -> None:
        self.traj.append_context(self._next)


class Window:
    """``context_window: k``: the instructions and the last k turns, one segment a turn."""

    def __init__(
        self,
        k: int,
        traj: Trajectory,
        chat: ChatFormat,
        first_ids: list[int],
        first_text: str,
        instructions: Callable[[str], str],
    ):
        self.k, self.traj, self.chat = k, traj, chat
        self.prompt = list(first_ids)
        self._instructions = instructions  # the env's instructions put before a text
        self._texts = [first_text]  # every turn's user text
        self._answers: list[tuple[list[int], bool]] = []  # each answer (ids, ended with eos)
        self._next: list[int] = []

    def answer_begins(self) -> None:
        self.traj.start_segment(self.prompt)

    def following(self, user: str, answer: list[int], ended_with_eos: bool) -> int:
        """The next turn's prompt: the instructions with the user text of the window's
        first turn, then each later turn's answer (as sampled) and the user text after
        it; its length in tokens."""
        self._texts.append(user)
        self._answers.append((list(answer), ended_with_eos))
        first = max(0, len(self._texts) - 1 - self.k)  # the window's first turn
        turns = [
            (ids, eos, self._texts[j + 1])
            for j, (ids, eos) in enumerate(self._answers)
            if j >= first
        ]
        self._next = self.chat.conversation_ids(self._instructions(self._texts[first]), turns)
        return len(self._next)

    def advance(self) -> None:
        self.prompt = self._next


Context = WholeHistory | Window


@dataclass
class Rollout:
    """One trajectory being played."""

    traj: Trajectory
    env: gym.Env
    fmt: PromptFormat
    chat: ChatFormat
    limit: int  # turns at most
    context: Context | None = None  # None until its first prompt is in
    policy: str | None = None  # self-play against opponents: an opponent's id (None: trained)

    def unplayable(self, reason: str, error: str) -> None:
        """End without a true return (an env error, or a first prompt that leaves no
        room for an answer); its group is dropped from the update."""
        traj = self.traj
        logger.warning("env %s (seed %d): %s; its group is dropped from the update",
                       traj.env_id, traj.seed, error)  # fmt: skip
        traj.error, traj.done, traj.success, traj.end_reason = error, True, False, reason

    def finish(self, ended_with_eos: bool, reason: str) -> None:
        self.traj.append_context(self.chat.closing_ids(ended_with_eos))
        self.traj.done = True
        self.traj.end_reason = reason
