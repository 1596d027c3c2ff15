"""The env_choice room's knobs (``env_choice/``): which envs a run plays: the env's id and
constructor arguments, the modules that register ids, several envs in one run
(``env_mix``) and the envs evaluated beside the training env (``eval_suites``)."""

from __future__ import annotations

from ragen_rllib.algorithms.starpo.config.knob import Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import checked_elsewhere, custom
from ragen_rllib.env_choice.eval_suites import BUILTIN_SUITES

K = Knob

ENVS = knobs(
    "envs",
    K(
        "env",
        "ragen/SimpleSokoban-v0",
        checked_elsewhere(
            "must be a registered env id (ragen_rllib's, gymnasium's or one env_module registers)"
        ),
        "the env id (rllib train's experiment-level env sets it)",
        rllib=True,
        cross=True,
    ),
    K(
        "env_config",
        {},
        custom(
            lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
            "must be a mapping of env constructor kwargs (string keys)",
        ),
        "keyword arguments of the env's constructor",
        rllib=True,
        cross=True,
    ),
    K(
        "env_module",
        None,
        checked_elsewhere("must be null or a module name (or a list of them) importable here"),
        "module(s) imported in every process before the env is made, for ids they register",
        cross=True,
    ),
    K(
        "env_mix",
        None,
        custom(
            lambda v: v is None or (isinstance(v, list | tuple) and bool(v)),
            "must be null (the env of `env` alone) or a non-empty list of entries such as "
            "{env: ragen/SimpleSokoban-v0, groups: 4}",
        ),
        "several envs in one run: a list of {env, groups, env_config, name, max_turns, "
        "prompt_style, prompt} (docs/envs.md)",
        cross=True,
    ),
    K(
        "eval_suites",
        None,
        checked_elsewhere(
            f"must be null, a list of built-in suite names ({', '.join(BUILTIN_SUITES)}) "
            "or a mapping of suite name to env entries"
        ),
        "other envs evaluated with the training env: built-in names or name -> env entries",
        cross=True,
    ),
)

ALL = ENVS
