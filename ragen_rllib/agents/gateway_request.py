"""One chat completions request read against the run's limits, and its answer's body.

:func:`read_request` turns a checked request (:mod:`.gateway_schema`) into the
engine's sampling and what else it asks (:class:`Asked`), or refuses it with a
:class:`GatewayError` naming the field and what is allowed. What agents send:

- sampling is the run's: ``temperature`` and ``top_p`` left out or the run's,
  ``presence_penalty`` / ``frequency_penalty`` left out or 0, ``n`` 1 (a
  request is one turn of one trajectory);
  ``max_tokens`` above ``max_new_tokens`` is clamped to it (counted
  ``max_tokens_clamped``), or refused with ``max_tokens_over_limit: refuse``;
- ``stop`` (up to 4 sequences) ends the answer at the token that completes one
  (:mod:`ragen_rllib.engines.stops`): the recorded ids end there, and the text
  returned stops where the sequence starts;
- ``stream`` (with ``stream_options.include_usage``) is served as server-sent
  events of the whole answer (:func:`stream_events`), recorded like any other;
- ``logprobs`` gives each sampled token's log-probability from the engine's own
  pass (``top_logprobs`` above 0 is refused: the engine keeps the sampled
  token's only); ``return_token_ids`` gives the prompt's and the answer's ids;
- ``tool_choice``: ``auto`` (or left out), or ``none`` (the tools are not
  rendered); a named function or ``required`` would need constrained decoding
  and is refused;
- ``response_format``: ``text`` only (JSON modes would need constrained
  decoding); ``parallel_tool_calls`` is accepted;
- content parts other than text (images, audio, files) are refused: the model
  reads text.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ragen_rllib.engines.base import SamplingParams
from ragen_rllib.engines.stops import StopStrings

UNKNOWN_KEY = "unknown API key: use the key the runner gave the agent"
FINISHED = "this trajectory is finished; its key takes no requests"
OVERFLOWED = (
    "this trajectory ended when a prompt overflowed max_context_tokens; its key takes no "
    "more requests"
)


class GatewayError(Exception):
    """A request refused: the HTTP status, and a message naming what was wrong."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "code": self.code}}


@dataclass(frozen=True)
class GatewayLimits:
    """The run's settings a request is held to."""

    model: str
    temperature: float
    top_p: float
    max_new_tokens: int
    max_context_tokens: int
    max_body_bytes: int = 1 << 20
    #: how long a request waits for others to share its engine batch
    batch_wait_s: float = 0.005
    max_batch: int = 256
    #: the longest a request waits for its answer (then 504)
    answer_timeout_s: float = 600.0
    #: open connections at most (lowered to half the process's open-file limit)
    max_connections: int = 1024
    #: a connection's request headers must be complete this long after it starts
    header_timeout_s: float = 10.0
    #: a request's body must be complete this long after its headers (then 408)
    body_timeout_s: float = 30.0
    #: requests of one key in flight at once (then 429)
    max_requests_per_key: int = 4
    #: a max_tokens above max_new_tokens: "clamp" to it (counted) or "refuse" (400)
    max_tokens_over_limit: str = "clamp"


def control_tokens(tokenizer) -> list[str]:
    """The tokenizer's special tokens as text (``<|im_start|>``...), longest first: in
    a message's content the chat template would encode them as the tokens themselves."""
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            found.add(str(token.content))
    return sorted((t for t in found if t), key=len, reverse=True)


@dataclass(frozen=True)
class Asked:
    """What a request asks of its answer beyond sampling."""

    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    token_ids: bool = False
    no_tools: bool = False


