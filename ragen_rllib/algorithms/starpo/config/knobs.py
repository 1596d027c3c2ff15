"""Every knob an experiment may set, read from its one declaration.

:data:`KNOBS` maps a knob's attribute name to its :class:`~.knob.Knob` (default,
rule, one line of documentation). Everything else here is derived from it: the
defaults StarPOConfig sets, the rules :mod:`.checks` applies, the keys an
experiment file may use, the listing an unknown key gets, and the markdown table
of ``docs/config.md`` (``rllib keys`` prints it).
"""

from __future__ import annotations

import functools
import textwrap
from typing import Any

from ragen_rllib.algorithms.starpo.config import (
    knobs_agents,
    knobs_algorithms,
    knobs_chat,
    knobs_connectors,
    knobs_engines,
    knobs_env_choice,
    knobs_env_runner,
    knobs_learner,
    knobs_maths,
    knobs_models,
    knobs_rl_module,
    knobs_warmup,
)
from ragen_rllib.algorithms.starpo.config.knob import RLLIB_OWN, Knob
from ragen_rllib.algorithms.starpo.config.rules import Rule

#: The knob files, one per room of the package (``knobs_<room>.py`` holds the knobs
#: that room's code reads), in the order docs/config.md lists them.
ROOMS = (
    knobs_models,
    knobs_warmup,
    knobs_engines,
    knobs_env_choice,
    knobs_env_runner,
    knobs_chat,
    knobs_agents,
    knobs_connectors,
    knobs_maths,
    knobs_learner,
    knobs_rl_module,
    knobs_algorithms,
)
KNOBS: dict[str, Knob] = {k.name: k for room in ROOMS for k in room.ALL}
#: StarPO's own knobs and their defaults (attributes RLlib's config lacks).
STARPO_DEFAULTS: dict[str, Any] = {}
#: RLlib settings whose default StarPO sets (the paper's values and the project's).
RLLIB_DEFAULTS: dict[str, Any] = {}
#: name -> rule, for every knob.
RULES: dict[str, Rule] = {}


def rebuild() -> None:
    """Derive the tables above from :data:`KNOBS` (in place: every importer sees it)."""
    for table in (STARPO_DEFAULTS, RLLIB_DEFAULTS, RULES):
        table.clear()
    for name, knob in KNOBS.items():
        RULES[name] = knob.rule
        if not knob.rllib:
            STARPO_DEFAULTS[name] = knob.default
        elif knob.default is not RLLIB_OWN:
            RLLIB_DEFAULTS[name] = knob.default


rebuild()
#: Keys people may reach for, and where their setting lives.
RENAMED = {
    "model": "the model is set with `llm`",
    "filter_mode": "filter_mode is now filter_direction: 'largest' (was 'top_std') or "
    "'smallest' (was 'bottom_std')",
    "grpo_norm": "grpo_norm is now reward_norm_method (for every estimator with a group "
    "baseline; reward_norm_grouping picks the group)",
}


def yaml_name(name: str) -> str:
    """How an attribute is written in an experiment file (``framework_str`` is
    ``framework``, ``lambda_`` is ``lambda``)."""
    knob = KNOBS.get(name)
    return knob.key if knob is not None else name


@functools.lru_cache(maxsize=1)
def rllib_settings() -> frozenset[str]:
    """Every setting of RLlib's AlgorithmConfig (attribute names)."""
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    plain = AlgorithmConfig()
    return frozenset(plain.to_dict()) | frozenset(vars(plain))


def key_listing(width: int = 88) -> str:
    """The keys an experiment's config takes, wrapped to ``width``, by group."""
    groups: dict[str, list[str]] = {}
    for knob in KNOBS.values():
        groups.setdefault(knob.group, []).append(knob.key)
    return "\n".join(
        textwrap.fill(
            ", ".join(keys), width, initial_indent=f"  {group}: ", subsequent_indent="    "
        )
        for group, keys in groups.items()
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def knob_table() -> str:
    """``docs/config.md``: every knob with its default, what it does and what it may be."""
    lines = [
        "# Config knobs",
        "",
        "Every key an experiment's `config:` may set, generated from the knobs' one",
        "declaration each (`ragen_rllib/algorithms/starpo/config/knobs_<room>.py`, the file",
        "of the package folder whose code reads it); `rllib keys` prints this page and a",
        "test keeps it current. \"RLlib's\": RLlib's own default. Cross-key rules (for",
        "instance `minibatch_size` against the groups the filter keeps) are checked too,",
        "and [training.md](training.md) explains the knobs.",
    ]
    group = None
    for knob in KNOBS.values():
        if knob.group != group:
            group = knob.group
            lines += ["", f"## {group}", "", "| key | default | what | allowed |"]
            lines.append("|---|---|---|---|")
        default = "RLlib's" if knob.default is RLLIB_OWN else _yaml_value(knob.default)
        allowed = knob.rule.allowed.removeprefix("must be ").removeprefix("allowed values are ")
        lines.append(
            f"| `{knob.key}` | `{_cell(default)}` | {_cell(knob.doc)} | {_cell(allowed)} |"
        )
    return "\n".join(lines) + "\n"


def _yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(map(_yaml_value, value)) + "]"
    return str(value)
