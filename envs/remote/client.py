"""Any OpenEnv server as a text env: the answer text goes out, text comes back.

A training run names a server with ``env: openenv+http://HOST:PORT`` (or
``openenv+https://...``); every env runner then makes an
:class:`OpenEnvTextEnv` per trajectory slot, each holding one OpenEnv session
(a WebSocket to ``/ws``, through OpenEnv's own :class:`~openenv.core.GenericEnvClient`).
Its keyword arguments come from ``env_config``::

    env: openenv+http://10.0.0.5:8000
    env_config: {timeout_s: 30, action_field: answer, observation_field: text}

A ``python -m ragen_envs.remote.serve`` server (:mod:`ragen_envs.remote.serve`) needs no
mapping: the answer travels as ``{"answer": text}`` and the observation brings
the text, ``terminated``/``truncated``, the env's ``info`` and its
``instructions()``. A foreign OpenEnv env is mapped by ``action_field`` (the
action field that receives the answer text) and ``observation_field`` (the
observation field that holds the text), or by a subclass that overrides
:meth:`OpenEnvTextEnv.answer_to_action` and :meth:`OpenEnvTextEnv.observation_to_text`
(see docs/remote_envs.md).

Failures: every call is bounded (``connect_timeout_s`` to connect,
``timeout_s`` for the answer); a refused connection, a timeout, a closed
connection, a server-side error or an episode lost with its connection raises
:class:`RemoteEnvError` from ``reset()`` / ``step()``, which the env runner
records as an env error (``end_reason="env_error"``: logged, counted, the
group left out of the update).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import string
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import gymnasium as gym

#: The ``env`` prefixes that name an OpenEnv server.
SCHEMES = ("openenv+http://", "openenv+https://")


class RemoteEnvError(RuntimeError):
    """A remote env call failed: unreachable, timed out, closed, or refused."""


class RemoteEnvTimeout(RemoteEnvError):
    """A remote env call got no answer within ``timeout_s``."""


def is_remote_id(env_id: Any) -> bool:
    return isinstance(env_id, str) and env_id.startswith(SCHEMES)


def base_url_of(env_id: str) -> str:
    """``openenv+http://host:port[/prefix]`` -> ``http://host:port[/prefix]``;
    ValueError for anything else."""
    if not is_remote_id(env_id):
        raise ValueError(f"{env_id!r} does not start with {' or '.join(SCHEMES)}")
    url = env_id[len("openenv+") :].rstrip("/")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as err:
        raise ValueError(f"{env_id!r}: {err}") from None
    if not parts.hostname or parts.query or parts.fragment or parts.username:
        raise ValueError(
            f"{env_id!r} is not a server address: openenv+http://HOST:PORT (an optional "
            "path prefix, no query, fragment or user)"
        )
    del port
    return url


def _opener(url: str) -> urllib.request.OpenerDirector:
    host = urlsplit(url).hostname or ""
    if host in ("localhost", "::1") or host.startswith("127."):
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener()


def check_server(base_url: str, timeout_s: float = 10.0) -> None:
    """GET ``/health``; ConnectionError saying why when the server does not answer
    healthy within ``timeout_s``."""
    url = f"{base_url}/health"
    try:
        with _opener(url).open(url, timeout=timeout_s) as response:
            body = json.loads(response.read(65536) or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise ConnectionError(f"GET {url} failed: {type(err).__name__}: {reason}") from None
    if not isinstance(body, dict) or body.get("status") != "healthy":
        raise ConnectionError(f"GET {url} answered {body!r}, not {{'status': 'healthy'}}")


# ----- one event loop per process, in a thread, for every client ---------------------
_LOOP: tuple[int, asyncio.AbstractEventLoop] | None = None
_LOOP_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP[0] != os.getpid():  # none yet, or a forked child
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="openenv-clients", daemon=True)
            thread.start()
            _LOOP = (os.getpid(), loop)
        return _LOOP[1]


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite (no call may wait forever), got {value!r}")
    return float(value)


class OpenEnvTextEnv(gym.Env):
    """A gymnasium text env played on an OpenEnv server (one session per instance).

    Args:
        base_url: ``http://host:port`` of the server (``https://`` for TLS).
        timeout_s: seconds to wait for the answer to one reset/step/close.
        connect_timeout_s: seconds to open the session's connection.
        action_field: the action field that receives the answer text.
        observation_field: the observation field that holds the text.
        reset_options: sent as ``options`` with every reset (a mapping), if given.

    Override :meth:`answer_to_action`, :meth:`observation_to_text` and
    :meth:`observation_to_info` to map a foreign env's action and observation.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        action_field: str = "answer",
        observation_field: str = "text",
        reset_options: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        for name, value in (
            ("action_field", action_field),
            ("observation_field", observation_field),
        ):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if reset_options is not None and not isinstance(reset_options, dict):
            raise ValueError(f"reset_options must be a mapping or null, got {reset_options!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = _positive("timeout_s", timeout_s)
        self.connect_timeout_s = _positive("connect_timeout_s", connect_timeout_s)
        self.action_field, self.observation_field = action_field, observation_field
        self.reset_options = reset_options
        self.observation_space = gym.spaces.Text(max_length=1 << 20, charset=string.printable)
        self.action_space = gym.spaces.Text(max_length=1 << 16, charset=string.printable)
        self._client: Any = None  # made on the first reset: making this env connects nowhere
        self._episode_socket: Any = None  # the connection the running episode lives on
        self._instructions: str | None = None

    # ----- the mapping hooks (override for a foreign env) ------------------------------
    def answer_to_action(self, answer: str) -> Any:
        """The action for one answer: a dict of action fields, or an OpenEnv ``Action``."""
        return {self.action_field: answer}

    def observation_to_text(self, observation: dict[str, Any]) -> str:
        """The text observation out of the observation's fields."""
        if self.observation_field not in observation:
            raise RemoteEnvError(
                f"the observation has no field {self.observation_field!r} (it has "
                f"{sorted(observation)}); set env_config observation_field"
            )
        return str(observation[self.observation_field])

    def observation_to_info(
        self, observation: dict[str, Any], metadata: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The info dict: the observation's ``info`` field, else the result's metadata."""
        info = observation.get("info")
        return dict(info) if isinstance(info, dict) else dict(metadata or {})

    @property
    def instructions(self) -> Callable[[], str] | None:
        """The env's ``instructions()`` as the last reset sent them; None (no
        instructions, as for an env without the method) when the server sends none."""
        text = self._instructions
        return None if text is None else (lambda: text)

    # ----- gymnasium API -----------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        data: dict[str, Any] = {}
        if seed is not None:
            data["seed"] = int(seed)
        if options is not None or self.reset_options is not None:
            data["options"] = {**(self.reset_options or {}), **(options or {})}
        self._episode_socket = None
        client = self._ensure_client()
        result = self._call("reset()", lambda: client.reset(**data))
        observation = self._fields(result)
        self._episode_socket = self._socket()
        instructions = observation.get("instructions")
        self._instructions = None if instructions is None else str(instructions)
        info = self.observation_to_info(observation, result.metadata)
        return self.observation_to_text(observation), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"step() takes the answer as str, got {type(action).__name__}")
        socket = self._episode_socket
        if socket is None or self._socket() is not socket or not _is_open(socket):
            self._episode_socket = None
            raise RemoteEnvError(
                f"step(): no episode on {self.base_url}: reset() first, or the connection "
                "(and with it the server-side episode) was lost since the last reset()"
            )
        payload = self.answer_to_action(action)
        try:
            result = self._call("step()", lambda: self._client.step(payload))
        except RemoteEnvTimeout:
            self._episode_socket = None  # the episode's state on the server is unknown now
            raise
        except RemoteEnvError as err:
            # The socket closed under the call, or closed just before it and the
            # reconnection failed: either way the server-side episode is gone.
            self._episode_socket = None
            raise RemoteEnvError(
                f"step(): the connection to {self.base_url} (and with it the server-side "
                f"episode) was lost: {err}"
            ) from None
        if self._socket() is not socket:  # answered on a new connection: another episode
            self._episode_socket = None
            raise RemoteEnvError(f"step(): the connection to {self.base_url} was replaced")
        observation = self._fields(result)
        done = bool(result.done)
        terminated = bool(observation.get("terminated", done))
        truncated = bool(observation.get("truncated", False))
        if done and not (terminated or truncated):
            terminated = True
        if terminated or truncated:
            self._episode_socket = None
        reward = 0.0 if result.reward is None else float(result.reward)
        info = self.observation_to_info(observation, result.metadata)
        return self.observation_to_text(observation), reward, terminated, truncated, info

    def close(self) -> None:
        client, self._client, self._episode_socket = self._client, None, None
        if client is not None:
            try:
                self._call("close()", lambda: client.close())
            except RemoteEnvError:
                pass  # the server is gone already: nothing to release

    # ----- the session ---------------------------------------------------------------------
    def _ensure_client(self) -> Any:
        if self._client is None:
            try:
                from openenv.core.generic_client import GenericEnvClient
            except ImportError as err:
                raise RemoteEnvError(
                    "a remote env needs OpenEnv: pip install 'ragen-rllib[openenv]' "
                    f"({type(err).__name__}: {err})"
                ) from None
            self._client = GenericEnvClient(
                base_url=self.base_url,
                connect_timeout_s=self.connect_timeout_s,
                message_timeout_s=self.timeout_s,
            )
        return self._client

    def _socket(self) -> Any:
        return getattr(self._client, "_ws", None)  # OpenEnv 0.10's live connection

    def _fields(self, result: Any) -> dict[str, Any]:
        observation = result.observation
        if not isinstance(observation, dict):
            raise RemoteEnvError(
                f"the server sent an observation that is not a mapping: {observation!r}"
            )
        return observation

    def _call(self, what: str, make: Callable[[], Any]) -> Any:
        """Run ``await make()`` on the clients' loop, within a hard deadline."""

        async def run() -> Any:
            return await make()

        future = asyncio.run_coroutine_threadsafe(run(), _loop())
        deadline = self.connect_timeout_s + self.timeout_s + 5.0
        try:
            return future.result(timeout=deadline)
        except TimeoutError:
            if not future.done():
                future.cancel()
            raise RemoteEnvTimeout(
                f"{what}: {self.base_url} did not answer within timeout_s={self.timeout_s:g}"
            ) from None
        except ConnectionError as err:
            raise RemoteEnvError(f"{what}: cannot reach {self.base_url}: {err}") from None
        except RemoteEnvError:
            raise
        except Exception as err:  # noqa: BLE001 - closed socket, server error, bad JSON
            text = str(err)
            if len(text) > 500:
                text = text[:500] + "..."
            raise RemoteEnvError(
                f"{what} on {self.base_url} failed: {type(err).__name__}: {text}"
            ) from None


def _is_open(socket: Any) -> bool:
    from websockets.protocol import State

    return getattr(socket, "state", None) is State.OPEN
