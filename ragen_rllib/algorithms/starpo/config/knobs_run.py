"""The knobs of the actors, asynchrony, faults and the collapse watch."""

from __future__ import annotations

from typing import Any

from ragen_rllib.algorithms.starpo.collapse import GUARDS
from ragen_rllib.algorithms.starpo.config.knob import RLLIB_OWN, Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import (
    boolean,
    choice,
    custom,
    integer,
    is_number,
    number,
)

K = Knob
NONNEG = number(0)


def _custom_resource(name: Any, amount: Any) -> bool:
    """A custom Ray resource request Ray accepts: a name of its own, a finite amount
    >= 0, whole when above 1."""
    return (
        isinstance(name, str)
        and bool(name)
        and name not in ("CPU", "GPU", "memory", "object_store_memory")
        and is_number(amount)
        and amount >= 0
        and (amount <= 1 or float(amount).is_integer())
    )


ACTORS = knobs(
    "actors, asynchrony and faults",
    K(
        "num_env_runners",
        0,
        integer(0),
        "remote runner actors splitting the P groups (0: one runner in the driver)",
        rllib=True,
        cross=True,
    ),
    K(
        "num_learners",
        0,
        integer(0),
        "remote learners (0: one learner in the trial's process)",
        rllib=True,
        cross=True,
    ),
    K(
        "async_rollouts",
        False,
        boolean(),
        "runners sample batch i+1 while the learner updates on batch i (num_env_runners >= 1)",
        cross=True,
    ),
    K(
        "partial_rollouts",
        False,
        boolean(),
        "with async_rollouts: weights that arrive mid-sample are loaded at the next turn "
        "boundary (every token carries the version that generated it)",
        cross=True,
    ),
    K(
        "max_policy_lag",
        1,
        integer(0),
        "a trajectory with a token generated more than this many updates before the "
        "learner's version is dropped, never trained on",
        cross=True,
    ),
    K("num_gpus_per_learner", RLLIB_OWN, NONNEG, "GPUs per learner", rllib=True, cross=True),
    K(
        "num_cpus_per_learner",
        RLLIB_OWN,
        custom(
            lambda v: v == "auto" or (is_number(v) and v >= 0),
            "must be 'auto' or a finite number >= 0",
        ),
        "CPUs per learner",
        rllib=True,
    ),
    K(
        "num_gpus_per_env_runner",
        RLLIB_OWN,
        NONNEG,
        "GPUs per runner actor",
        rllib=True,
        cross=True,
    ),
    K("num_cpus_per_env_runner", RLLIB_OWN, NONNEG, "CPUs per runner actor", rllib=True),
    K("num_cpus_for_main_process", RLLIB_OWN, NONNEG, "CPUs of the trial's process", rllib=True),
    K(
        "custom_resources_per_env_runner",
        RLLIB_OWN,
        custom(
            lambda v: isinstance(v, dict) and all(_custom_resource(k, n) for k, n in v.items()),
            "must be a mapping of resource name to amount, e.g. {rollout: 1}: names other "
            "than CPU, GPU, memory and object_store_memory (set with num_cpus_per_env_runner "
            "and num_gpus_per_env_runner), amounts >= 0 that are whole numbers above 1",
        ),
        "custom Ray resources each runner asks for, e.g. {rollout: 1} (docs/cluster.md)",
        rllib=True,
    ),
    K(
        "restart_failed_env_runners",
        RLLIB_OWN,
        boolean(),
        "a runner that dies is restarted and its groups sampled again",
        rllib=True,
    ),
    K(
        "max_num_env_runner_restarts",
        RLLIB_OWN,
        integer(0),
        "restarts allowed in a run",
        rllib=True,
    ),
    K(
        "env_runner_health_probe_timeout_s",
        RLLIB_OWN,
        number(0, low_open=True, why=" (seconds)"),
        "how long a probe waits for a lost runner (a restart loads the model)",
        rllib=True,
    ),
)

COLLAPSE = knobs(
    "collapse watch",
    K(
        "collapse_guard",
        "off",
        choice(GUARDS),
        "on the early warning: off (log it), checkpoint (also save one), stop (also end the trial)",
    ),
    K(
        "collapse_metrics_interval",
        10,
        integer(0),
        "every n iterations, mutual information of prompts and reasoning (0: never)",
    ),
    K(
        "collapse_mi_samples",
        16,
        integer(2, 256, why=" (the matrix scored is that number squared)"),
        "turns' reasonings (first turns first) scored under each other's prompts",
    ),
    K("collapse_warmup", 20, integer(0), "iterations before the warning may fire"),
    K("collapse_ema", 0.1, number(0, 1, low_open=True), "weight of the warning's EMAs"),
    K(
        "collapse_std_drop",
        0.5,
        number(0, 1, low_open=True),
        "fires when the in-group reward std's EMA falls below this times its peak...",
    ),
    K(
        "collapse_spike",
        3.0,
        number(1, low_open=True),
        "...while approx KL's or the gradient norm's EMA is above this times its median...",
    ),
    K(
        "collapse_entropy_spike",
        2.0,
        number(1, low_open=True),
        "...or the entropy's EMA is above this times its median",
    ),
)

ALL = ACTORS + COLLAPSE
