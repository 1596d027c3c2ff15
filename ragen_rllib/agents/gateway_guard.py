"""What a client without a key can hold of the gateway: nothing for long.

The gateway's HTTP server runs uvicorn with :func:`guarded_protocol`'s
connection class (uvicorn's h11 protocol with three additions):

- **a cap on open connections** (:func:`connection_cap`: the run's
  ``agent_gateway_max_connections``, and never more than half the process's
  file descriptors less one burst of accepts, :data:`BACKLOG`: the model files,
  Ray and the engine need descriptors too). At the
  cap, a new connection takes the place of the oldest one still waiting for its
  request's headers; when none is waiting (every connection is a request in
  progress or a kept-alive client), the new one is closed at once;
- **a header deadline**: a connection whose request headers are not complete
  ``agent_gateway_header_timeout_s`` after its first byte (or after it opened)
  is closed;
- **bounded logging**: each of these is counted in the gateway's counts
  (``connections_evicted``, ``connections_refused``, ``header_timeouts``) and
  logged at most once a minute, with the counts so far.

The body's deadline, the per-key cap on requests in flight and the closing of
connections after a refusal are the app's (:mod:`.gateway_app`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable

from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

#: the fewest connections the cap allows, whatever the descriptor limit
MIN_CONNECTIONS = 8
#: the listen backlog, which is also how many connections the event loop accepts in
#: one go before any is closed: the cap keeps that many descriptors spare
BACKLOG = 128


def connection_cap(wanted: int) -> int:
    """``wanted``, lowered so that the connections, plus one burst of accepts, stay
    within half the process's soft limit on open files."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(MIN_CONNECTIONS, min(wanted, soft // 2 - BACKLOG))


class _Warnings:
    """At most one warning a minute, saying what was counted so far."""

    def __init__(self, count: Callable[[str], None], counts: Callable[[], dict]) -> None:
        self.count, self.counts, self.last = count, counts, -float("inf")

    def __call__(self, event: str) -> None:
        self.count(event)
        now = time.monotonic()
        if now - self.last >= 60.0:
            self.last = now
            seen = {k: v for k, v in self.counts().items() if k in _EVENTS}
            logger.warning(
                "the agents' gateway is closing connections that hold it without a request "
                "(so far: %s); at most one such line a minute",
                ", ".join(f"{k} {v}" for k, v in sorted(seen.items())),
            )


_EVENTS = ("connections_evicted", "connections_refused", "header_timeouts")


def guarded_protocol(
    *,
    max_connections: int,
    header_timeout_s: float,
    count: Callable[[str], None],
    counts: Callable[[], dict],
) -> type:
    """uvicorn's h11 connection class with the module's cap and header deadline;
    ``count(event)`` counts an event, ``counts()`` reads the counts."""
    warn = _Warnings(count, counts)
    waiting: dict[GuardedH11Protocol, None] = {}  # awaiting headers, oldest first

    class GuardedH11Protocol(H11Protocol):
        _refused = False
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections:
                if waiting:
                    oldest = next(iter(waiting))
                    oldest._close("connections_evicted")
                else:
                    self._refused = True
                    transport.abort()
                    warn("connections_refused")
                    return
            super().connection_made(transport)
            self._await_headers()

        def connection_lost(self, exc) -> None:
            if self._refused:
                return
            self._headers_done()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._between_requests():
                self._await_headers()
            super().data_received(data)
            if not self._between_requests():
                self._headers_done()

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _await_headers(self) -> None:
            if self._header_timer is None:
                waiting[self] = None
                self._header_timer = self.loop.call_later(header_timeout_s, self._late)

        def _headers_done(self) -> None:
            waiting.pop(self, None)
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _late(self) -> None:
            self._header_timer = None
            if self._between_requests():
                self._close("header_timeouts")

        def _close(self, event: str) -> None:
            self._headers_done()
            if not self.transport.is_closing():
                self.transport.abort()
                warn(event)

    return GuardedH11Protocol
