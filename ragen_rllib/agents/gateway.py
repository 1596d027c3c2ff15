"""An OpenAI-compatible chat completions server in front of a rollout engine.

An agent program written against the ``openai`` client (or raw HTTP) points its
``base_url`` here and is trained unchanged: every request is answered by the
run's engine, with the run's policy, and recorded token-in, token-out into the
trajectory its API key names (:class:`~ragen_rllib.agents.conversation.ConversationRecorder`).

- ``POST /v1/chat/completions`` and ``GET /v1/models``, on FastAPI and uvicorn,
  bound to 127.0.0.1 by default.
- Each trajectory gets its own key (:meth:`Gateway.open`); a request with an
  unknown key is refused (401), one for a finished trajectory too (409): a
  request never silently starts a trajectory.
- Sampling is the run's. ``temperature`` and ``top_p`` must be the run's (the
  learner scores the answers as sampled with them); ``max_tokens`` above
  ``max_new_tokens`` is clamped. What the run cannot honour is a 400 naming the
  field and what is allowed (:mod:`.gateway_request`, which also serves
  ``stream``, ``logprobs`` and ``return_token_ids``); so are bad JSON and
  unknown fields; a body over the size limit is 413; a prompt that leaves no
  room for an answer in ``max_context_tokens`` is 400 with code
  ``context_length_exceeded``.
- Requests from many agents are answered in batches: a request waits a few
  milliseconds for others before the engine runs them together.
- With ``tools``, the template renders them and the answer's calls come back
  as ``tool_calls``; an answer whose calls do not parse is returned as plain
  content and counted (``tool_parse_failures``).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from ragen_rllib.agents.conversation import ConversationRecorder, message_text
from ragen_rllib.agents.gateway_batcher import Batcher, BatcherClosed
from ragen_rllib.agents.gateway_request import (
    FINISHED,
    OVERFLOWED,
    UNKNOWN_KEY,
    Asked,
    GatewayError,
    GatewayLimits,
    Streamed,
    completion_body,
    control_tokens,
    read_request,
)
from ragen_rllib.agents.gateway_schema import ChatRequest
from ragen_rllib.agents.hosts import WILDCARD_HOSTS, is_loopback, this_machines_address
from ragen_rllib.chat.tool_calls import parse_tool_calls, template_has_tool_calls
from ragen_rllib.engines.base import Generation, RolloutEngine, SamplingParams
from ragen_rllib.records.trajectory import Trajectory

logger = logging.getLogger(__name__)


class _Conversation:
    def __init__(self, recorder: ConversationRecorder, deadline: float | None) -> None:
        self.recorder = recorder
        self.lock = threading.Lock()
        self.finished = False
        self.requests = 0
        self.engine_failures = 0  # requests the engine failed (503)
        self.deadline = deadline  # time.monotonic() after which a request is not answered
        self.overflowed = False  # a prompt overflowed the context: the trajectory ended


class Gateway:
    """Chat completions for agents, answered by ``engine`` and recorded per key."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any, limits: GatewayLimits, seed: int = 0):
        self.engine, self.tokenizer, self.limits = engine, tokenizer, limits
        self.tools_supported = template_has_tool_calls(getattr(tokenizer, "chat_template", None))
        self._control_tokens = control_tokens(tokenizer)
        self._conversations: dict[str, _Conversation] = {}
        self._finished: set[str] = set()  # closed keys (a request with one gets 409)
        self._engine_failed: dict[str, int] = {}  # closed keys the engine failed, how often
        self._lock = threading.Lock()
        self._batcher = Batcher(engine, limits.batch_wait_s, limits.max_batch, seed)
        self.counts: Counter[str] = Counter()
        self._server = None
        self._thread: threading.Thread | None = None

    # ----- trajectories ------------------------------------------------------------
    def open(self, trajectory: Trajectory) -> str:
        """A new key whose requests are recorded into ``trajectory``; its requests wait
        at most ``answer_timeout_s`` each, and none past the deadline
        :meth:`set_deadline` gives it (504)."""
        key = "rg-" + secrets.token_urlsafe(24)
        with self._lock:
            self._conversations[key] = _Conversation(
                ConversationRecorder(self.tokenizer, trajectory), None
            )
        return key

    def set_deadline(self, key: str, deadline: float | None) -> None:
        """From now on, ``key``'s requests wait for no answer past ``deadline``."""
        with self._lock:
            self._conversations[key].deadline = deadline

    def reseed(self, seed: int) -> None:
        """Seed the engine's sampling from here on from ``seed`` (a batch's)."""
        self._batcher.reseed(seed)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until the engine runs no request; whether it came within ``timeout``."""
        return self._batcher.wait_idle(timeout)

    def close(self, key: str) -> tuple[Trajectory, int]:
        """Finish ``key``'s trajectory (later requests get 409): the trajectory and how
        many requests it answered. Waits for a request in flight to end."""
        conversation = self._conversations[key]
        with conversation.lock:
            conversation.finished = True
            conversation.recorder.finish()
        with self._lock:
            self._conversations.pop(key, None)
            self._finished.add(key)
            if conversation.engine_failures:
                self._engine_failed[key] = conversation.engine_failures
            for reason, n in conversation.recorder.restarts.items():
                self.counts[f"segment_restarts_{reason}"] += n
            if not self._conversations:  # nothing in flight: the prefix cache may go
                self.engine.clear_cache()
        return conversation.recorder.trajectory, conversation.requests

    def engine_failures_of(self, key: str) -> int:
        """How many of a closed key's requests the engine failed (503); forgets them."""
        with self._lock:
            return self._engine_failed.pop(key, 0)

    def knows(self, key: str | None) -> bool:
        """Whether ``key`` was handed out (its trajectory open or finished)."""
        return (key or "") in self._conversations or (key or "") in self._finished

    def count(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    def check_key(self, key: str | None) -> None:
        """Refuse (raise :class:`GatewayError`, counted) a key of no open trajectory."""
        try:
            self._conversation(key)
        except GatewayError as err:
            self.count(f"refused_{err.status}")
            raise

    # ----- one request -------------------------------------------------------------
    def _conversation(self, key: str | None) -> _Conversation:
        conversation = self._conversations.get(key or "")
        if conversation is None and (key or "") not in self._finished:
            raise GatewayError(401, UNKNOWN_KEY)
        if conversation is None or conversation.finished:
            raise GatewayError(409, FINISHED)
        return conversation

    def complete(self, key: str | None, body: bytes) -> dict[str, Any] | Streamed:
        """Answer one chat completions request (raises :class:`GatewayError`)."""
        try:
            return self._complete(key, body)
        except GatewayError as err:
            self.count(f"refused_{err.status}")
            raise

    def _complete(self, key: str | None, body: bytes) -> dict[str, Any] | Streamed:
        conversation = self._conversation(key)
        if len(body) > self.limits.max_body_bytes:
            raise GatewayError(413, f"the body is over {self.limits.max_body_bytes} bytes")
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as err:  # not UTF-8, too deep, a huge integer
            raise GatewayError(400, f"the body is not JSON ({type(err).__name__})") from None
        try:
            request = ChatRequest.model_validate(data)
        except ValidationError as err:
            where = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in err.errors()
            )
            raise GatewayError(400, f"invalid request: {where}"[:2000]) from None
        params, asked = read_request(request, self.limits, self.count, self._decode)
        if not request.messages:
            raise GatewayError(400, "messages is empty")
        if not conversation.lock.acquire(blocking=False):
            raise GatewayError(409, "this trajectory has a request in flight: one at a time")
        try:
            if conversation.finished:
                raise GatewayError(409, FINISHED)
            return self._answer(conversation, request, params, asked)
        finally:
            conversation.lock.release()

    def _answer(
        self,
        conversation: _Conversation,
        request: ChatRequest,
        params: SamplingParams,
        asked: Asked,
    ):
        if conversation.overflowed:
            raise GatewayError(409, OVERFLOWED)
        messages = []
        for i, m in enumerate(request.messages):
            message = m.model_dump(exclude_none=True, include=_KEPT)
            if isinstance(message.get("content"), list):  # text parts: one text
                message["content"] = message_text(message["content"])
            found = [t for t in self._control_tokens if t in (message.get("content") or "")]
            if found:  # the template would encode it as the control token itself
                self.count("control_tokens_refused")
                raise GatewayError(
                    400, f"messages[{i}] contains the chat control token {found[0]!r}: it "
                    "would forge the conversation's structure; remove or escape it"
                )  # fmt: skip
            messages.append(message)
        tools = [t.model_dump(exclude_none=True) for t in request.tools or []] or None
        if asked.no_tools:  # tool_choice "none": the template renders no tools
            tools = None
        recorder = conversation.recorder
        try:
            prompt = recorder.prompt_ids(messages, tools)
        except Exception as err:  # noqa: BLE001 - the template refused these messages
            raise GatewayError(
                400, f"the chat template cannot render these messages: {err}"
            ) from None
        room = self.limits.max_context_tokens - len(prompt)
        if room < 1:
            conversation.overflowed = True  # no later request is recorded
            conversation.recorder.trajectory.end_reason = "context_overflow"
            self.count("context_overflows")
            raise GatewayError(
                400,
                f"the prompt is {len(prompt)} tokens, max_context_tokens is "
                f"{self.limits.max_context_tokens}: no room for an answer",
                code="context_length_exceeded",
            )
        params = replace(params, max_new_tokens=min(params.max_new_tokens, room))
        try:
            submitted = self._batcher.submit(prompt, params, cache_key=id(conversation))
            wait = self.limits.answer_timeout_s
            if conversation.deadline is not None:
                wait = min(wait, max(0.0, conversation.deadline - time.monotonic()))
            generation, version = submitted.result(timeout=wait)
        except TimeoutError:
            submitted.cancel()  # not generated if the batcher has not taken it yet
            raise GatewayError(504, "the engine did not answer in time") from None
        except BatcherClosed as err:
            conversation.engine_failures += 1
            raise GatewayError(503, str(err)) from None
        except Exception as err:  # noqa: BLE001 - the engine failed this batch
            conversation.engine_failures += 1
            self.count("engine_failures")
            raise GatewayError(503, f"the engine failed: {type(err).__name__}: {err}") from None
        stopped = params.stop is not None and params.stop.cut(generation.ids)
        if stopped:  # the ids end at the stop sequence's last token, the text before it
            kept, text = stopped
            generation = Generation(generation.ids[:kept], generation.behaviour_logp[:kept], False)
            self.count("stop_sequences")
        else:
            text = self._decode(generation.ids)
        if tools and self.tools_supported:
            names = {t["function"]["name"] for t in tools}
            parsed = parse_tool_calls(text, names, call_id=f"call_{conversation.requests}")
            if parsed.error:
                self.count("tool_parse_failures")
            reply = parsed.message()
        else:
            reply = {"role": "assistant", "content": text}
        cut = (
            not stopped
            and not generation.ended_with_eos
            and len(generation.ids) >= params.max_new_tokens
        )
        recorder.record_answer(
            generation.ids,
            generation.behaviour_logp,
            version,
            ended_with_eos=generation.ended_with_eos,
            reply=reply,
            cut=cut,
        )
        conversation.requests += 1
        self.count("requests")
        finish = "length" if cut else ("tool_calls" if reply.get("tool_calls") else "stop")
        body = completion_body(
            self.limits.model, reply, finish, prompt, generation, asked, self.tokenizer
        )
        return Streamed(body, asked.include_usage) if asked.stream else body

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ----- the HTTP server ---------------------------------------------------------
    def serve(self, host: str = "127.0.0.1", port: int = 0, url: str | None = None) -> str:
        """Start serving in a background thread; the base URL agents are given
        (``.../v1``): ``url`` (its port filled in where it says ``{port}``), or
        ``http://<host>:<port>/v1``, with this machine's address in place of a
        wildcard host (0.0.0.0), which no client can connect to."""
        import uvicorn

        from ragen_rllib.agents.gateway_app import make_app
        from ragen_rllib.agents.gateway_guard import BACKLOG, connection_cap, guarded_protocol

        app = make_app(self, GatewayError)
        protocol = guarded_protocol(
            max_connections=connection_cap(self.limits.max_connections),
            header_timeout_s=self.limits.header_timeout_s,
            count=self.count,
            counts=lambda: dict(self.counts),
        )
        # Idle connections stay open longer than a client keeps them (httpx: 5 s), so
        # the server never closes one as the client reuses it.
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            timeout_keep_alive=75,
            http=protocol,
            backlog=BACKLOG,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="gateway", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start on {host}:{port}")
            time.sleep(0.01)
        bound = self._server.servers[0].sockets[0].getsockname()
        if url:
            return url.format(port=bound[1])
        if host in WILDCARD_HOSTS:
            host = this_machines_address()
        if not is_loopback(host):
            logger.warning(
                "the agents' gateway listens on %s:%d: anyone who can reach it can connect; "
                "its per-trajectory keys are the only access control",
                host,
                bound[1],
            )
        return f"http://{host}:{bound[1]}/v1"

    @property
    def serving(self) -> bool:
        """Whether the HTTP server is up (started and its thread alive)."""
        return (
            self._server is not None
            and self._thread is not None
            and self._thread.is_alive()
            and bool(self._server.started)
            and not self._server.should_exit
        )

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._batcher.close()


#: the message fields the chat template sees
_KEPT = {"role", "content", "name", "tool_calls", "tool_call_id"}
