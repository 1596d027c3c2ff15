"""Tool calls in a model's answer: found in the text, in the chat template's own format.

A chat template that renders ``tools`` also fixes how the model writes a call.
The format read here is the one Qwen2.5, Qwen3, Hermes and many other templates
use: each call is a JSON object ``{"name": ..., "arguments": {...}}`` between
``<tool_call>`` and ``</tool_call>``, after any plain text. :func:`parse_tool_calls`
turns an answer into the content and ``tool_calls`` of an OpenAI chat message.

The answer is untrusted text: it is scanned with plain string search (no
backtracking pattern), nothing in it is evaluated, and anything malformed (an
unclosed tag, JSON that does not parse, a call without a name, a name the
request did not offer) makes the whole answer plain content, with the reason,
so that the caller can count it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def template_has_tool_calls(chat_template: str | None) -> bool:
    """Whether a chat template writes tool calls in the format read here."""
    return bool(chat_template) and OPEN in chat_template


@dataclass
class ParsedAnswer:
    """An answer as an OpenAI chat message's parts; ``error`` says why calls that the
    text seemed to hold were not taken (then all of it is ``content``)."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


def _plain(text: str, error: str = "") -> ParsedAnswer:
    return ParsedAnswer(content=text, error=error)


def parse_tool_calls(
    text: str, tool_names: set[str] | None = None, call_id: str = "call"
) -> ParsedAnswer:
    """The answer ``text`` as content plus tool calls. ``tool_names``: the functions
    the request offered (None: any name). Call ids are ``{call_id}_{k}``."""
    first = text.find(OPEN)
    if first < 0:
        stray = CLOSE in text
        return _plain(text, f"'{CLOSE}' without '{OPEN}'" if stray else "")
    calls: list[dict[str, Any]] = []
    at = first
    while at >= 0:
        end = text.find(CLOSE, at + len(OPEN))
        if end < 0:
            return _plain(text, f"'{OPEN}' not closed")
        body = text[at + len(OPEN) : end].strip()
        try:
            call = json.loads(body)
        except (ValueError, RecursionError) as err:  # JSONDecodeError, too-long integers
            return _plain(text, f"a tool call is not JSON ({type(err).__name__})")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return _plain(text, "a tool call is not an object with a string 'name'")
        name, arguments = call["name"], call.get("arguments", {})
        if tool_names is not None and name not in tool_names:
            return _plain(text, f"a call to {name[:60]!r}, which the request did not offer")
        if not isinstance(arguments, dict):
            return _plain(text, "a tool call's 'arguments' is not an object")
        calls.append(
            {
                "id": f"{call_id}_{len(calls)}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        )
        rest = text[end + len(CLOSE) :]
        nxt = rest.find(OPEN)
        if nxt < 0:
            if rest.strip():
                return _plain(text, "text after the last tool call")
            break
        if rest[:nxt].strip():
            return _plain(text, "text between tool calls")
        at = end + len(CLOSE) + nxt
    content = text[:first].strip()
    return ParsedAnswer(content=content or None, tool_calls=calls)
