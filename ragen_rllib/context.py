"""Prompt rendering and token bookkeeping for one multi-turn trajectory.

Sits between the environment and the rollout engine: it turns the env's
instructions and text observations into chat messages, renders them through
the tokenizer's chat template, and keeps the trajectory as one growing list of
token ids. The ids the engine sampled are appended as they are (token in,
token out: generated text is never re-tokenised), together with their
log-probabilities and a loss mask of 1; everything else (system prompt,
observations, chat framing, the ``<think>`` prefill) has mask 0.

Message structure (as in the RAGEN paper): a system message; a first user
message with the env's instructions and turn 1; after every answer a user
message with the reward and the next turn.

Two prompt styles (the ``prompt_style`` setting):

- ``full`` (default, for real LLMs): the system message, "Turn N:", "State:",
  the actions left and the format reminder in every user message.
- ``compact`` (for small models): no system message, and each user message is
  only the observation (after the env's instructions in the first one, after
  the previous reward in later ones). A FrozenLake first prompt shrinks from
  about 175 tokens to about 50 with compact env instructions; the framing
  words a small model has to look past shrink with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SYSTEM_PROMPT = "You are a helpful assistant. You first think, then answer."
FORMAT_HINT = (
    "Always answer in the format <think> your thoughts </think> <answer> your actions "
    "</answer> and nothing else."
)
_PROBE_USER, _PROBE_ASSISTANT = "PROBE_USER_TEXT", "PROBE_ASSISTANT_TEXT"
#: The values of the ``prompt_style`` setting (see the module docstring).
PROMPT_STYLES = ("full", "compact")


def _check_style(style: str) -> None:
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style must be one of {list(PROMPT_STYLES)}, got {style!r}")


def system_prompt_for(style: str) -> str | None:
    """The system message of a prompt style (None: no system message)."""
    _check_style(style)
    return SYSTEM_PROMPT if style == "full" else None


def render_turn(
    turn: int,
    observation: str,
    actions_left: int | None,
    reward: float | None,
    style: str = "full",
) -> str:
    """The user text of one turn; ``reward`` is the previous turn's (None on turn 1).

    ``actions_left`` is None for an env that does not report its action budget:
    the line is then left out. The ``compact`` style keeps only the reward and
    the observation.
    """
    _check_style(style)
    head = "" if reward is None else f"Reward: {reward:.2f}\n"
    if style == "compact":
        return f"{head}{observation}"
    budget = "" if actions_left is None else f"You have {actions_left} actions left. "
    return f"{head}Turn {turn}:\nState:\n{observation}\n{budget}{FORMAT_HINT}"


def first_user_text(
    env: Any, observation: str, actions_left: int | None, style: str = "full"
) -> str:
    """The first user message: the env's instructions (when it has any), then turn 1.

    The env runner's rollouts and the built-in model's pretraining both render
    it here, so the two cannot drift apart. ``env`` is the unwrapped text env.
    """
    return with_instructions(env, render_turn(1, observation, actions_left, None, style), style)


def with_instructions(env: Any, turn_text: str, style: str = "full") -> str:
    """``turn_text`` (a :func:`render_turn` text) after the env's instructions, if it has
    any: the first user message of a conversation, or of a context window."""
    method = getattr(env, "instructions", None)
    if not callable(method):
        return turn_text
    return str(method()) + ("\n" if style == "compact" else "\n\n") + turn_text


class ChatFormat:
    """Cuts a tokenizer's chat template into the pieces a growing conversation needs.

    ``prompt_ids(first_user)`` gives the ids up to the first generation;
    ``continuation_ids(user, generation_ended_with_eos)`` gives the ids that
    close the assistant message and open the next one. Both are derived from
    the template itself by rendering probe conversations, so any chat template
    that renders messages in order works. ``system_prompt=None`` sends no
    system message (the template may still add its own default one).
    """

    def __init__(
        self, tokenizer: Any, system_prompt: str | None = SYSTEM_PROMPT, prefill: str = "<think>"
    ):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat_template; the model needs a chat model")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.prefill = prefill
        self.eos_token_id = tokenizer.eos_token_id
        eos_text = tokenizer.eos_token or ""
        probe = self._render([_PROBE_USER, _PROBE_ASSISTANT], generation_prompt=False)
        end = probe.rindex(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT)
        # What the template writes after the assistant's content, e.g. "<|im_end|>\n".
        self.assistant_suffix = probe[end:]
        self.after_eos = (
            self.assistant_suffix[len(eos_text) :]
            if eos_text and self.assistant_suffix.startswith(eos_text)
            else None
        )
        self._probe_len = len(probe)

    def _render(self, turns: list[str], generation_prompt: bool) -> str:
        messages = []
        if self.system_prompt is not None:
            messages.append({"role": "system", "content": self.system_prompt})
        for i, content in enumerate(turns):
            messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": content})
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def prompt_ids(self, first_user: str) -> list[int]:
        return self._encode(self._render([first_user], generation_prompt=True) + self.prefill)

    def continuation_ids(self, user: str, ended_with_eos: bool) -> list[int]:
        """Ids after a generated answer: close it, add ``user``, open the next answer."""
        rendered = self._render([_PROBE_USER, _PROBE_ASSISTANT, user], generation_prompt=True)
        opening = rendered[self._probe_len :]
        if ended_with_eos and self.after_eos is not None:
            closing = self.after_eos
        else:
            closing = self.assistant_suffix
        return self._encode(closing + opening + self.prefill)

    def conversation_ids(
        self, first_user: str, turns: list[tuple[list[int], bool, str]]
    ) -> list[int]:
        """Ids of a conversation up to the next answer: ``prompt_ids(first_user)``, then for
        each ``(answer ids, ended_with_eos, next user text)`` the answer as sampled and its
        continuation. With every turn so far this is exactly the growing sequence of the
        whole history; with the last few it is a context window."""
        ids = self.prompt_ids(first_user)
        for answer_ids, ended_with_eos, user in turns:
            ids += answer_ids
            ids += self.continuation_ids(user, ended_with_eos)
        return ids

    def closing_ids(self, ended_with_eos: bool) -> list[int]:
        """Ids that close the final answer of a trajectory."""
        if ended_with_eos and self.after_eos is not None:
            return self._encode(self.after_eos)
        return self._encode(self.assistant_suffix)


@dataclass
class Segment:
    """One training sequence of a trajectory: token ids, with a loss mask of 1 on the
    generated tokens and their sampling log-probabilities (0 elsewhere)."""

    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)

    def append_context(self, ids: list[int]) -> None:
        self.input_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def append_generation(self, ids: list[int], logprobs: list[float]) -> tuple[int, int]:
        """Append sampled ids; return their (start, end) slice in this segment."""
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} generated ids but {len(logprobs)} logprobs")
        start = len(self.input_ids)
        self.input_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)
        return start, len(self.input_ids)


@dataclass
class Trajectory:
    """One multi-turn episode as tokens: what the env runner returns and the learner trains on.

    ``segments`` are the training sequences. With the whole history in context
    (``context_window: null``) a trajectory is one segment that grows turn by
    turn, exactly the ids the engine saw at its last turn plus the last answer.
    With a context window, every turn is its own segment: the (windowed) prompt
    the engine saw at that turn, then the turn's answer.

    ``turn_spans[i] = (segment, start, end)``: where turn i's generated tokens
    lie; ``turn_rewards[i]`` is its reward (env reward plus format penalty) and
    ``turn_observations[i]`` the observation the turn answered.
    """

    env_id: str
    seed: int
    group: int
    segments: list[Segment] = field(default_factory=list)
    turn_spans: list[tuple[int, int, int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turn_observations: list[str] = field(default_factory=list)
    turn_infos: list[dict[str, Any]] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    done: bool = False
    success: bool = False
    #: why the trajectory ended: "terminated", "truncated", "max_turns", "context_overflow",
    #: or "env_error" (the env raised in reset() or step(); ``error`` says what).
    end_reason: str = ""
    error: str = ""
    #: the rollout engine's weights version that generated this trajectory; the
    #: buffer sets ``policy_lag`` (learner version at the update minus this) and
    #: ``uses`` (how many updates have used it, this one included) when it hands
    #: the trajectory out
    weights_version: int = 0
    policy_lag: int = 0
    uses: int = 0
    #: Critic-free estimators (GRPO, GiGPO): one advantage per turn, set by the sample
    #: stage from the whole group; GRPO gives every turn the same value.
    turn_advantages: list[float] = field(default_factory=list)
    #: The update's plan, set by the algorithm: the minibatch this trajectory is in,
    #: per epoch (see ragen_rllib.core.batching.minibatch_plan).
    minibatch_ids: tuple[int, ...] = ()

    def __len__(self) -> int:
        # RLlib counts "env steps" with len(episode); a turn is one env step.
        return len(self.turn_rewards)

    @property
    def num_turns(self) -> int:
        return len(self.turn_rewards)

    @property
    def total_reward(self) -> float:
        return float(sum(self.turn_rewards))

    @property
    def response_tokens(self) -> int:
        return sum(sum(s.loss_mask) for s in self.segments)

    @property
    def num_tokens(self) -> int:
        """Tokens in all training sequences (what the learner processes)."""
        return sum(len(s) for s in self.segments)

    def turn_ids(self, turn: int) -> list[int]:
        """The generated ids of ``turn``."""
        seg, start, end = self.turn_spans[turn]
        return self.segments[seg].input_ids[start:end]

    def start_segment(self, ids: list[int]) -> None:
        """Open a new training sequence with the context ``ids`` (a turn's prompt)."""
        self.segments.append(Segment())
        self.segments[-1].append_context(ids)

    def append_context(self, ids: list[int]) -> None:
        """Context ids at the end of the current segment (loss mask 0)."""
        if not self.segments:
            self.segments.append(Segment())
        self.segments[-1].append_context(ids)

    def append_generation(self, ids: list[int], logprobs: list[float]) -> None:
        """One turn's sampled ids, at the end of the current segment (loss mask 1)."""
        start, end = self.segments[-1].append_generation(ids, logprobs)
        self.turn_spans.append((len(self.segments) - 1, start, end))
