"""Prompts: the env's text rendered as chat messages and token ids.

Sits between the environment and the rollout engine, in the env runner: it
turns the env's instructions and text observations into chat messages and
renders them through the tokenizer's chat template into the ids the engine
continues (:class:`ChatFormat`). The env runner appends them, and the ids the
engine sampled, to the trajectory record
(:class:`~ragen_rllib.records.trajectory.Trajectory`); the built-in model's
pretraining renders its transcripts through the same functions.

Message structure (as in the RAGEN paper): a system message; a first user
message with the env's instructions and turn 1; after every answer a user
message with the reward and the next turn.

Two named prompt styles (the ``prompt_style`` setting), each a
:class:`PromptFormat` whose parts a run may change (the ``prompt`` setting):

- ``full`` (default, for real LLMs): the system message, "Turn N:", "State:",
  the actions left and the format reminder in every user message.
- ``compact`` (for small models): no system message, and each user message is
  only the observation (after the env's instructions in the first one, after
  the previous reward in later ones). A FrozenLake first prompt shrinks from
  176 tokens to 61 with compact env instructions; the framing
  words a small model has to look past shrink with it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

SYSTEM_PROMPT = "You are a helpful assistant. You first think, then answer."
FORMAT_HINT = (
    "Always answer in the format <think> your thoughts </think> <answer> your actions "
    "</answer> and nothing else."
)
_PROBE_USER, _PROBE_ASSISTANT = "PROBE_USER_TEXT", "PROBE_ASSISTANT_TEXT"


@dataclass(frozen=True)
class PromptFormat:
    """The wording around the env's own text: every part a user may set (``prompt``).

    ``turn`` is the user text of a turn, with the placeholders ``{reward}`` (the
    ``reward`` line, empty on turn 1), ``{turn}`` (the turn number),
    ``{observation}``, ``{budget}`` (the ``budget`` line, empty for an env that
    reports no action budget) and ``{format_hint}``. ``reward`` may use
    ``{reward}`` (a float, e.g. ``{reward:.2f}``), ``budget`` ``{actions_left}``.
    ``separator`` stands between the env's instructions and the first turn.
    ``prefill`` starts every answer (None: the run's ``prefill``).
    """

    system: str | None = SYSTEM_PROMPT
    turn: str = "{reward}Turn {turn}:\nState:\n{observation}\n{budget}{format_hint}"
    reward: str = "Reward: {reward:.2f}\n"
    budget: str = "You have {actions_left} actions left. "
    format_hint: str = FORMAT_HINT
    separator: str = "\n\n"
    prefill: str | None = None


#: The named presets (the ``prompt_style`` setting; see the module docstring).
PRESETS: dict[str, PromptFormat] = {
    "full": PromptFormat(),
    "compact": PromptFormat(system=None, turn="{reward}{observation}", separator="\n"),
}
PROMPT_STYLES = tuple(PRESETS)
#: Each template part and the placeholders it may use.
PLACEHOLDERS = {
    "turn": ("reward", "turn", "observation", "budget", "format_hint"),
    "reward": ("reward",),
    "budget": ("actions_left",),
}
_SAMPLE = {
    "reward": "R",
    "turn": 1,
    "observation": "O",
    "budget": "B",
    "format_hint": "F",
    "actions_left": 3,
}


def _check_style(style: str) -> None:
    if style not in PRESETS:
        raise ValueError(f"prompt_style must be one of {list(PROMPT_STYLES)}, got {style!r}")


def prompt_format(style: str | PromptFormat, overrides: Any = None, where: str = "prompt"):
    """The :class:`PromptFormat` of preset ``style`` with ``overrides`` (a mapping of
    some of its fields, or None); ValueError naming ``where.<field>`` on a bad one."""
    base = style if isinstance(style, PromptFormat) else None
    if base is None:
        _check_style(style)
        base = PRESETS[style]
    if overrides is None:
        return base
    if not isinstance(overrides, dict):
        raise ValueError(
            f"config {where}={overrides!r} is invalid: null or a mapping of some of "
            f"{[f.name for f in fields(PromptFormat)]}"
        )
    allowed = [f.name for f in fields(PromptFormat)]
    odd = sorted(set(overrides) - set(allowed))
    if odd:
        raise ValueError(f"config {where}: unknown key(s) {odd}; allowed: {allowed}")
    for key, value in overrides.items():
        nullable = key in ("system", "prefill")
        if not (isinstance(value, str) or (nullable and value is None)):
            kind = "a string or null" if nullable else "a string"
            raise ValueError(f"config {where}.{key}={value!r} is invalid: {kind}")
        if key in PLACEHOLDERS:
            names = PLACEHOLDERS[key]
            try:
                value.format(**{n: (0.5 if key == "reward" else _SAMPLE[n]) for n in names})
            except (KeyError, IndexError, ValueError) as err:
                raise ValueError(
                    f"config {where}.{key}={value!r} is invalid ({type(err).__name__}: "
                    f"{err}): a text whose {{placeholders}} are among {list(names)} "
                    "(write {{ and }} for literal braces)"
                ) from None
    if "turn" in overrides and "{observation}" not in overrides["turn"]:
        raise ValueError(
            f"config {where}.turn={overrides['turn']!r} is invalid: it must hold {{observation}}"
        )
    return replace(base, **overrides)


def system_prompt_for(style: str | PromptFormat) -> str | None:
    """The system message of a prompt style (None: no system message)."""
    return prompt_format(style).system


def render_turn(
    turn: int,
    observation: str,
    actions_left: int | None,
    reward: float | None,
    style: str | PromptFormat = "full",
) -> str:
    """The user text of one turn; ``reward`` is the previous turn's (None on turn 1).

    ``actions_left`` is None for an env that does not report its action budget:
    the line is then left out. ``style`` is a preset's name or a
    :class:`PromptFormat`; the ``compact`` preset keeps only the reward and the
    observation.
    """
    fmt = prompt_format(style)
    return fmt.turn.format(
        reward="" if reward is None else fmt.reward.format(reward=reward),
        turn=turn,
        observation=observation,
        budget="" if actions_left is None else fmt.budget.format(actions_left=actions_left),
        format_hint=fmt.format_hint,
    )


def with_instructions(env: Any, turn_text: str, style: str | PromptFormat = "full") -> str:
    """``turn_text`` (a :func:`render_turn` text) after the env's instructions, if it has
    any: the first user message of a conversation, or of a context window.

    The env runner's rollouts and the built-in model's transcripts both render
    their first message as ``with_instructions(env, render_turn(1, ...))``, so the
    two cannot drift apart. ``env`` is the unwrapped text env."""
    method = getattr(env, "instructions", None)
    if not callable(method):
        return turn_text
    return str(method()) + prompt_format(style).separator + turn_text


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


#: The tag that closes an answer's reasoning.
THINK_END = "</think>"


def reasoning_length(tokenizer: Any, prefill: str, ids: list[int]) -> int:
    """How many of an answer's generated ``ids`` belong to its reasoning: the fewest
    whose text (after ``prefill``) holds ``</think>``, the tokens that close it
    included; 0 when the answer never closes its reasoning. Found on the decoded
    text, so it holds whatever the tokenizer makes of the tag (one token or several)."""
    if THINK_END in prefill:
        return 0

    def closed(k: int) -> bool:
        return THINK_END in prefill + tokenizer.decode(ids[:k], skip_special_tokens=True)

    if not ids or not closed(len(ids)):
        return 0
    low, high = 1, len(ids)  # closed(high) holds; find the least such k
    while low < high:
        mid = (low + high) // 2
        if closed(mid):
            high = mid
        else:
            low = mid + 1
    return low
