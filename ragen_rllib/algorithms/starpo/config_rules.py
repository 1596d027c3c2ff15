"""What each config key may be: one rule per key, and the RLlib settings StarPO takes.

:data:`RULES` maps every key an experiment may set (besides ``env``,
``env_module``, ``env_config`` and ``llm``, whose checks need the env or the
model) to a test and a sentence saying what is allowed;
:mod:`ragen_rllib.algorithms.starpo.config_checks` applies them and the rules
between keys.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

from ragen_rllib.algorithms.starpo.collapse import GUARDS
from ragen_rllib.algorithms.starpo.defaults import STARPO_DEFAULTS
from ragen_rllib.env_runner.prompts import PROMPT_STYLES
from ragen_rllib.maths.advantages import REWARD_NORM_METHODS
from ragen_rllib.maths.estimators import ESTIMATORS
from ragen_rllib.maths.filters import FILTER_DIRECTIONS, FILTER_METRICS, FILTER_STRATEGIES
from ragen_rllib.maths.losses import KL_ESTIMATORS, LOSS_AGGS

REWARD_LEVELS = ("trajectory", "turn")
REWARD_NORM_GROUPINGS = ("state", "batch", "env")
ENGINES = ("hf", "vllm")
DTYPES = ("float32", "bfloat16")
ROLLOUT_DEVICES = ("auto", "cpu", "cuda")


# ----- what a config value may be ---------------------------------------------------
# Booleans are not numbers here (YAML's `true` is not 1), floats must be finite.
def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int too large for a float
        return False


#: Integers are below this (torch and numpy index with int32/int64; a larger value
#: is a typo, not a setting).
_INT_LIMIT = 2**31


def _int_at_least(low: int) -> tuple[Callable[[Any], bool], str]:
    return (
        (lambda v: is_int(v) and low <= v < _INT_LIMIT),
        f"must be an integer >= {low} (and < 2**31)",
    )


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


def _number(test: Callable[[float], bool], allowed: str, *, none_ok: bool = False):
    def ok(value: Any) -> bool:
        return (none_ok and value is None) or (is_number(value) and test(value))

    return ok, ("must be null or " if none_ok else "must be ") + "a finite number " + allowed


_POSITIVE_INTS = (
    "env_groups",
    "group_size",
    "max_turns",
    "max_new_tokens",
    "max_context_tokens",
    "rollout_batch_size",
    "online_k",
    "eval_num_states",
    "minibatch_size",
    "num_epochs",
    "max_nonfinite_updates",
)
_CHOICES = {
    "advantage_estimator": tuple(ESTIMATORS),
    "reward_level": REWARD_LEVELS,
    "reward_norm_grouping": REWARD_NORM_GROUPINGS,
    "filter_strategy": FILTER_STRATEGIES,
    "filter_direction": FILTER_DIRECTIONS,
    "filter_metric": FILTER_METRICS,
    "filter_scope": ("env", "all"),
    "engine": ENGINES,
    "prompt_style": PROMPT_STYLES,
    "model_dtype": DTYPES,
    "rollout_device": ROLLOUT_DEVICES,
    "kl_estimator": KL_ESTIMATORS,
    "learner_strategy": ("ddp", "fsdp"),
    "collapse_guard": GUARDS,
    "grad_clip_by": ("value", "norm", "global_norm"),
}
_UNIT = "in [0, 1]"
#: Keys people may reach for, and where their setting lives.
RENAMED = {
    "model": "the model is set with `llm`",
    "filter_mode": "filter_mode is now filter_direction: 'largest' (was 'top_std') or "
    "'smallest' (was 'bottom_std')",
    "grpo_norm": "grpo_norm is now reward_norm_method (for every estimator with a group "
    "baseline; reward_norm_grouping picks the group)",
}
#: key -> (is the value allowed, what is allowed): every key an experiment may set,
#: besides `env`, `env_module` (env_loading.check_env), `env_config` and `llm`.
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{key: _int_at_least(1) for key in _POSITIVE_INTS},
    **{
        key: (
            (lambda v, c=choices: isinstance(v, str) and v in c),
            f"allowed values are {list(choices)}",
        )
        for key, choices in _CHOICES.items()
    },
    "eval_seed": _int_at_least(0),
    "format_warmup_steps": (
        lambda v: is_int(v) and 0 <= v <= 100_000,
        "must be an integer in [0, 100000] (0: no warm-up)",
    ),
    "format_warmup_batch": (
        lambda v: is_int(v) and 1 <= v <= 1024,
        "must be an integer in [1, 1024]",
    ),
    "format_warmup_lr": _number(lambda v: 0 < v < 1, "in (0, 1)"),
    "collapse_warmup": _int_at_least(0),
    "collapse_metrics_interval": _int_at_least(0),
    "collapse_mi_samples": (
        lambda v: is_int(v) and 2 <= v <= 256,
        "must be an integer in [2, 256] (the matrix scored is that number squared)",
    ),
    "collapse_ema": _number(lambda v: 0 < v <= 1, "in (0, 1]"),
    "collapse_std_drop": _number(lambda v: 0 < v <= 1, "in (0, 1]"),
    "collapse_spike": _number(lambda v: v > 1, "> 1"),
    "collapse_entropy_spike": _number(lambda v: v > 1, "> 1"),
    "context_window": (
        lambda v: v is None or (is_int(v) and 0 <= v < _INT_LIMIT),
        "must be null (the whole history) or an integer >= 0 and < 2**31 (turns of history kept)",
    ),
    "eval_interval": _int_at_least(0),
    "eval_samples_per_state": (
        lambda v: is_int(v) and 1 <= v <= 1024,
        "must be an integer in [1, 1024]",
    ),
    "eval_pass_k": (
        lambda v: isinstance(v, list | tuple) and bool(v) and all(is_int(k) and k >= 1 for k in v),
        "must be a non-empty list of integers >= 1, e.g. [1, 4, 8]",
    ),
    "rollout_dump_interval": _int_at_least(0),
    "num_env_runners": _int_at_least(0),
    "num_learners": _int_at_least(0),
    "seed": (
        lambda v: v is None or (is_int(v) and 0 <= v < 2**32),
        "must be null or an integer in [0, 2**32)",
    ),
    "lr": _number(lambda v: v > 0, "> 0"),
    "critic_lr": _number(lambda v: v > 0, "> 0"),
    "temperature": _number(
        lambda v: v > 0,
        "> 0: at 0 every rollout of a group is the same answer, so a group has no "
        "reward spread to learn from (eval_temperature may be 0 for greedy evaluation)",
    ),
    "eval_temperature": _number(lambda v: v >= 0, ">= 0 (0: greedy)"),
    "top_p": _number(lambda v: 0 < v <= 1, "in (0, 1]"),
    "clip_low": _number(lambda v: 0 < v < 1, "in (0, 1)"),
    "clip_high": _number(lambda v: 0 < v < 1, "in (0, 1)"),
    "dual_clip": _number(lambda v: v > 1, "> 1", none_ok=True),
    "vf_clip": _number(lambda v: v > 0, "> 0", none_ok=True),
    "grad_clip": _number(lambda v: v > 0, "> 0", none_ok=True),
    "filter_keep_ratio": _number(lambda v: 0 < v <= 1, "in (0, 1]; 1.0 turns filtering off"),
    "filter_value": _number(
        lambda v: True,
        "(top_k, top_p: in (0, 1]; top_k_abs: an integer >= 1; min_p: in [0, 1])",
        none_ok=True,
    ),
    "filter_include_zero": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "skip_zero_advantage_updates": ((lambda v: isinstance(v, bool)), "must be true or false"),
    # Each entry is checked by env_mix.parse_env_mix (config_checks).
    "env_mix": (
        lambda v: v is None or (isinstance(v, list | tuple) and bool(v)),
        "must be null (the env of `env` alone) or a non-empty list of entries such as "
        "{env: ragen/SimpleSokoban-v0, groups: 4}",
    ),
    "loss_agg": (
        lambda v: v is None or (isinstance(v, str) and v in LOSS_AGGS),
        f"allowed values are null (the estimator's own) or {list(LOSS_AGGS)}",
    ),
    "reward_norm_method": (
        lambda v: v is None or (isinstance(v, str) and v in REWARD_NORM_METHODS),
        f"allowed values are null (the estimator's own) or {list(REWARD_NORM_METHODS)}",
    ),
    **{
        key: _number(lambda v: 0 <= v <= 1, _UNIT)
        for key in (
            "gamma",
            "lambda_",
            "gamma_turn",
            "lambda_turn",
            "gamma_token",
            "lambda_token",
            "max_env_error_share",
            "gigpo_gamma",
        )
    },
    **{
        key: _number(lambda v: v >= 0, ">= 0")
        for key in (
            "entropy_coeff",
            "kl_coeff",
            "weight_decay",
            "vf_loss_coeff",
            "gigpo_step_weight",
            "num_gpus_per_learner",
            "num_gpus_per_env_runner",
            "num_cpus_per_env_runner",
            "num_cpus_for_main_process",
        )
    },
    "num_cpus_per_learner": (
        lambda v: v == "auto" or (is_number(v) and v >= 0),
        "must be 'auto' or a finite number >= 0",
    ),
    "whiten_advantages": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "async_rollouts": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "gradient_checkpointing": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "pack_sequences": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "lora_rank": _int_at_least(0),
    "lora_alpha": _number(lambda v: v > 0, "> 0"),
    "lora_dropout": _number(lambda v: 0 <= v < 1, "in [0, 1)"),
    "lora_target_modules": (
        lambda v: (
            v == "all-linear"
            or (isinstance(v, list) and v and all(isinstance(m, str) and m for m in v))
        ),
        "must be 'all-linear' or a non-empty list of module names, e.g. [q_proj, v_proj]",
    ),
    "max_tokens_per_microbatch": (
        lambda v: v is None or (is_int(v) and 1 <= v < _INT_LIMIT),
        "must be null (the whole minibatch in one pass) or an integer >= 1 and < 2**31",
    ),
    "vllm_gpu_memory_utilization": _number(lambda v: 0 < v <= 1, "in (0, 1]", none_ok=True),
    "engine_sleep_level": (
        lambda v: v is None or (is_int(v) and v in (0, 1, 2)),
        "must be null (2 when the engine shares a GPU with the learner, else 0), 0, 1 or 2",
    ),
    "vllm_kv_cache_gb": _number(lambda v: v > 0, "> 0 (GiB)", none_ok=True),
    "vllm_enforce_eager": (
        (lambda v: v is None or isinstance(v, bool)),
        "must be null (true on the CPU build, false on a GPU) or true or false",
    ),
    "max_policy_lag": _int_at_least(0),
    # RLlib's fault tolerance for env runners: a runner that dies is restarted and its
    # share of the groups is sampled again.
    "restart_failed_env_runners": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "max_num_env_runner_restarts": _int_at_least(0),
    # How long a probe waits for a lost runner to come back (a restart loads the model).
    "env_runner_health_probe_timeout_s": _number(lambda v: v > 0, "> 0 (seconds)"),
    # Custom Ray resources each runner actor asks for, e.g. {rollout: 1}: the runners
    # go only to nodes started with them (ray start --resources='{"rollout": 4}').
    "custom_resources_per_env_runner": (
        lambda v: isinstance(v, dict) and all(_custom_resource(k, n) for k, n in v.items()),
        "must be a mapping of resource name to amount, e.g. {rollout: 1}: names other "
        "than CPU, GPU, memory and object_store_memory (set with num_cpus_per_env_runner "
        "and num_gpus_per_env_runner), amounts >= 0 that are whole numbers above 1",
    ),
    "shuffle_batch_per_epoch": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "prefill": ((lambda v: isinstance(v, str)), "must be a string (may be empty)"),
    # Its parts are checked with the mixture (prompts.prompt_format names the part).
    "prompt": (
        (lambda v: v is None or isinstance(v, dict)),
        "must be null or a mapping of prompt parts, e.g. {system: 'You play a game.'}",
    ),
    "framework_str": ((lambda v: v == "torch"), "StarPO runs on 'torch' only"),
}
#: The RLlib AlgorithmConfig settings an experiment's config may set (attribute names).
#: RLlib's other settings are rejected: StarPO does not read them, or they could
#: break a run in ways no check here covers.
RLLIB_KEYS = ("env", "env_config") + tuple(key for key in RULES if key not in STARPO_DEFAULTS)
#: How a YAML key is shown when its attribute has another name.
YAML_NAMES = {"framework_str": "framework"}


@functools.lru_cache(maxsize=1)
def rllib_settings() -> frozenset[str]:
    """Every setting of RLlib's AlgorithmConfig (attribute names)."""
    plain = AlgorithmConfig()
    return frozenset(plain.to_dict()) | frozenset(vars(plain))


def number_hint(value: Any) -> str:
    """A hint for numbers that YAML read as strings (`1e-4` without a '.' is a string)."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return (
            f" (got the string {value!r}: YAML reads exponents without a decimal point, "
            "such as 1e-4, as strings; write 1.0e-4)"
        )
    return ""


def key_listing(width: int = 88) -> str:
    """The keys an experiment's config takes, wrapped to ``width``: StarPO's, then RLlib's."""
    import textwrap

    rllib = sorted(YAML_NAMES.get(k, k) for k in RLLIB_KEYS)
    out = []
    for label, keys in (("StarPO keys", sorted(STARPO_DEFAULTS)), ("RLlib keys", rllib)):
        out.append(textwrap.fill(", ".join(keys), width, initial_indent=f"  {label}: ",
                                 subsequent_indent="    "))  # fmt: skip
    return "\n".join(out)