def read_request(
    request,
    limits: GatewayLimits,
    count: Callable[[str], None],
    decode: Callable[[list[int]], str],
):
    """(the engine's sampling, :class:`Asked`) of a checked request; GatewayError
    (400) for what the run cannot honour. ``decode``: the answer's text of its ids
    (stop sequences are matched in it)."""
    lim = limits
    if request.n not in (None, 1):
        raise GatewayError(
            400, f"n={request.n} is not supported: a request is one turn of its key's "
            "trajectory, one answer; for several answers to one history, run that many "
            "agents, each with its own key (n: 1 or left out)"
        )  # fmt: skip
    for name in ("temperature", "top_p"):
        value, run = getattr(request, name), getattr(lim, name)
        if value is not None and value != run:
            raise GatewayError(
                400,
                f"{name}={value} is not allowed: this run samples at {name} {run} "
                "(leave it out or send that value)",
            )
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(request, name) not in (None, 0, 0.0):
            raise GatewayError(
                400, f"{name}={getattr(request, name)} is not allowed: this run samples "
                "without penalties (leave it out or send 0)"
            )  # fmt: skip
    stop = None
    if request.stop:
        texts = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop)
        try:
            stop = StopStrings(texts, decode)
        except ValueError as err:
            raise GatewayError(400, f"stop: {err}") from None
    if request.top_logprobs not in (None, 0):
        raise GatewayError(
            400, f"top_logprobs={request.top_logprobs} is not supported: the engine keeps the "
            "sampled token's log-probability only (logprobs: true gives it)"
        )  # fmt: skip
    fmt = (request.response_format or {}).get("type", "text")
    if fmt != "text":
        raise GatewayError(
            400, f"response_format type {fmt!r} is not honoured: the run samples free text "
            "(ask for JSON in the prompt and parse the answer)"
        )  # fmt: skip
    choice = request.tool_choice
    if choice not in (None, "auto", "none"):
        raise GatewayError(
            400, f"tool_choice={json.dumps(choice)[:200]} is not supported: forcing a call "
            "needs constrained decoding; send auto (or leave it out) or none"
        )  # fmt: skip
    for i, message in enumerate(request.messages):
        if isinstance(message.content, list):
            for part in message.content:
                kind = part.get("type", "text") if isinstance(part, dict) else type(part).__name__
                if kind != "text":
                    raise GatewayError(
                        400, f"messages[{i}] has a content part of type {kind!r}: only text "
                        "parts are supported (the model reads text)"
                    )  # fmt: skip
    asked = request.max_completion_tokens
    if asked is None:
        asked = request.max_tokens
    if asked is not None and asked > lim.max_new_tokens and lim.max_tokens_over_limit == "clamp":
        count("max_tokens_clamped")
        asked = lim.max_new_tokens
    if asked is not None and not 1 <= asked <= lim.max_new_tokens:
        raise GatewayError(400, f"max_tokens={asked} is not allowed: 1 to {lim.max_new_tokens}")
    budget = lim.max_new_tokens if asked is None else asked
    options = request.stream_options or {}
    return SamplingParams(lim.temperature, lim.top_p, budget, stop), Asked(
        stream=bool(request.stream),
        include_usage=bool(request.stream and options.get("include_usage")),
        logprobs=bool(request.logprobs),
        token_ids=bool(request.return_token_ids),
        no_tools=choice == "none",
    )


def completion_body(model, reply, finish, prompt, generation, asked: Asked, tokenizer) -> dict:
    """The chat completion of one answer (``reply``: the assistant message)."""
    choice: dict[str, Any] = {"index": 0, "message": reply, "finish_reason": finish}
    if asked.logprobs:
        content = []
        for token_id, logp in zip(generation.ids, generation.behaviour_logp, strict=True):
            text = tokenizer.decode([token_id])
            content.append({"token": text, "logprob": float(logp),
                            "bytes": list(text.encode("utf-8")), "top_logprobs": []})  # fmt: skip
        choice["logprobs"] = {"content": content, "refusal": None}
    body: dict[str, Any] = {
        "id": f"chatcmpl-{secrets.token_hex(8)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(generation.ids),
            "total_tokens": len(prompt) + len(generation.ids),
        },
    }
    if asked.token_ids:
        choice["token_ids"] = list(generation.ids)
        body["prompt_token_ids"] = list(prompt)
    return body


@dataclass(frozen=True)
class Streamed:
    """An answer to send as a stream (``stream: true``): its body as one completion."""

    body: dict[str, Any]
    include_usage: bool

    def events(self) -> Iterator[bytes]:
        return stream_events(self.body, self.include_usage)


def stream_events(body: dict[str, Any], include_usage: bool) -> Iterator[bytes]:
    """A chat completion as the server-sent events of a stream: one chunk with the
    whole answer, one with its finish reason, the usage if asked, then ``[DONE]``."""
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    [choice] = body["choices"]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    first: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
    if "logprobs" in choice:
        first["logprobs"] = choice["logprobs"]
    chunks = [
        {**base, "choices": [first]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
    ]
    if include_usage:
        chunks.append({**base, "choices": [], "usage": body["usage"]})
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"
