"""Prompts: the env's text rendered as chat messages and token ids.

Sits between the environment and the rollout engine, in the env runner: it
turns the env's instructions and text observations into chat messages and
renders them through the tokenizer's chat template into the ids the engine
continues (:class:`ChatFormat`). The env runner appends them, and the ids the
engine sampled, to the trajectory record
(:class:`~ragen_rllib.env_runner.trajectory.Trajectory`); the built-in model's
pretraining renders its transcripts through the same functions.

Message structure (as in the RAGEN paper): a system message; a first user
message with the env's instructions and turn 1; after every answer a user
message with the reward and the next turn.

Two prompt styles (the ``prompt_style`` setting):

- ``full`` (default, for real LLMs): the system message, "Turn N:", "State:",
  the actions left and the format reminder in every user message.
- ``compact`` (for small models): no system message, and each user message is
  only the observation (after the env's instructions in the first one, after
  the previous reward in later ones). A FrozenLake first prompt shrinks from
  176 tokens to 61 with compact env instructions; the framing
  words a small model has to look past shrink with it.
"""

from __future__ import annotations

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


def with_instructions(env: Any, turn_text: str, style: str = "full") -> str:
    """``turn_text`` (a :func:`render_turn` text) after the env's instructions, if it has
    any: the first user message of a conversation, or of a context window.

    The env runner's rollouts and the built-in model's transcripts both render
    their first message as ``with_instructions(env, render_turn(1, ...))``, so the
    two cannot drift apart. ``env`` is the unwrapped text env."""
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
