"""The gateway's HTTP routes (FastAPI): the OpenAI paths over a
:class:`~ragen_rllib.agents.gateway.Gateway`.

The key is checked before the body is read; the body is read in chunks and
refused (413) as soon as it passes the size limit, so an oversized request is
never held whole, and within ``body_timeout_s`` (408); a key has at most
``max_requests_per_key`` requests in flight (429); the answer runs in a worker
thread (as many as a batch can hold), so one agent's request never blocks the
server's loop. A refusal that a retry cannot fix says so (``x-should-retry:
false``, which the ``openai`` client obeys), and one that comes before a key is
known closes the connection. The connection-level guards are
:mod:`.gateway_guard`'s.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import anyio
import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ragen_rllib.agents.gateway_request import Streamed

#: refusals a retry may fix (a full engine, a key's requests in flight): the others
#: say ``x-should-retry: false``
RETRYABLE = {429, 500, 502, 503}
#: refusals after which the connection is closed: nothing known of the client, or its
#: request half-read
CLOSE_AFTER = {401, 408, 413}


def _key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def make_app(gateway: Any, GatewayError: type) -> FastAPI:  # noqa: N803 - a class
    """The app serving ``gateway``, refusing with its ``GatewayError`` class."""
    app = FastAPI(title="ragen-rllib gateway", docs_url=None, redoc_url=None, openapi_url=None)
    limiter = anyio.CapacityLimiter(gateway.limits.max_batch * 4)

    inflight: Counter[str] = Counter()
    inflight_lock = threading.Lock()

    def refused(err: GatewayError) -> JSONResponse:
        headers = {}
        if err.status not in RETRYABLE:
            headers["x-should-retry"] = "false"
        if err.status in CLOSE_AFTER:
            headers["connection"] = "close"
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    @app.get("/v1/models")
    async def models(request: Request):
        if not gateway.knows(_key(request)):
            return refused(GatewayError(401, "unknown API key"))  # finished keys may list
        model = {"id": gateway.limits.model, "object": "model", "owned_by": "ragen-rllib"}
        return {"object": "list", "data": [model]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        key = _key(request)
        try:
            gateway.check_key(key)  # before reading a byte of the body
        except GatewayError as err:
            return refused(err)
        limits = gateway.limits
        with inflight_lock:
            if inflight[key] >= limits.max_requests_per_key:
                gateway.count("refused_429")
                return refused(GatewayError(429, (
                    f"this key has {limits.max_requests_per_key} requests in flight "
                    "already; send the next when one is answered")))  # fmt: skip
            inflight[key] += 1
        try:
            body = bytearray()
            with anyio.move_on_after(limits.body_timeout_s) as scope:
                async for chunk in request.stream():
                    body += chunk
                    if len(body) > limits.max_body_bytes:
                        gateway.count("refused_413")
                        return refused(
                            GatewayError(413, f"the body is over {limits.max_body_bytes} bytes")
                        )
            if scope.cancelled_caught:
                gateway.count("body_timeouts")
                late = f"the body did not arrive within {limits.body_timeout_s:g} s"
                return refused(GatewayError(408, late))
            # Each request waits for its batch in a thread: the pool must hold every
            # agent's request at once, or batches stay smaller than the agents.
            answer = await anyio.to_thread.run_sync(
                gateway.complete, key, bytes(body), limiter=limiter
            )
            if isinstance(answer, Streamed):  # recorded already; sent as events
                return StreamingResponse(answer.events(), media_type="text/event-stream")
            return answer
        except GatewayError as err:
            return refused(err)
        finally:
            with inflight_lock:
                inflight[key] -= 1
                if not inflight[key]:
                    del inflight[key]

    return app
