"""The algorithms room's knobs (``algorithms/starpo/``): StarPO's actors, their resources
and restarts, asynchronous sampling and the reuse of a batch (``buffer.py``), the
update skipped when nothing is to learn, DAPO's dynamic sampling, the run's seed,
evaluation and rollout dumps, and the collapse watch (``collapse.py``)."""

from __future__ import annotations

from typing import Any

from ragen_rllib.algorithms.starpo.collapse import GUARDS
from ragen_rllib.algorithms.starpo.config.knob import RLLIB_OWN, Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import (
    boolean,
    choice,
    custom,
    integer,
    is_int,
    is_number,
    number,
)

NONNEG = number(0)
K = Knob


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
    "actors and faults",
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

UPDATES = knobs(
    "asynchrony and updates",
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
    K(
        "online_k",
        1,
        integer(1),
        "updates per rollout batch (1: every batch fresh; the paper's Online-k)",
        cross=True,
    ),
    K(
        "skip_zero_advantage_updates",
        False,
        boolean(),
        "critic-free: a batch whose every advantage is 0 takes no optimizer step",
    ),
)

DYNAMIC_SAMPLING = knobs(
    "dynamic sampling (DAPO)",
    K(
        "dynamic_sampling_groups",
        None,
        integer(1, none_ok=True, null="off"),
        "DAPO's dynamic sampling: sample more batches until this many groups with "
        "spread (dynamic_sampling_spread) are kept (groups without spread leave the batch)",
        cross=True,
    ),
    K(
        "dynamic_sampling_spread",
        "success",
        choice(("success", "reward")),
        "dynamic sampling: a group has spread when its trajectories' success differs "
        "(DAPO's rule: its success rate is strictly between 0 and 1), or with reward when "
        "its finite total rewards differ by more than dynamic_sampling_reward_tol; a group "
        "with a non-finite reward never counts as having spread",
    ),
    K(
        "dynamic_sampling_reward_tol",
        1.0e-6,
        number(0),
        "dynamic sampling with spread reward: the largest max-min of a group's total "
        "rewards still read as no spread (float noise, a small length penalty)",
    ),
    K(
        "dynamic_sampling_max_calls",
        2,
        integer(1),
        "dynamic sampling: extra sampling calls per iteration at most",
    ),
)

EVALUATION = knobs(
    "seed, evaluation and dumps",
    K(
        "seed",
        None,
        custom(
            lambda v: v is None or (is_int(v) and 0 <= v < 2**32),
            "must be null or an integer in [0, 2**32)",
        ),
        "the run's seed: initial states, sampling, minibatch order",
        rllib=True,
    ),
    K(
        "eval_num_states",
        256,
        integer(1),
        "fixed initial states for evaluation (paper 256)",
        cross=True,
    ),
    K(
        "eval_seed",
        0,
        integer(0),
        "first seed of the evaluation states (training seeds are drawn >= 2**20)",
        cross=True,
    ),
    K(
        "eval_temperature",
        0.5,
        number(0, why=" (0: greedy)"),
        "sampling temperature at evaluation (paper 0.5)",
    ),
    K(
        "eval_interval",
        0,
        integer(0),
        "evaluate every n iterations (0: only through rllib evaluate)",
    ),
    K(
        "eval_samples_per_state",
        1,
        integer(1, 1024),
        "answers per evaluation state (pass@k needs k)",
        cross=True,
    ),
    K(
        "eval_pass_k",
        (1,),
        custom(
            lambda v: (
                isinstance(v, list | tuple) and bool(v) and all(is_int(k) and k >= 1 for k in v)
            ),
            "must be a non-empty list of integers >= 1, e.g. [1, 4, 8]",
        ),
        "the k of pass@k reported (each <= eval_samples_per_state)",
        cross=True,
    ),
    K(
        "rollout_dump_interval",
        0,
        integer(0),
        "every n iterations the training batch goes to Parquet under the trial's "
        "rollouts/ (0: never)",
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

ALL = ACTORS + UPDATES + DYNAMIC_SAMPLING + EVALUATION + COLLAPSE
