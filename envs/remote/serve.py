"""Serve a text env as an OpenEnv server: ``python -m ragen_envs.remote.serve ENV_ID``.

::

    python -m ragen_envs.remote.serve ragen/SimpleSokoban-v0 --port 8000
    python -m ragen_envs.remote.serve ragen/SimpleSokoban-v0 --host 0.0.0.0 --port 8000 \\
        --env-config '{"dim_room": [7, 7], "instructions": "compact"}'
    python -m ragen_envs.remote.serve my_pkg.envs:MyGame-v0 --port 8001   # a user's env

The server is OpenEnv's own (``openenv==0.10.0``: FastAPI under uvicorn) around
:class:`TextEnvironment`, which wraps one gymnasium text env per session. A
training run points at it with ``env: openenv+http://HOST:PORT``
(:mod:`ragen_envs.remote.client`); any OpenEnv client can play it too
(:class:`ragen_envs.remote.protocol.RagenEnvClient`).

Sessions: every WebSocket connection to ``/ws`` gets its own env instance, up
to ``--max-sessions`` at once (a trainer holds one per trajectory slot of each
runner). OpenEnv's plain ``POST /reset`` and ``POST /step`` use a fresh env per
request, so they serve one-shot probes, not episodes.

Untrusted input: the answer text is only handed to the env's ``step()``, which
parses it; nothing in it is executed. Answers past ``--max-answer-chars`` are
refused with an error (the session stays open), WebSocket messages and HTTP
bodies past a matching byte limit are refused before they are read whole.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import sys
import uuid
from typing import Any

import gymnasium as gym
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

from ragen_envs.remote.protocol import AnswerAction, TextEnvState, TextObservation

#: Answers longer than this many characters are refused (a model's answer is at most
#: max_new_tokens tokens; 64 Ki characters leaves room for any sane setting).
DEFAULT_MAX_ANSWER_CHARS = 65536
#: Concurrent sessions (env instances) by default.
DEFAULT_MAX_SESSIONS = 256


def jsonable(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON data: tuples and sets become lists, numpy scalars and
    arrays plain numbers and lists, non-finite floats strings, anything else its repr."""
    if depth > 16:
        return repr(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v, depth + 1) for v in value]
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return jsonable(value.tolist(), depth + 1)
    return repr(value)


