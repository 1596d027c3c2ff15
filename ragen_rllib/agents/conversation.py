"""Token-in, token-out from chat requests: the ids an agent's conversation is trained on.

An agent program that talks to the policy through chat completions sends its
whole history with every request, as messages. Rendering that history through
the chat template and encoding it again would re-encode the model's own
answers, and a text can encode to other ids than the ones the model sampled
(a word split differently, a tool call's JSON re-serialised), so the learner
would train on ids the engine never produced. :class:`ConversationRecorder`
keeps the ids instead:

- When a request's messages are the previous request's messages, then the
  answer this recorder returned for it (the same text, the same tool calls),
  then new messages, and the tools are the same, the prompt is the previous
  prompt's ids, the sampled ids, the template's closing of the answer and the
  ids of the new messages' text only. The sampled ids are never re-encoded.
- Otherwise (the agent edited or dropped part of its history, changed its
  tools, or the template renders earlier turns differently) the request's
  rendering starts a new segment of the trajectory, with its own context, as
  the ``context_window`` modes do.

Each answer becomes one turn of the :class:`~ragen_rllib.records.trajectory.Trajectory`
(its generated ids, behaviour log-probs and policy version), so the
estimators, filters and dumps read it unchanged.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ragen_rllib.chat.prompts import ChatFormat
from ragen_rllib.records.trajectory import Trajectory


def message_text(content: Any) -> str:
    """A message's content as one text (OpenAI content parts: their texts joined;
    None is "")."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict) and p.get("type", "text") == "text"
        )
    raise TypeError(f"message content must be a string or a list of parts, not {content!r}")


def _calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    """A message's tool calls as (name, parsed arguments), ids left out."""
    out = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass  # compared as the text it is
        out.append((function.get("name"), arguments))
    return out


def same_answer(sent: dict[str, Any], returned: dict[str, Any]) -> bool:
    """Whether a history message is the answer the gateway returned: an assistant
    message with the same text and the same tool calls (names and arguments)."""
    return (
        sent.get("role") == "assistant"
        and message_text(sent.get("content")) == message_text(returned.get("content"))
        and _calls(sent) == _calls(returned)
    )


@dataclass
class _Answered:
    """The last request this recorder answered."""

    messages: list[dict[str, Any]]
    tools: Any
    prompt_ids: list[int]
    answer_ids: list[int]
    ended_with_eos: bool
    reply: dict[str, Any]


#: why a request starts a new segment: the tools changed, an earlier message was
#: edited or dropped, the last answer was edited, or the chat template renders the
#: history differently once it grows (one that drops earlier think blocks)
RESTART_REASONS = ("tools_changed", "history_edited", "answer_edited", "template_rerendered")


class ConversationRecorder:
    """One agent conversation, recorded into ``trajectory`` request by request.

    Call :meth:`prompt_ids` with a request's messages (and tools) to get the ids
    to generate from, then :meth:`record_answer` with what the engine sampled and
    the message returned to the agent: only then does the trajectory change, so a
    request refused or failed in between leaves no trace. ``segments_started``
    counts the answers that could not extend the recorded ids (the first one
    included)."""

    def __init__(self, tokenizer: Any, trajectory: Trajectory) -> None:
        self.tokenizer = tokenizer
        self.trajectory = trajectory
        self._chat = ChatFormat(tokenizer, system_prompt=None, prefill="")
        self._last: _Answered | None = None
        #: the request being answered: messages, tools, prompt ids, and the ids that
        #: extend the recorded ones (None: the prompt opens a new segment)
        self._pending: tuple[list[dict[str, Any]], Any, list[int], list[int] | None] | None = None
        self.segments_started = 0
        #: segments started after the first, by why the request did not continue
        self.restarts: Counter[str] = Counter()
        self._why = "first"

    def _render(self, messages: list[dict[str, Any]], tools: Any, generation: bool) -> str:
        kwargs = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation, **kwargs
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def _extension(
        self, messages: list[dict[str, Any]], tools: Any
    ) -> tuple[list[int] | None, str]:
        """The ids to append after the last answer, or None and why the request does
        not continue the recorded conversation (a :data:`RESTART_REASONS` entry)."""
        last = self._last
        if last is None:
            return None, "first"
        if tools != last.tools:
            return None, "tools_changed"
        k = len(last.messages)
        if len(messages) < k + 2 or messages[:k] != last.messages:
            return None, "history_edited"
        if not same_answer(messages[k], last.reply):
            return None, "answer_edited"
        whole = self._render(messages, tools, generation=True)
        head = self._render(messages[: k + 1], tools, generation=False)
        if not (whole.startswith(head) and head.endswith(self._chat.assistant_suffix)):
            return None, "template_rerendered"  # the template does not render in order
        ids = self._chat.closing_ids(last.ended_with_eos) + self._encode(whole[len(head) :])
        return ids, ""

    def prompt_ids(self, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
        """The ids the engine continues for this request (and the trajectory's context)."""
        extension, self._why = self._extension(messages, tools)
        if extension is not None:
            last = self._last
            ids = last.prompt_ids + last.answer_ids + extension
        else:
            ids = self._encode(self._render(messages, tools, generation=True))
        self._pending = (messages, tools, ids, extension)
        return ids

    def record_answer(
        self,
        answer_ids: list[int],
        behaviour_logp: list[float],
        version: int,
        *,
        ended_with_eos: bool,
        reply: dict[str, Any],
        cut: bool = False,
    ) -> None:
        """The engine's answer to the last :meth:`prompt_ids` request, and the message
        the agent got for it (``reply``: role, content, tool_calls); ``cut``: the
        answer stopped at its token limit."""
        if self._pending is None:
            raise RuntimeError("record_answer() without a prompt_ids() request before it")
        messages, tools, ids, extension = self._pending
        self._pending = None
        if extension is not None:
            self.trajectory.append_context(extension)
        else:
            self.trajectory.start_segment(ids)
            self.segments_started += 1
            if self._why != "first":
                self.restarts[self._why] += 1
        traj = self.trajectory
        traj.append_generation(list(answer_ids), list(behaviour_logp), version=version, cut=cut)
        # What the dumps and the report show of a turn: the message it answered and
        # the answer's text.
        asked = message_text(messages[-1].get("content"))
        traj.turn_observations.append(asked)
        traj.turn_prompts.append(asked)
        traj.turn_infos.append({})
        traj.answers.append(self.tokenizer.decode(list(answer_ids), skip_special_tokens=True))
        self._last = _Answered(
            messages=list(messages),
            tools=tools,
            prompt_ids=ids,
            answer_ids=list(answer_ids),
            ended_with_eos=ended_with_eos,
            reply=reply,
        )

    def finish(self) -> None:
        """Close the last answer as the template does (the trajectory's end)."""
        if self._last is not None and self.trajectory.segments:
            self.trajectory.append_context(self._chat.closing_ids(self._last.ended_with_eos))
            self._last = None
