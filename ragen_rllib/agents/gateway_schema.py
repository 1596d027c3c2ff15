"""The gateway's request body: the chat completions fields it takes, checked.

Unknown fields are refused (the ``openai`` client sends only what an agent
sets); the fields the client writes when an agent sends a returned message
back (``refusal``, ``annotations``, ...) are accepted and not used.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class Message(BaseModel):
    """A chat message; the fields the ``openai`` client writes when an agent sends a
    returned message back are accepted (and those without a use here ignored)."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: Any = None
    function_call: Any = None
    reasoning_content: str | None = None  # what some clients echo back; not rendered


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="allow")  # description, parameters, strict, ...
    name: str


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"] = "function"
    function: ToolFunction


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    messages: list[Message]
    tools: list[Tool] | None = None
    tool_choice: Any = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    seed: int | None = None
    user: str | None = None
    stop: str | list[str] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    return_token_ids: bool | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
