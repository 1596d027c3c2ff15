"""Evaluation suites: named sets of envs a policy is evaluated on besides its own.

``eval_suites`` in the config takes built-in suite names, or a mapping from a
suite name to a built-in name or a list of entries; an entry is an env id, or
``{"env": id, "env_config": {...}, "name": ...}``::

    eval_suites: [bandit]
    eval_suites:
      my_suite:
        - ragen/BanditRev-v0
        - {env: ragen/FrozenLake-v0, env_config: {slip_rate: 0.1}, name: slip_0.10}

Which options an entry's env gets, later ones winning:

1. the run's own ``env_config``, when the entry's env is the same class as the
   training env (so a suite keeps the prompt format the policy was trained on:
   compact instructions, a coordinates line, one move a turn);
2. the options the entry's id was registered with (what makes BanditRev
   BanditRev, even when the run set a bandit ``preset``);
3. the entry's own ``env_config``.

Every entry is played on the same fixed evaluation states (``eval_seed`` ...
``eval_seed + eval_num_states - 1``, disjoint from the training seeds), with
``eval_samples_per_state`` answers per state for pass@k.
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from ragen_envs.remote.client import is_remote_id

#: suite -> entries (name, env id, env_config).
BUILTIN_SUITES: dict[str, tuple[tuple[str, str, dict[str, Any]], ...]] = {
    # Trained on Phoenix/Dragon: new names with the intuitive roles, then reversed.
    "bandit": (
        ("train", "ragen/Bandit-v0", {}),
        ("held_out", "ragen/BanditHeldOut-v0", {}),
        ("rev", "ragen/BanditRev-v0", {}),
    ),
    # Trained on 6x6 one-box Sokoban: new symbols, a larger room, another game.
    "sokoban": (
        ("simple", "ragen/SimpleSokoban-v0", {}),
        ("new_vocab", "ragen/SokobanNewVocab-v0", {}),
        ("large", "ragen/LargeSokoban-v0", {}),
        ("frozenlake", "ragen/FrozenLake-v0", {}),
    ),
    # Two-player games: the fixed opponents a self-play run is measured against.
    "tictactoe": (
        ("random", "ragen/TicTacToe-v0", {}),
        ("greedy", "ragen/TicTacToe-v0", {"opponent": "greedy"}),  # wins, else blocks
        ("minimax", "ragen/TicTacToeMinimax-v0", {}),
    ),
    "kuhn_poker": (
        ("random", "ragen/KuhnPoker-v0", {}),
        ("nash", "ragen/KuhnPokerNash-v0", {}),
    ),
    "simple_negotiation": (
        ("random", "ragen/SimpleNegotiation-v0", {}),
        ("trader", "ragen/SimpleNegotiationTrader-v0", {}),
    ),
    # The chance that a move slips to a perpendicular side.
    "frozenlake": tuple(
        (f"slip_{rate:.2f}", "ragen/FrozenLake-v0", {"slip_rate": rate})
        for rate in (0.0, 1 / 3, 2 / 3)
    ),
}

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class EvalEnv:
    """One env of a suite, with the options it is made with."""

    name: str
    env: str
    env_config: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Identifies the env and its options (an env runner keeps one pool per key)."""
        return self.env + json.dumps(self.env_config, sort_keys=True, default=repr)


def _entry(suite: str, index: int, raw: Any) -> tuple[str | None, str, dict[str, Any]]:
    where = f"eval_suites[{suite!r}][{index}]"
    if isinstance(raw, str):
        return None, raw, {}
    if isinstance(raw, dict) and "env" in raw and set(raw) <= {"env", "env_config", "name"}:
        env_config = raw.get("env_config") or {}
        if not isinstance(env_config, dict):
            raise ValueError(f"config {where}: env_config must be a mapping, got {env_config!r}")
        return raw.get("name"), raw["env"], dict(env_config)
    raise ValueError(
        f"config {where}={raw!r} is invalid: an env id, or a mapping with `env` and "
        "optionally `env_config` and `name`"
    )


def default_name(env_id: str) -> str:
    base = env_id.split(":")[-1].split("/")[-1]
    return re.sub(r"-v\d+$", "", base)


