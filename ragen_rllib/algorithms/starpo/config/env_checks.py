"""The config checks that make the run's envs: each ``env_mix`` entry, each
evaluation suite env, each curriculum stage and the training env with its
``env_config`` is made and reset once before Ray starts, so a bad option fails
here naming its key, not in an env runner."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ragen_rllib.agents.programs import SPLITS, load_callable, load_tasks, resolve_path
from ragen_rllib.algorithms.starpo.config.knobs import KNOBS
from ragen_rllib.env_choice.env_loading import (
    check_env,
    make_env,
    make_eval_env,
    names_aec_factory,
)
from ragen_rllib.env_choice.env_mix import mix_entries, parse_env_mix
from ragen_rllib.env_choice.eval_suites import resolve_suites
from ragen_rllib.env_runner.curriculum import parse_curriculum


def check_env_mix(config) -> None:
    """``env_mix``: well-formed entries of registered envs that can be made and reset
    with their options, whose groups add up to ``env_groups``; ValueError naming the
    entry and key."""
    entries = parse_env_mix(config.env_mix)
    for i, entry in enumerate(entries):
        try:
            check_env(SimpleNamespace(env=entry.env, env_module=config.env_module))
        except ValueError as err:
            raise ValueError(f"config env_mix[{i}]: {err}") from None
        if names_aec_factory(entry.env):
            raise ValueError(
                f"config env_mix[{i}]: env={entry.env!r} names a PettingZoo AEC env factory, "
                "which plays only in self-play; self-play with env_mix is not supported yet"
            )
    if config.env != entries[0].env:
        raise ValueError(
            f"config env={config.env!r} is invalid with env_mix: leave it out (it is the "
            f"first entry's, {entries[0].env!r})"
        )
    if config.env_config:
        raise ValueError(
            f"config env_config={config.env_config!r} is invalid with env_mix: give each "
            "entry its own env_config"
        )
    total = sum(e.groups for e in entries)
    if config.env_groups != total:
        raise ValueError(
            f"config env_groups={config.env_groups} is invalid with env_mix: the entries' "
            f"groups add up to {total}; leave env_groups out or set it to {total}"
        )
    for i, entry in enumerate(entries):
        make_and_reset(
            lambda entry=entry: make_eval_env(entry),
            f"config env_mix[{i}] ({entry.name}): {entry.env} with {entry.env_config!r} "
            "cannot be made and reset",
        )


def make_and_reset(make: Callable[[], Any], what: str, options: dict | None = None) -> None:
    """Make an env and reset it once (with ``options``, if any); whatever fails raises
    ValueError saying ``what``."""
    try:
        env = make()
        try:
            env.reset(seed=0, **({} if options is None else {"options": options}))
        finally:
            env.close()
    except Exception as err:  # noqa: BLE001 - whatever the env raises, name the key
        raise ValueError(f"{what}: {type(err).__name__}: {err}") from err


def check_eval_suites(config) -> None:
    """Every suite env is made with its merged options and reset once, as the
    training env is; a malformed suite or a bad option names `eval_suites`."""
    suites = resolve_suites(config)  # ValueError naming eval_suites on a bad shape or id
    for suite, envs in suites.items():
        for entry in envs:
            make_and_reset(
                lambda entry=entry: make_eval_env(entry),
                f"config eval_suites[{suite!r}]: env {entry.name!r} ({entry.env} with "
                f"{entry.env_config!r}) cannot be made and reset",
            )


def check_curriculum(config) -> None:
    """Well-formed stages, and every stage's options taken by the training env."""
    if config.env_mix is not None:
        raise ValueError("config curriculum is invalid with env_mix: give one env (`env`)")
    for i, (_, options) in enumerate(parse_curriculum(config.curriculum)):
        make_and_reset(
            lambda: make_env(config),
            f"config curriculum[{i}]: the env {config.env!r} rejects reset_options={options!r}",
            options or None,
        )


