"""Finding and making the configured environment in every process that needs it.

``env`` is a Gymnasium id, a PettingZoo factory or a server:

* a built-in id (``ragen/SimpleSokoban-v0``, ...), registered by ``ragen_envs``;
* ``package.module:EnvId``, Gymnasium's own syntax: the module is imported,
  and is expected to register ``EnvId``;
* an id that the module(s) named by ``env_module`` register on import;
* ``module:factory`` naming a function that makes a two-player PettingZoo AEC env
  (PettingZoo's ``env()`` convention), played in self-play (:func:`self_play_on`);
* ``openenv+http://HOST:PORT``: an OpenEnv server (``python -m ragen_envs.remote.serve``
  or any other), played through :class:`ragen_envs.remote.OpenEnvTextEnv`, whose
  keyword arguments ``env_config`` holds (see docs/remote_envs.md).

A registration made only in the driver does not reach Ray's other processes,
so the config check, the Tune trial and every env runner call
:func:`import_env_modules` before they make the env.

What a text env must offer (the built-in envs offer all of it): ``reset()``
returns a ``str`` observation and ``step(answer: str)`` the usual 5-tuple. The
rest is optional, with these fallbacks (see
:func:`ragen_rllib.chat.prompts.with_instructions`, :func:`actions_left_of`,
:func:`success_of`):

* ``instructions()``: the task description that opens the first prompt;
  without it the first prompt is the turn's observation alone;
* ``info["actions_left"]``: shown in every turn's prompt; without it the line
  is left out;
* ``info["success"]``: the trajectory's success; without it a trajectory
  succeeds when the reward of its last turn is positive.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any

import gymnasium as gym

from ragen_envs.games.aec import AECSeat
from ragen_envs.remote.client import OpenEnvTextEnv, base_url_of, check_server, is_remote_id


def env_modules(config: Any) -> list[str]:
    """The modules to import for ``config.env``: ``env_module`` entries, then the
    module part of a ``module:EnvId`` id."""
    modules = _named(config.env_module)
    if isinstance(config.env, str) and ":" in config.env and not is_remote_id(config.env):
        modules.append(config.env.split(":", 1)[0])
    return modules


def import_env_modules(config: Any) -> None:
    """Import ``ragen_envs`` and the user's env modules; a failed import names the key."""
    import ragen_envs  # noqa: F401  (registers the built-in ids)

    for module in env_modules(config):
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - any failure of the user's module
            key = "env" if module not in _named(config.env_module) else "env_module"
            raise ValueError(
                f"config {key}: importing the env module {module!r} failed: "
                f"{type(err).__name__}: {err}. It must be importable in every Ray process "
                "(installed, or on PYTHONPATH)"
            ) from err


def _named(env_module: Any) -> list[str]:
    if env_module is None:
        return []
    return [env_module] if isinstance(env_module, str) else list(env_module)


def check_env(config: Any) -> None:
    """Raise ValueError naming ``env`` / ``env_module`` when the env cannot be found."""
    env, named = config.env, config.env_module
    if not isinstance(env, str) or not env.strip():
        raise ValueError(
            f"config env={env!r} is invalid: a Gymnasium id such as 'ragen/Bandit-v0', "
            "'my_pkg.my_envs:MyGame-v0', or an id registered by `env_module`"
        )
    names = [named] if isinstance(named, str) else named
    if named is not None and (
        not isinstance(names, list | tuple)
        or not names
        or not all(isinstance(n, str) and n.strip() for n in names)
    ):
        raise ValueError(
            f"config env_module={named!r} is invalid: a module name such as "
            "'my_pkg.my_envs', a list of them, or null"
        )
    if is_remote_id(env):
        import_env_modules(config)
        check_remote(env, getattr(config, "env_config", None), "env")
        return
    if env.count(":") > 1:
        raise ValueError(f"config env={env!r} is invalid: at most one ':' (module:EnvId)")
    import_env_modules(config)
    env_id = env.split(":", 1)[1] if ":" in env else env
    if _aec_factory(env) is not None:  # a PettingZoo AEC env's factory: self-play only
        if getattr(config, "self_play", None) is False:
            raise ValueError(
                f"config self_play=False is invalid with env={env!r}: it names a PettingZoo "
                "AEC env factory, and a two-player AEC env plays only in self-play (one "
                "policy in both seats); allowed: null (the default: self-play, chosen from "
                "the env) or true"
            )
        return
    if env_id not in gym.registry:
        import difflib

        import ragen_envs

        close = difflib.get_close_matches(env_id, list(gym.registry), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"config env={env!r} is not a registered env id.{hint} Built-in ids: "
            f"{', '.join(ragen_envs.ENV_IDS)}; for your own env use 'module:EnvId' or "
            "name the module that registers it in `env_module` (a PettingZoo AEC env: "
            "'module:env', its factory)"
        )