class TextEnvironment(Environment[AnswerAction, TextObservation, TextEnvState]):
    """An OpenEnv environment around one gymnasium text env (``reset()`` -> str,
    ``step(answer: str)`` -> the 5-tuple), made with ``gym.make(env_id, **env_config)``."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session makes its own env instance

    def __init__(
        self,
        env_id: str,
        env_config: dict[str, Any] | None = None,
        max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
    ) -> None:
        super().__init__()
        self.env_id = env_id
        self.env = gym.make(env_id, **(env_config or {}))
        self.max_answer_chars = max_answer_chars
        self._state = TextEnvState(env_id=env_id)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> TextObservation:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an integer or null, got {seed!r}")
        if options is not None and not isinstance(options, dict):
            raise ValueError(f"options must be a mapping or null, got {options!r}")
        text, info = self.env.reset(seed=seed, options=options)
        self._state = TextEnvState(
            env_id=self.env_id, episode_id=episode_id or str(uuid.uuid4()), done=False
        )
        method = getattr(self.env.unwrapped, "instructions", None)
        return TextObservation(
            text=_text(text),
            info=jsonable(info),
            instructions=str(method()) if callable(method) else None,
        )

    def step(self, action: AnswerAction, timeout_s: float | None = None) -> TextObservation:
        answer = action.answer
        if len(answer) > self.max_answer_chars:
            raise ValueError(
                f"the answer has {len(answer)} characters, more than this server's "
                f"--max-answer-chars={self.max_answer_chars}"
            )
        if self._state.done:
            raise RuntimeError("step() before reset(), or after the episode ended")
        text, reward, terminated, truncated, info = self.env.step(answer)
        self._state.step_count += 1
        self._state.done = bool(terminated or truncated)
        return TextObservation(
            text=_text(text),
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=jsonable(info),
            reward=float(reward),
            done=self._state.done,
        )

    @property
    def state(self) -> TextEnvState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        doc = (type(self.env.unwrapped).__doc__ or "").strip().split("\n")[0]
        return EnvironmentMetadata(name=self.env_id, description=doc or self.env_id)

    def close(self) -> None:
        self.env.close()


def _text(obs: Any) -> str:
    if not isinstance(obs, str):
        raise TypeError(f"the env returned a {type(obs).__name__} observation, not text")
    return obs


class BodyLimit:
    """ASGI middleware: an HTTP request body past ``max_bytes`` gets 413 before it is
    read whole (WebSocket messages are bounded by uvicorn's ``ws_max_size``)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            return await _refuse(send, self.max_bytes)
        seen, started = 0, False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # a chunked body without a declared length
                raise _TooLarge
            return message

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except _TooLarge:
            if not started:  # else the app's error handler has answered (500)
                await _refuse(send, self.max_bytes)


class _TooLarge(Exception):
    pass


async def _refuse(send, max_bytes: int) -> None:
    body = json.dumps({"detail": f"request body over {max_bytes} bytes"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def wire_bytes(max_answer_chars: int) -> int:
    """The byte size a message with an answer of ``max_answer_chars`` can reach: JSON
    escapes a character in up to 12 bytes (a surrogate pair), plus room for the rest."""
    return 12 * max_answer_chars + 65536


def build_app(
    env_id: str,
    env_config: dict[str, Any] | None = None,
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
) -> Any:
    """The ASGI app: OpenEnv's FastAPI app (no web UI) behind :class:`BodyLimit`.
    Makes the env once first, so that a bad id or config fails here."""
    TextEnvironment(env_id, env_config, max_answer_chars).close()
    factory = functools.partial(TextEnvironment, env_id, env_config, max_answer_chars)
    app = create_fastapi_app(
        factory,
        AnswerAction,
        TextObservation,
        max_concurrent_envs=max_sessions,
        env_name=env_id.replace("/", "_").replace(":", "_"),
        state_cls=TextEnvState,
    )
    return BodyLimit(app, wire_bytes(max_answer_chars))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ragen_envs.remote.serve",
        description="Serve a text env over OpenEnv's protocol (HTTP + WebSocket sessions).",
    )
    parser.add_argument("env_id", help="a gymnasium id: ragen/SimpleSokoban-v0, pkg.mod:Env-v0")
    parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to listen on every address")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--env-config",
        default="{}",
        help="env constructor kwargs as JSON: '{\"dim_room\": [6, 6]}'",
    )
    parser.add_argument(
        "--env-module",
        action="append",
        default=[],
        help="a module to import first, which registers the env id (repeatable)",
    )
    parser.add_argument("--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS)
    parser.add_argument("--max-answer-chars", type=int, default=DEFAULT_MAX_ANSWER_CHARS)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    try:
        args.env_config = json.loads(args.env_config)
    except json.JSONDecodeError as err:
        parser.error(f"--env-config is not JSON: {err}")
    if not isinstance(args.env_config, dict):
        parser.error(f"--env-config must be a JSON object, got {args.env_config!r}")
    if args.max_sessions < 1 or args.max_answer_chars < 1:
        parser.error("--max-sessions and --max-answer-chars must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import uvicorn

    import ragen_envs  # noqa: F401  (registers the built-in ids)

    try:
        for module in args.env_module:
            importlib.import_module(module)
        app = build_app(
            args.env_id,
            args.env_config,
            max_sessions=args.max_sessions,
            max_answer_chars=args.max_answer_chars,
        )
    except Exception as err:  # noqa: BLE001 - say what failed, exit non-zero
        print(
            f"ragen_envs.remote.serve: cannot make {args.env_id!r} with {args.env_config!r}: "
            f"{type(err).__name__}: {err}",
            file=sys.stderr,
        )
        return 2
    print(f"serving {args.env_id} on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        ws_max_size=wire_bytes(args.max_answer_chars),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