def check_env_config(config) -> None:
    """Make the env with `env_config` and reset it once: a kwarg the env does not
    take, or a value it rejects, fails here and not in an env runner."""
    make_and_reset(
        lambda: make_env(config),
        f"config env_config={config.env_config!r} is invalid for env {config.env!r}: "
        "making and resetting the env with it failed",
    )


#: settings of the env runner's own prompts and turns, which an agent does not use
ENV_ONLY = (
    "env_config",
    "max_turns",
    "context_window",
    "prompt_style",
    "prompt",
    "prefill",
    "format_warmup_steps",
)


def check_agent(config) -> None:
    """``agent`` and ``agent_tasks`` together, the agent importable, both splits'
    tasks there, and none of the env-only settings beside them; file paths are
    made absolute (the env runners may start elsewhere)."""
    for key in ("agent", "agent_tasks"):
        if getattr(config, key) in (None, ""):
            other = "agent_tasks" if key == "agent" else "agent"
            raise ValueError(f"config {key} is missing: {other} is set; give both")
    for key in ("env_mix", "curriculum", "eval_suites"):
        if getattr(config, key) is not None:
            raise ValueError(f"config {key} is invalid with agent: the agent plays its tasks")
    for key in ENV_ONLY:  # the agent writes its prompts and decides its turns
        if getattr(config, key) != KNOBS[key].default:
            raise ValueError(
                f"config {key}={getattr(config, key)!r} is invalid with agent: the agent "
                "writes its own prompts and decides its turns; leave it out"
            )
    if config.partial_rollouts:
        raise ValueError("config partial_rollouts is invalid with agent: not supported yet")
    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(
            f"config agent needs {' and '.join(missing)} (the agents' gateway): "
            "pip install -e '.[agents]'"
        )
    config.agent = resolve_path(config.agent)
    config.agent_tasks = resolve_path(config.agent_tasks)
    load_callable(config.agent, "agent")
    for split in SPLITS:
        load_tasks(config.agent_tasks, split)


def check_self_play(config) -> None:
    """``self_play``: one env whose game two seats can play, groups of pairs, and the
    rollout features that assume one trajectory per env refused."""
    if config.group_size % 2:
        raise ValueError(
            f"config group_size={config.group_size} is invalid with self_play: a group's "
            "rollouts pair up as the two seats of a game; use an even group_size"
        )
    for key in ("env_mix", "agent", "curriculum"):
        if getattr(config, key) is not None:
            raise ValueError(f"config {key} is invalid with self_play: not supported yet")
    if config.partial_rollouts:
        raise ValueError("config partial_rollouts is invalid with self_play: not supported yet")
    if (config.env_config or {}).get("invalid_move", "lose_turn") == "lose_game":
        raise ValueError(
            "config env_config.invalid_move=lose_game is invalid with self_play: a game lost "
            "before the other seat's first move leaves it nothing to train; use lose_turn "
            "(the default under self_play) or retry"
        )
    try:  # made as the runners make it: opponent self
        env = make_eval_env(mix_entries(config)[0]).unwrapped
    except (TypeError, ValueError) as err:
        env, why = None, f" ({type(err).__name__}: {err})"
    else:
        why = ""
    if not getattr(env, "self_play", False):
        if config.self_play is None:  # on because env names a function: say so
            raise ValueError(
                f"config env={config.env!r} is invalid: it names a function, which is read "
                "as a PettingZoo AEC env's factory (self-play, self_play null), but it makes "
                f"no two-player AEC env{why}"
            )
        raise ValueError(
            f"config self_play is invalid with env={config.env!r}: it is no two-player game "
            "that one policy can play from both seats (ragen/TicTacToe-v0, "
            f"ragen/KuhnPoker-v0, or an env that takes opponent='self'){why}"
        )
    moves = getattr(getattr(env, "game", None), "max_moves", None)
    if isinstance(moves, int) and config.max_turns <= moves:
        raise ValueError(
            f"config max_turns={config.max_turns} is invalid with self_play on {config.env}: "
            f"a seat makes up to {moves} moves and may then wait for the other seat's last "
            f"(the game's result comes with it); use max_turns >= {moves + 1}"
        )