def suite_entries(eval_suites: Any) -> dict[str, list[tuple[str, str, dict[str, Any]]]]:
    """``eval_suites`` as suite -> [(name, env id, entry env_config)]; raises
    ValueError naming the key on a malformed value (env ids are checked later)."""
    if eval_suites is None:
        return {}
    given = eval_suites  # the user's value, for the error (an empty list becomes {})
    if isinstance(eval_suites, str):
        eval_suites = [eval_suites]
    if isinstance(eval_suites, list | tuple):
        odd = [name for name in eval_suites if not isinstance(name, str)]
        if odd:
            raise ValueError(
                f"config eval_suites={eval_suites!r} is invalid: a list holds built-in suite "
                f"names ({', '.join(BUILTIN_SUITES)}), got {odd!r}; name your own suites in a "
                "mapping, suite: [env entries]"
            )
        eval_suites = {name: name for name in eval_suites}
    if not isinstance(eval_suites, dict) or not eval_suites:
        raise ValueError(
            f"config eval_suites={given!r} is invalid: null, a list of built-in suite "
            f"names ({', '.join(BUILTIN_SUITES)}), or a mapping from a suite name to a "
            "built-in name or a list of env entries"
        )
    out: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for suite, spec in eval_suites.items():
        if not isinstance(suite, str) or not _NAME.match(suite):
            raise ValueError(
                f"config eval_suites: suite name {suite!r} must be letters, digits, '_', "
                "'.' or '-' (it becomes part of a metric key)"
            )
        if isinstance(spec, str):
            if spec not in BUILTIN_SUITES:
                raise ValueError(
                    f"config eval_suites: {spec!r} is not a built-in suite; built-in suites "
                    f"are {list(BUILTIN_SUITES)}"
                )
            out[suite] = [(n, e, dict(c)) for n, e, c in BUILTIN_SUITES[spec]]
            continue
        if not isinstance(spec, list | tuple) or not spec:
            raise ValueError(
                f"config eval_suites[{suite!r}]={spec!r} is invalid: a built-in suite name "
                "or a non-empty list of env entries"
            )
        entries = [_entry(suite, i, raw) for i, raw in enumerate(spec)]
        out[suite] = [(name or default_name(env), env, cfg) for name, env, cfg in entries]
    for suite, entries in out.items():
        names = [name for name, _, _ in entries]
        for name in names:
            if not isinstance(name, str) or not _NAME.match(name):
                raise ValueError(
                    f"config eval_suites[{suite!r}]: env name {name!r} must be letters, "
                    "digits, '_', '.' or '-' (it becomes part of a metric key)"
                )
        if len(set(names)) != len(names):
            raise ValueError(
                f"config eval_suites[{suite!r}]: env names {names} repeat; give entries "
                "distinct `name`s"
            )
    return out


def _entry_point(env_id: str) -> Any:
    if is_remote_id(env_id):  # an OpenEnv server: a kind of env of its own
        return env_id
    try:
        return gym.spec(env_id.split(":", 1)[-1]).entry_point
    except gym.error.Error:  # a PettingZoo env's factory (module:env): no registered id
        return env_id


def resolve_suites(config: Any, eval_suites: Any = None) -> dict[str, list[EvalEnv]]:
    """The suites of ``eval_suites`` (by default the config's own) with each env's
    options merged against the run's (see the module doc). The caller has imported
    the env modules."""
    train_entry = _entry_point(config.env)
    suites: dict[str, list[EvalEnv]] = {}
    wanted = config.eval_suites if eval_suites is None else eval_suites
    for suite, entries in suite_entries(wanted).items():
        resolved = []
        for name, env_id, entry_config in entries:
            if is_remote_id(env_id):  # the run's options only for the run's own server
                inherited = dict(config.env_config or {}) if env_id == config.env else {}
                resolved.append(EvalEnv(name, env_id, {**inherited, **entry_config}))
                continue
            try:
                if ":" in env_id:  # module:EnvId, as for `env`
                    importlib.import_module(env_id.split(":", 1)[0])
                spec = gym.spec(env_id.split(":", 1)[-1])
            except (gym.error.Error, ImportError) as err:
                raise ValueError(
                    f"config eval_suites[{suite!r}]: {env_id!r} is not a registered env id "
                    f"({type(err).__name__}: {err})"
                ) from None
            inherited = dict(config.env_config or {}) if spec.entry_point == train_entry else {}
            merged = {**inherited, **(spec.kwargs or {}), **entry_config}
            resolved.append(EvalEnv(name, env_id, merged))
        suites[suite] = resolved
    return suites
