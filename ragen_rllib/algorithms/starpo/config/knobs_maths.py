"""The maths room's knobs (``maths/``): the advantage estimator with its discounts and its
reward normalisation (``maths/estimators.py``, ``maths/advantages.py``), and StarPO-S's
rollout filter, which keeps the groups whose rewards spread most (``maths/filters.py``)."""

from __future__ import annotations

from ragen_rllib.algorithms.starpo.config.knob import Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import boolean, choice, number, registry_choice
from ragen_rllib.maths.advantages import REWARD_NORM_METHODS
from ragen_rllib.maths.estimators import ESTIMATORS
from ragen_rllib.maths.filters import FILTER_DIRECTIONS, FILTER_METRICS, FILTER_STRATEGIES

UNIT = number(0, 1)
NONNEG = number(0)
K = Knob

ADVANTAGES = knobs(
    "advantages and rewards",
    K(
        "advantage_estimator",
        "gae",
        registry_choice(ESTIMATORS),
        "the advantage estimator, a row of maths/estimators.py: "
        + "; ".join(
            f"{row.name}: {row.summary}{' (critic)' if row.needs_critic else ''}"
            for row in ESTIMATORS.values()
        )
        + " (docs/algorithms.md)",
        cross=True,
    ),
    K(
        "reward_level",
        "trajectory",
        choice(("trajectory", "turn")),
        "reward on the last token (trajectory) or on each turn's (turn)",
    ),
    K("gamma", 1.0, UNIT, "discount (paper 1.0)", rllib=True),
    K("lambda_", 1.0, UNIT, "GAE lambda (paper 1.0)", yaml="lambda"),
    K("gamma_turn", 0.95, UNIT, "bi-level GAE: discount between turns"),
    K("lambda_turn", 1.0, UNIT, "bi-level GAE: lambda between turns"),
    K("gamma_token", 1.0, UNIT, "bi-level GAE: discount between a turn's tokens"),
    K("lambda_token", 1.0, UNIT, "bi-level GAE: lambda between a turn's tokens"),
    K(
        "reward_norm_grouping",
        "state",
        choice(("state", "state_seat", "batch", "env")),
        "group-baseline estimators: compare a reward with its state's rollouts (state_seat: "
        "those at its seat of a two-player game), the batch or its env",
        cross=True,
    ),
    K(
        "reward_norm_method",
        None,
        choice(REWARD_NORM_METHODS, none_ok=True, null="the estimator's own"),
        "mean_std, mean, identity or asym_clip (null: mean_std for grpo and gigpo, mean otherwise)",
        cross=True,
    ),
    K("gigpo_gamma", 0.95, UNIT, "GiGPO: discount of a turn's return in its step group"),
    K("gigpo_step_weight", 1.0, NONNEG, "GiGPO: weight of the step-level advantage"),
    K(
        "rae_decay",
        0.95,
        number(0, 1, high_open=True),
        "RAE: how much of its running baseline (per env and seat) a trajectory's reward "
        "leaves (b = decay * b + (1 - decay) * R)",
    ),
    K(
        "whiten_advantages",
        True,
        boolean(),
        "whiten GAE advantages over the batch's response tokens (the paper's code)",
    ),
)

FILTER = knobs(
    "rollout filter (StarPO-S)",
    K(
        "filter_keep_ratio",
        0.25,
        number(0, 1, low_open=True, why="; 1.0 turns filtering off"),
        "top_k's share of groups kept by reward spread (StarPO-S 0.25; 1.0: off)",
        cross=True,
    ),
    K(
        "filter_strategy",
        "top_k",
        choice(FILTER_STRATEGIES),
        "top_k (a share), top_k_abs (a count), top_p (a share of the total score), "
        "min_p (at least that times the best)",
        cross=True,
    ),
    K(
        "filter_value",
        None,
        number(
            none_ok=True,
            why=" (top_k, top_p: in (0, 1]; top_k_abs: an integer >= 1; min_p: in [0, 1])",
        ),
        "the strategy's value (null: top_k takes filter_keep_ratio)",
        cross=True,
    ),
    K(
        "filter_direction",
        "largest",
        choice(FILTER_DIRECTIONS),
        "keep the groups of largest spread (smallest: an ablation)",
    ),
    K(
        "filter_include_zero",
        True,
        boolean(),
        "groups whose rewards are all equal may be kept",
        cross=True,
    ),
    K(
        "filter_metric",
        "reward_std",
        choice(FILTER_METRICS),
        "a group's score: the in-group reward std or variance",
    ),
    K(
        "filter_scope",
        "env",
        choice(("env", "all")),
        "with env_mix: rank groups within each env, or over the whole batch",
        cross=True,
    ),
)

ALL = ADVANTAGES + FILTER
