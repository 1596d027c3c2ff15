"""The gateway's engine batcher: requests that arrive together share one engine call.

One thread takes the waiting requests after a few milliseconds, groups them by
sampling settings and runs the engine on each group; a request's future gets
its generation and the policy version the call started with. A request that
gave up before its call (cancelled) is skipped, and :meth:`Batcher.wait_idle`
tells a caller when no engine call runs any more.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

from ragen_rllib.engines.base import Generation, RolloutEngine, SamplingParams


class BatcherClosed(RuntimeError):
    """A request submitted after :meth:`Batcher.close`."""


class Batcher:
    """Runs the engine on the requests that arrive together, in one thread."""

    def __init__(self, engine: RolloutEngine, wait_s: float, max_batch: int, seed: int) -> None:
        self.engine, self.wait_s, self.max_batch = engine, wait_s, max_batch
        self._queue: list[tuple[list[int], SamplingParams, Future, Any]] = []
        self._cond = threading.Condition()
        self._calls = 0
        self._seed = seed
        self._closed = False
        self._busy = False  # between taking requests and answering them
        self.batches: list[int] = []  # the size of each engine call
        self._thread = threading.Thread(target=self._loop, name="gateway-batcher", daemon=True)
        self._thread.start()

    def submit(self, prompt: list[int], params: SamplingParams, cache_key: Any) -> Future:
        """``cache_key``: the conversation's, so that an engine with a prefix cache
        reuses the keys and values of its earlier turns."""
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise BatcherClosed("the gateway is shutting down")
            self._queue.append((prompt, params, future, cache_key))
            self._cond.notify()
        return future

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed and not self._queue:
                    return
            time.sleep(self.wait_s)  # let the requests arriving together join
            with self._cond:
                taken, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
                self._busy = True
            by_params: dict[SamplingParams, list[tuple[list[int], Future, Any]]] = {}
            for prompt, params, future, key in taken:
                if future.set_running_or_notify_cancel():  # its request gave up: skip it
                    by_params.setdefault(params, []).append((prompt, future, key))
            try:
                for params, items in by_params.items():
                    self._run(params, items)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def reseed(self, seed: int) -> None:
        """Seed the engine calls from here on (``seed``, ``seed + 1``, ...)."""
        with self._cond:
            self._seed, self._calls = int(seed), 0

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no request waits and no engine call runs; whether that came."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self, params: SamplingParams, items: list[tuple[list[int], Future, Any]]) -> None:
        self._calls += 1
        self.batches.append(len(items))
        try:
            # The weights' version as the call starts: what generated these tokens.
            version = self.engine.policy_version
            out: list[Generation] = self.engine.generate(
                [p for p, _, _ in items],
                params,
                seed=self._seed + self._calls,
                cache_keys=[k for _, _, k in items],
            )
            if len(out) != len(items):
                raise RuntimeError(f"the engine gave {len(out)} answers for {len(items)} prompts")
            for (_, future, _), generation in zip(items, out, strict=True):
                future.set_result((generation, version))
        except Exception as exc:  # noqa: BLE001 - every waiting request hears of it
            for _, future, _ in items:
                if not future.done():
                    future.set_exception(exc)