def check_remote(env_id: str, env_config: Any, key: str) -> None:
    """An ``openenv+http://`` id: a well-formed address, OpenEnv installed, and a server
    that answers ``/health``; ValueError naming ``key`` otherwise."""
    try:
        url = base_url_of(env_id)
    except ValueError as err:
        raise ValueError(f"config {key}={env_id!r} is invalid: {err}") from None
    if importlib.util.find_spec("openenv") is None:
        raise ValueError(
            f"config {key}={env_id!r} needs OpenEnv, which is not installed here: "
            "pip install 'ragen-rllib[openenv]' (in every Ray process's environment)"
        )
    timeout = env_config.get("connect_timeout_s") if isinstance(env_config, dict) else None
    if not (isinstance(timeout, int | float) and timeout > 0):
        timeout = 10.0  # the adapter's default; a bad value is its own error later
    try:
        check_server(url, float(timeout))
    except ConnectionError as err:
        raise ValueError(
            f"config {key}={env_id!r}: the OpenEnv server does not answer ({err}). Start it "
            "(python -m ragen_envs.remote.serve ENV_ID --host HOST --port PORT) or fix the address"
        ) from None


def make_env(config: Any) -> gym.Env:
    import_env_modules(config)
    if is_remote_id(config.env):
        return OpenEnvTextEnv(base_url_of(config.env), **config.env_config)
    return _make(config.env, dict(config.env_config or {}))


def make_eval_env(env: Any) -> gym.Env:
    """An evaluation suite's env (an :class:`~ragen_rllib.env_choice.eval_suites.EvalEnv`)."""
    if is_remote_id(env.env):
        return OpenEnvTextEnv(base_url_of(env.env), **env.env_config)
    if ":" in env.env:
        importlib.import_module(env.env.split(":", 1)[0])
    return _make(env.env, dict(env.env_config or {}))


def _make(env_id: str, env_config: dict[str, Any]) -> gym.Env:
    """``gym.make``, or for ``module:factory`` naming a PettingZoo AEC env factory
    (PettingZoo's ``env()`` convention; not a registered id) one self-play seat of
    it, the factory called with ``env_config`` (``opponent`` left out)."""
    factory = _aec_factory(env_id)
    if factory is None:
        return gym.make(env_id, **env_config)
    kwargs = {k: v for k, v in env_config.items() if k != "opponent"}
    return AECSeat(functools.partial(factory, **kwargs))


def _aec_factory(env_id: str):
    module, colon, name = env_id.partition(":")
    if not colon or env_id in gym.registry or name in gym.registry:
        return None
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return found if callable(found) and not isinstance(found, type) else None


def names_aec_factory(env: Any) -> bool:
    """Whether ``env`` is ``module:factory`` naming a PettingZoo AEC env's factory (a
    function, not a registered id). A module that fails to import counts as no: the
    env check (:func:`check_env`) reports its failure, naming the key."""
    if not isinstance(env, str) or is_remote_id(env) or env.count(":") != 1:
        return False
    try:
        importlib.import_module(env.split(":", 1)[0])  # it may register the id
        return _aec_factory(env) is not None
    except Exception:  # noqa: BLE001 - the user's module: check_env names the failure
        return False


def self_play_on(config: Any) -> bool:
    """``self_play`` resolved: true or false as set; null (the default) is on when
    ``env`` (no ``env_mix``) names a PettingZoo AEC env's factory, a two-player game
    with no opponent of its own, so self-play is the only way it can run; off
    otherwise (a built-in game then plays its fixed opponent)."""
    value = getattr(config, "self_play", None)
    if value is not None:
        return bool(value)
    return getattr(config, "env_mix", None) is None and names_aec_factory(
        getattr(config, "env", None)
    )


# ----- the optional parts of the text protocol -------------------------------------
def actions_left_of(info: dict[str, Any]) -> int | None:
    value = info.get("actions_left")
    return None if value is None else int(value)


def success_of(info: dict[str, Any], reward: float) -> bool:
    """``info["success"]`` when the env reports it, else: the last turn's reward > 0."""
    if "success" in info:
        return bool(info["success"])
    return reward > 0
