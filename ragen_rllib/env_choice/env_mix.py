"""Env mixtures: several envs in one run, each with its share of the P groups.

``env_mix`` in the config lists the envs and how many of the iteration's groups
each one gets::

    env_mix:
      - {env: ragen/SimpleSokoban-v0, groups: 4}
      - {env: ragen/FrozenLakeNoSlip-v0, groups: 4, env_config: {size: 4}, max_turns: 3}

An entry may also set ``name`` (the label of its metrics, default: the id's short
name, ``SimpleSokoban``), ``max_turns``, ``prompt_style`` and ``prompt`` (default:
the run's; an entry's ``prompt`` changes parts of the wording on top of the run's).
``env_groups`` is the sum of the entries' groups and ``env`` is the first entry's
id (both derived when the config leaves them out).

Groups never mix envs: group ``g`` of an iteration belongs to the entry whose
range of groups holds it (the first entry takes groups ``0 .. groups-1``, the
next the following ones), on every runner, so a runner that samples any share of
the groups makes the right envs. A run without ``env_mix`` is a mixture of one
entry (``env``, ``env_config``, all ``env_groups``), and takes the same code path.
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass, replace
from typing import Any

from ragen_rllib.chat.prompts import PROMPT_STYLES, PromptFormat, prompt_format
from ragen_rllib.env_choice.env_loading import self_play_on
from ragen_rllib.env_choice.eval_suites import EvalEnv, default_name

#: The keys an ``env_mix`` entry may hold.
ENTRY_KEYS = ("env", "groups", "env_config", "name", "max_turns", "prompt_style", "prompt")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class MixEntry(EvalEnv):
    """One env of a mixture: its options, its share of the groups and its own turn
    limit, prompt style and prompt wording (None: the run's)."""

    groups: int = 1
    max_turns: int | None = None
    prompt_style: str | None = None
    prompt: tuple[tuple[str, Any], ...] | None = None  # a mapping's items (hashable)


def _bad(index: int | None, message: str) -> ValueError:
    where = "env_mix" if index is None else f"env_mix[{index}]"
    return ValueError(f"config {where}: {message}")


def parse_env_mix(raw: Any) -> list[MixEntry]:
    """``env_mix`` as entries; ValueError naming the entry and the key on a bad shape
    (the env ids are checked by :func:`check_mix_envs`)."""
    if not isinstance(raw, list | tuple) or not raw:
        raise _bad(
            None,
            f"{raw!r} is invalid: a non-empty list of entries such as "
            "{env: ragen/SimpleSokoban-v0, groups: 4}",
        )
    entries = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or "env" not in item or "groups" not in item:
            raise _bad(i, f"{item!r} is invalid: a mapping with `env` and `groups`")
        odd = sorted(set(item) - set(ENTRY_KEYS))
        if odd:
            raise _bad(i, f"unknown key(s) {odd}; allowed: {list(ENTRY_KEYS)}")
        env, groups = item["env"], item["groups"]
        if not isinstance(env, str) or not env.strip():
            raise _bad(i, f"env={env!r} is invalid: a Gymnasium id such as 'ragen/Bandit-v0'")
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise _bad(i, f"groups={groups!r} is invalid: an integer >= 1")
        env_config = item.get("env_config") or {}
        if not isinstance(env_config, dict):
            raise _bad(i, f"env_config={env_config!r} is invalid: a mapping of env kwargs")
        turns = item.get("max_turns")
        if turns is not None and (
            isinstance(turns, bool) or not isinstance(turns, int) or turns < 1
        ):
            raise _bad(i, f"max_turns={turns!r} is invalid: null (the run's) or an integer >= 1")
        style = item.get("prompt_style")
        if style is not None and style not in PROMPT_STYLES:
            raise _bad(
                i,
                f"prompt_style={style!r} is invalid: null (the run's) or one of "
                f"{list(PROMPT_STYLES)}",
            )
        prompt = item.get("prompt")
        prompt_format(style or "full", prompt, where=f"env_mix[{i}].prompt")  # raises
        name = item.get("name") or default_name(env)
        if not isinstance(name, str) or not _NAME.match(name):
            raise _bad(
                i,
                f"name={name!r} is invalid: letters, digits, '_', '.' or '-' (it becomes "
                "part of a metric key)",
            )
        items = None if prompt is None else tuple(sorted(prompt.items()))
        entries.append(MixEntry(name, env, dict(env_config), groups, turns, style, items))
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise _bad(None, f"entry names {names} repeat; give entries distinct `name`s")
    return entries


def mix_entries(config: Any) -> list[MixEntry]:
    """The run's mixture: ``env_mix``, or one entry made of ``env``, ``env_config``
    and ``env_groups``."""
    if config.env_mix is None:
        name = default_name(config.env)
        env_config = dict(config.env_config or {})
        if self_play_on(config):  # the other seat is the policy itself
            env_config = {**env_config, "opponent": "self"}
        return [MixEntry(name, config.env, env_config, config.env_groups)]
    return parse_env_mix(config.env_mix)


def entry_of_group(entries: list[MixEntry], group: int) -> MixEntry:
    """The entry that iteration group ``group`` belongs to (groups past the last
    entry's range wrap around, so a runner used on its own still mixes)."""
    ends = list(itertools.accumulate(e.groups for e in entries))
    return entries[bisect.bisect_right(ends, group % ends[-1])]


def turns_of(entry: EvalEnv, default: int) -> int:
    return getattr(entry, "max_turns", None) or default


def format_of(entry: EvalEnv, config: Any) -> PromptFormat:
    """The prompt wording of an entry (or a suite's env): its ``prompt_style`` preset
    (else the run's), the run's ``prompt`` on top, then the entry's own ``prompt``;
    a prefill left null is the run's ``prefill``."""
    style = getattr(entry, "prompt_style", None) or config.prompt_style
    fmt = prompt_format(style, config.prompt)
    own = getattr(entry, "prompt", None)
    if own is not None:
        fmt = prompt_format(fmt, dict(own), where=f"env_mix entry {entry.name!r} prompt")
    return fmt if fmt.prefill is not None else replace(fmt, prefill=config.prefill)
