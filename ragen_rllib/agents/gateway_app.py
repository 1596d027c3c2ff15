"""The gateway's HTTP routes (FastAPI): the OpenAI paths over a
:class:`~ragen_rllib.agents.gateway.Gateway`.

The key is checked before the body is read; the body is read in chunks and
refused (413) as soon as it passes the size limit, so an oversized request is
never held whole; the answer runs in a worker thread (as many as a batch can
hold), so one agent's request never blocks the server's loop.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def _key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def make_app(gateway: Any, GatewayError: type) -> FastAPI:  # noqa: N803 - a class
    """The app serving ``gateway``, refusing with its ``GatewayError`` class."""
    app = FastAPI(title="ragen-rllib gateway", docs_url=None, redoc_url=None, openapi_url=None)
    limiter = anyio.CapacityLimiter(gateway.limits.max_batch * 4)

    def refused(err: GatewayError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

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
        limit = gateway.limits.max_body_bytes
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                gateway.count("refused_413")
                return refused(GatewayError(413, f"the body is over {limit} bytes"))
        try:
            # Each request waits for its batch in a thread: the pool must hold every
            # agent's request at once, or batches stay smaller than the agents.
            return await anyio.to_thread.run_sync(
                gateway.complete, key, bytes(body), limiter=limiter
            )
        except GatewayError as err:
            return refused(err)

    return app
