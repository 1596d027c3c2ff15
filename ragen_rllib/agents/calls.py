"""Where an agent call runs: a thread (:class:`_Call`, the cheapest; Python cannot
stop a thread, so a hung agent's thread runs on) or a worker process
(:class:`_ProcessCall`, ``agent_isolation: process``) killed at the call's timeout.
Both give the agent's result or its error the same way; :func:`load_callable`
reads an ``agent``/``agent_tasks`` spec."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: What the forkserver imports once, before it forks the agents' processes: the
#: parent's main script (each child would import it again otherwise, on its agent's
#: clock: in a Ray actor that is Ray's worker script, which imports ray), the child's
#: entry point (this module, which imports nothing heavy) and the ``openai`` client,
#: which most agents use (imported where it is installed).
FORKSERVER_PRELOAD = ("__main__", "ragen_rllib.agents.calls", "openai")
#: How long the forkserver may take to start (its imports, on a loaded machine).
SERVER_START_S = 120.0


def load_callable(spec: str, key: str) -> Callable[..., Any]:
    """``module:function`` or ``path/to/file.py:function`` -> the function; ValueError
    naming ``key`` and what is allowed otherwise."""
    allowed = "'module:function' or 'path/to/file.py:function'"
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ValueError(f"config {key}={spec!r} is invalid: must be {allowed}")
    where, name = spec.split(":")
    try:
        if where.endswith(".py"):
            path = Path(where).resolve()
            module_name = f"_ragen_agent_{abs(hash(str(path)))}"
            module = sys.modules.get(module_name)
            if module is None:
                loader_spec = importlib.util.spec_from_file_location(module_name, path)
                if loader_spec is None or not path.is_file():
                    raise FileNotFoundError(f"no file {path}")
                module = importlib.util.module_from_spec(loader_spec)
                sys.modules[module_name] = module
                try:
                    loader_spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[module_name]
                    raise
        else:
            module = importlib.import_module(where)
    except Exception as err:  # noqa: BLE001 - whatever importing the user's code raises
        raise ValueError(
            f"config {key}={spec!r} is invalid: importing {where!r} failed: "
            f"{type(err).__name__}: {err}"
        ) from err
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"config {key}={spec!r} is invalid: {where!r} has no function {name!r}")
    return function


def _call_agent(agent: Callable[..., Any], base_url: str, key: str, task: Any) -> Any:
    out = agent(base_url, key, task)
    if inspect.isawaitable(out):
        out = asyncio.run(_awaited(out))
    return out


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class _Call(threading.Thread):
    """One agent call in its own (daemon) thread: a hung agent cannot hold the runner."""

    def __init__(self, agent, base_url: str, key: str, task: Any) -> None:
        super().__init__(name="agent", daemon=True)
        self.args = (agent, base_url, key, task)
        self.result: Any = None
        self.error: str | None = None

    def run(self) -> None:
        try:
            self.result = _call_agent(*self.args)
        except BaseException as err:  # noqa: BLE001 - the user's code, whatever it raises
            self.error = f"{type(err).__name__}: {err}"[:500]


def _nothing() -> None:
    """The forkserver's readiness probe (:meth:`_ProcessCall.ready`)."""


def _run_in_child(spec: str, base_url: str, key: str, task: Any, conn) -> None:
    """A worker process's agent call: the result (or the error) back through ``conn``."""
    try:
        result = _call_agent(load_callable(spec, "agent"), base_url, key, task)
        conn.send(("ok", result))
    except BaseException as err:  # noqa: BLE001 - the user's code, whatever it raises
        try:
            conn.send(("error", f"{type(err).__name__}: {err}"[:500]))
        except Exception:  # noqa: BLE001 - the pipe is gone: the parent sees no answer
            pass
    finally:
        conn.close()


class _ProcessCall:
    """One agent call in a worker process (``agent_isolation: process``): at its
    timeout the process is killed, so a hung agent holds no thread, descriptor or
    memory afterwards. Same interface as :class:`_Call`; ``is_alive()`` is whether
    the call has not returned (killed at its timeout included).

    The processes are forked from a forkserver (a clean server process, not this one
    with its threads) that has imported this module and the ``openai`` client once.
    Starting it takes seconds on a busy machine, so a batch calls :meth:`ready`
    before its deadline starts: the agents' time is theirs alone."""

    _context = None

    def __init__(self, spec: str, base_url: str, key: str, task: Any) -> None:
        ctx = _ProcessCall.context()
        self._conn, child = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=_run_in_child, args=(spec, base_url, key, task, child), daemon=True
        )
        self._child = child
        self.result: Any = None
        self.error: str | None = None
        self.killed = False
        self._returned = False

    @classmethod
    def context(cls):
        """The forkserver context, with what its server imports once."""
        if cls._context is None:
            import multiprocessing

            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
            cls._context = ctx
        return cls._context

    @classmethod
    def ready(cls, timeout: float = SERVER_START_S) -> float:
        """Start the forkserver if it is not running (or has died) and wait until it
        has forked one empty process; the seconds it took. RuntimeError when that
        takes longer than ``timeout`` (a server stuck in its imports) or fails."""
        start = time.monotonic()
        probe = cls.context().Process(target=_nothing, daemon=True)
        failed: list[BaseException] = []

        def launch() -> None:  # start() waits for the server's imports, unbounded
            try:
                probe.start()
                probe.join()
            except BaseException as err:  # noqa: BLE001 - reported below
                failed.append(err)

        launcher = threading.Thread(target=launch, name="forkserver-probe", daemon=True)
        launcher.start()
        launcher.join(timeout)
        if launcher.is_alive() or failed:
            why = f"{type(failed[0]).__name__}: {failed[0]}" if failed else (
                f"no process forked within {timeout:g} s")  # fmt: skip
            raise RuntimeError(
                f"the agents' forkserver did not start (agent_isolation: process): {why}; "
                "is the machine out of memory or processes, or does importing the agent "
                "program's main script hang?"
            )
        return time.monotonic() - start

    def start(self) -> None:
        self._process.start()
        self._child.close()  # the child's end lives in the child now

    def join(self, timeout: float) -> None:
        try:
            if self._conn.poll(timeout):
                kind, value = self._conn.recv()
                self._returned = True
                if kind == "ok":
                    self.result = value
                else:
                    self.error = value
        except (EOFError, OSError):  # the process ended without an answer
            self._returned = True
            self.error = (
                f"the agent's process ended without a result (exit code {self._process.exitcode})"
            )
        finally:
            if self._process.is_alive() and not self._returned:
                self._process.kill()
                self.killed = True
            self._process.join(5)
            self._conn.close()

    def is_alive(self) -> bool:
        return not self._returned
