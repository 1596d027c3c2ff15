"""Metric declarations: each metric's name, definition, unit, and how its values
reduce over a minibatch's micro-batches and over the learners.

One declaration serves every reader: the learner's logging (:func:`learner_log`
and :func:`~ragen_rllib.learner.loss.minibatch_logs`), the driver's and the env
runners' logging (:func:`run_log`, :func:`run_log_dict`, :func:`run_log_time`),
the reduction over learners (RLlib merges what each learner logged by the
reduction declared here), and the generated tables in ``docs/metrics.md``
(:func:`metrics_table`, :func:`run_metrics_tables`, kept current by the suite) and
``rllib report``'s panels (each panel plots declared metrics, its axis labelled
with their unit). Every logging call refuses an undeclared key with a KeyError
that says where to declare it; the suite checks that no code in the package
logs to RLlib's ``MetricsLogger`` past these helpers.
The learners' metrics (``learners/<module id>/``) carry their reductions; the
driver's (:data:`RUN_METRICS`: ``rollout/``, ``filter/``, ``collapse/``, ...) are
logged once per iteration by the driver and reduce over nothing.

Reductions:

* over micro-batches: ``share`` (each micro-batch logs its share of the minibatch's
  value, and the shares add up: the loss terms, token-weighted averages), ``max``
  or ``min`` (of the micro-batches that hold a response token: an empty micro-batch
  contributes nothing), or ``once`` (logged once per update, not per micro-batch);
* over learners: ``mean`` (every learner logs the same value, or each its share
  times the number of learners, whose mean is the whole minibatch's value), ``max``
  or ``min``, or ``sum`` (a count of the iteration, added up over learners).
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One metric's declaration (see the module docstring for the reductions)."""

    name: str
    definition: str
    unit: str
    over_microbatches: str = "share"
    over_learners: str = "mean"  # also the reduce RLlib merges the learners by


#: The learners' metrics, logged under ``learners/<module id>/`` every update.
_LEARNER_ROWS = (
    # name, definition, unit, over micro-batches, over learners
    ("policy_loss", "the policy loss of the update's minibatch (the policy_loss row)", ""),
    ("entropy", "token-mean entropy of the policy on the response tokens in the loss "
     "(with loss_tokens answer: after the reasoning)", "nats"),
    ("response_tokens", "response tokens in the loss of the minibatch, all learners "
     "together", "tokens"),
    ("clip_frac", "share of response tokens where the clip (or CISPO's cap) acted", ""),
    ("clip_frac_high", "clip_frac's part with a positive advantage", ""),
    ("clip_frac_low", "clip_frac's part with a negative advantage", ""),
    ("dual_clip_frac", "share of response tokens where the dual clip acted", ""),
    ("approx_kl", "k3 estimate of KL(old policy, new policy) on the response tokens", "nats"),
    ("ratio_mean", "mean token ratio pi / pi_old on the response tokens", ""),
    ("ratio_max", "largest token ratio pi / pi_old", "", "max", "max"),
    ("is_weight_mean", "mean rollout-correction importance weight (before TIS/MIS)", ""),
    ("is_weight_max", "largest rollout-correction importance weight", "", "max", "max"),
    ("is_corrected_frac", "share of tokens whose weight was truncated or masked", ""),
    ("kl_to_reference", "token-mean KL to the reference model (kl_estimator)", "nats"),
    ("value_loss", "the critic's clipped value loss", ""),
    ("value_mean", "mean critic value on the response tokens", ""),
    ("blank_passes", "passes run without rows to keep DDP/FSDP in step", "passes", "once"),
    ("trainable_parameters", "parameters the optimizer updates", "", "once"),
    ("total_parameters", "parameters of the module", "", "once"),
    ("skipped_nonfinite", "updates skipped in the iteration for a non-finite loss or "
     "gradient norm, summed over learners", "updates", "once", "sum"),
    ("gradients_actor_global_norm", "the actor's global gradient norm before clipping",
     "", "once"),
    ("gradients_critic_global_norm", "the critic's global gradient norm before clipping",
     "", "once"),
    ("rollout_mismatch_kl", "engine-to-learner KL on the tokens sampled with the "
     "learner's own weights (reduced over learners before logging)", "nats", "once"),
    ("rollout_mismatch_max_abs", "largest absolute log-prob gap on those tokens", "nats",
     "once"),
    ("rollout_mismatch_tokens", "tokens sampled with the learner's own weights", "tokens",
     "once"),
    ("off_policy_kl", "engine-to-learner KL on all tokens, policy lag included", "nats",
     "once"),
    ("token_lag_mean", "mean policy lag of the batch's tokens", "updates", "once"),
    ("token_lag_max", "largest policy lag of the batch's tokens (a maximum over learners "
     "before logging)", "updates", "once"),
)  # fmt: skip
LEARNER_METRICS: dict[str, Metric] = {row[0]: Metric(*row) for row in _LEARNER_ROWS}


def learner_metric(name: str) -> Metric:
    """The declaration of a learner metric; a KeyError says where to declare it."""
    try:
        return LEARNER_METRICS[name]
    except KeyError:
        raise KeyError(
            f"learner metric {name!r} is not declared; add it to LEARNER_METRICS in "
            "ragen_rllib/records/metrics.py"
        ) from None


def learner_log(metrics_logger, module_id: str, name: str, value) -> None:
    """Log a learner metric under ``(module_id, name)`` with its declared reduction
    over learners: a sum adds up the iteration's values, anything else is the latest
    update's value (window 1), merged over learners by its reduction."""
    metric = learner_metric(name)
    if metric.over_learners == "sum":
        metrics_logger.log_value((module_id, name), value, reduce="sum")
    else:
        metrics_logger.log_value((module_id, name), value, reduce=metric.over_learners, window=1)


def metrics_table() -> str:
    """The markdown table of the declared learner metrics (docs/metrics.md)."""
    rows = ["| metric | what it is | unit | over micro-batches | over learners |",
            "|---|---|---|---|---|"]  # fmt: skip
    for m in LEARNER_METRICS.values():
        rows.append(f"| `{m.name}` | {m.definition} | {m.unit or '-'} | "
                    f"{m.over_microbatches} | {m.over_learners} |")  # fmt: skip
    return "\n".join(rows)


#: The statistics of a batch of trajectories (``rollout_metrics``), logged under
#: ``rollout/``, under ``rollout/<env>/`` for each env of a mixture, and under
#: ``evaluation/``, ``evaluation/<env or suite>/`` and ``evaluation/<suite>/<env>/``.
TRAJECTORY_FAMILIES = ("rollout", "rollout/*", "evaluation", "evaluation/*", "evaluation/*/*")
_TRAJECTORY_ROWS = (
    ("num_trajectories", "trajectories with an outcome (env errors left out)", "trajectories"),
    ("env_errors", "trajectories ended by an env error", "trajectories"),
    ("success_rate", "share of trajectories that succeeded", ""),
    ("reward_mean", "mean total reward of a trajectory", ""),
    ("batch_reward_std", "population std of the total rewards over the batch", ""),
    ("in_group_reward_std", "mean over groups of the sample std (n - 1) of the group's "
     "total rewards: the rollout filter's and GRPO's quantity", ""),
    ("num_turns_mean", "mean turns per trajectory", "turns"),
    ("response_length_mean", "mean tokens of one turn's response", "tokens"),
    ("trajectory_tokens_mean", "mean tokens of a trajectory, prompts included", "tokens"),
    ("loss_tokens/reasoning_closed_share", "loss_tokens answer: share of turns whose "
     "answer closed its reasoning (the others stay whole in the loss)", ""),
    ("loss_tokens/answer_token_share", "loss_tokens answer: share of the generated tokens "
     "after the reasoning (the ones the loss trains)", ""),
    ("env/*", "mean over turns of the env's info key (action_is_valid, "
     "action_is_effective, format_ok, num_actions)", ""),
    ("end/*", "share of trajectories that ended so (terminated, max_turns, truncated, "
     "context_overflow, env_error)", ""),
    ("game/*", "two-player games: win_rate, draw_rate, loss_rate (the rest cut "
     "unfinished), payoff_mean (unfinished 0) and payoff_mean_seat<k> by the model's seat", ""),
    ("groups_all_success", "share of groups whose rollouts all succeeded", ""),
    ("groups_all_fail", "share of groups whose rollouts all failed", ""),
    ("groups_mixed", "share of groups with both (the only ones that rank success "
     "against failure)", ""),
    ("groups_same_answers", "share of groups whose rollouts gave the same answers", ""),
    ("pass@*", "evaluation: share of states solved by at least one of k tries "
     "(unbiased estimate)", ""),
    ("format_valid_rate", "evaluation: share of turns whose answer had the format", ""),
)  # fmt: skip

#: The driver's other metrics, one row each, by their full key.
_RUN_ROWS = (
    ("rollout/batch_uses", "most times a trajectory of the batch has been trained on", "uses"),
    ("rollout/policy_lag_mean", "mean policy versions between a trajectory's sampling "
     "and this update", "updates"),
    ("rollout/policy_lag_max", "largest such lag in the batch", "updates"),
    ("rollout/dropped_stale_lifetime", "trajectories dropped as too stale, so far",
     "trajectories"),
    ("rollout/batches_held", "batches the freshness buffer holds", "batches"),
    ("rollout/policy_version", "learner updates so far", "updates"),
    ("rollout/env_error_groups_dropped", "groups dropped for an env error", "groups"),
    ("rollout/empty_batches", "iterations with nothing left to train on", "iterations"),
    ("rollout/zero_advantage_batches", "iterations skipped: every advantage 0", "iterations"),
    ("filter/kept_fraction", "share of trajectories the rollout filter kept", ""),
    ("filter/groups_kept", "groups the filter kept", "groups"),
    ("filter/groups_before", "groups the filter ranked", "groups"),
    ("filter/in_group_reward_std_before", "mean in-group reward std before the filter", ""),
    ("filter/in_group_reward_std_after", "mean in-group reward std of the kept groups", ""),
    ("dynamic_sampling/extra_calls", "sampling calls beyond the first this iteration", "calls"),
    ("dynamic_sampling/groups_with_spread", "groups with a spread found", "groups"),
    ("dynamic_sampling/nonfinite_groups", "groups left out for a non-finite total "
     "reward", "groups"),
    ("dynamic_sampling/short", "1 if fewer than dynamic_sampling_groups were found", ""),
    ("overlong/penalised_turn_share", "share of turns the overlong penalty hit", ""),
    ("overlong/penalty_mean", "mean overlong penalty per turn", ""),
    ("collapse/think_words_mean", "mean whitespace words of the model's own think text",
     "words"),
    ("collapse/distinct_1", "distinct word unigrams / all, over the batch's think texts", ""),
    ("collapse/distinct_2", "distinct word bigrams / all, over the batch", ""),
    ("collapse/distinct_1_in_group", "distinct_1 within each group, averaged", ""),
    ("collapse/distinct_2_in_group", "distinct_2 within each group, averaged", ""),
    ("collapse/template_repetition", "share of think texts equal to the most common one "
     "(numbers masked)", ""),
    ("collapse/diversity_s", "time the diversity figures took", "s"),
    ("collapse/mi", "mutual information between prompt and reasoning (RAGEN-2)", "nats"),
    ("collapse/mi_zscore", "mi against its shuffled-pairs baseline", "z"),
    ("collapse/conditional_entropy", "H(reasoning | prompt) per reasoning token", "nats"),
    ("collapse/retrieval_acc_at_1", "share of reasonings whose own prompt scores them "
     "best", ""),
    ("collapse/retrieval_acc_at_*", "... among the k best (k 3, or the number of pairs "
     "when fewer)", ""),
    ("collapse/retrieval_chance", "retrieval_acc_at_1 of a random guess", ""),
    ("collapse/mi_iteration", "the iteration the MI figures were measured at", "iteration"),
    ("collapse/mi_samples", "prompt-reasoning pairs the MI figures used", "pairs"),
    ("collapse/mi_s", "time the MI figures took", "s"),
    ("collapse/*_ema", "the early warning's moving averages (in_group_reward_std, "
     "step_kl, grad_norm, entropy)", ""),
    ("collapse/warning", "the iteration the collapse warning fired at (0 before)",
     "iteration"),
    ("counters/*_lifetime", "lifetime totals that survive a restore (trajectories, turns, "
     "generated tokens, env errors, runner failures and restarts, resampled groups, "
     "dynamic-sampling calls)", ""),
    ("timing/sample_wait_s", "time the driver waited for samples", "s"),
    ("timing/rollout_s", "time the runners spent sampling this iteration", "s"),
    ("timing/update_s", "time of the learner update", "s"),
    ("timing/sync_s", "time of the weight sync", "s"),
    ("timing/iteration_s", "wall time since the previous iteration ended", "s"),
    ("timing/runner_idle_share", "share of the iteration the runners were idle", ""),
    ("timing/learner_idle_share", "share of the iteration the learners were idle", ""),
    # The stages the training step times (RLlib's Algorithm adds timers of its own,
    # training_iteration, training_step, ..., which are RLlib's to document).
    ("timers/env_runner_sampling_timer", "mean time of the sampling stage (the request "
     "and the wait for the runners' batch)", "s"),
    ("timers/learner_update_timer", "mean time of the learner update", "s"),
    ("timers/synch_weights", "mean time of the weight sync to the runners", "s"),
    ("timers/evaluation", "mean time of an evaluation (eval_interval)", "s"),
    ("timers/engine_release", "mean time the engine beside the learner took to free its "
     "memory for the update (engine_sleep_level)", "s"),
    ("timers/rollout_dump", "mean time of writing a rollout dump (rollout_dump_interval)",
     "s"),
    ("timers/connectors/*", "mean time of each sample-batch connector (timed by RLlib's "
     "connector pipeline)", "s"),
    ("env_runners/rollout_time_s", "the runners' time sampling", "s"),
    ("env_runners/generated_tokens", "tokens the runners generated", "tokens"),
    ("env_runners/generated_tokens_per_s", "their generation rate", "tokens/s"),
    ("env_runners/prompt_tokens_reused", "prompt tokens taken from the engine's prefix "
     "cache instead of encoded", "tokens"),
    ("env_runners/num_groups_sampled_lifetime", "groups sampled so far", "groups"),
    ("env_runners/weights_load_s", "time a runner took to load new weights", "s"),
    ("learners/*/actor_learning_rate", "the actor's learning rate (logged by RLlib)", ""),
    ("learners/*/critic_learning_rate", "the critic's learning rate (logged by RLlib)", ""),
    ("env_runners/agents/*", "agent programs, per batch: how trajectories ended (agent_errors, "
     "agent_timeouts, agent_no_model_call, context_overflows, engine_failures, "
     "rewards_refused), the gateway's tool_parse_failures, max_tokens_clamped, "
     "stop_sequences, control_tokens_refused, body_timeouts, header_timeouts, "
     "connections_evicted and connections_refused, gateway_restarts, agents_killed, "
     "hung_threads and process_calls (agent_isolation), and segment_restarts_<why> "
     "(a request that did not continue the recorded ids: tools_changed, history_edited, "
     "answer_edited, template_rerendered)", "trajectories"),
    ("env_runners/weights_loaded_mid_sample", "weight loads inside a sample "
     "(partial_rollouts)", "loads"),
    ("env_runners/engine/releases", "times the engine beside the learner freed its memory "
     "for an update (engine_sleep_level), since the runner's previous sample", "releases"),
    ("env_runners/engine/sleeps_skipped", "releases that left the memory as it was (level 1 "
     "with the weights in host memory already, or an engine that cannot release it)",
     "releases"),
    ("env_runners/opponent/snapshots_kept", "snapshots of the trained weights the opponent "
     "policies draw from (policies with opponents)", "snapshots"),
    ("env_runners/opponent/snapshot_version_mean", "mean weight update of the snapshots "
     "the sample's opponents played (0: the start's weights)", "updates"),
    ("curriculum/stage", "the curriculum stage (its index in curriculum) of the sampling "
     "call that drew the batch", "stage"),
    # RLlib's own counters, which the project logs or tops up with its own meaning.
    ("num_env_steps_sampled_lifetime", "turns sampled so far (a turn is one env step)",
     "turns"),
    ("learners/*/num_module_steps_trained", "rows trained in the iteration, a row counted "
     "once per epoch (RLlib's counter, topped up for the epochs after the first)", "rows"),
    ("learners/*/num_module_steps_trained_lifetime", "the same, summed over the run",
     "rows"),
)  # fmt: skip

#: Every metric the driver logs, by key pattern ("*" is one key segment, or part of one).
RUN_METRICS: dict[str, Metric] = {
    **{
        f"{family}/{row[0]}": Metric(f"{family}/{row[0]}", *row[1:], "once", "none")
        for family in TRAJECTORY_FAMILIES
        for row in _TRAJECTORY_ROWS
    },
    **{row[0]: Metric(*row, "once", "none") for row in _RUN_ROWS},
}


@functools.lru_cache(maxsize=4096)  # every logging call checks its key, every iteration
def declared_metric(key: str) -> Metric | None:
    """The declaration of a result key (``rollout/lake/success_rate``,
    ``learners/default_policy/entropy``), or None."""
    parts = key.split("/")
    if parts[0] == "learners" and len(parts) == 3 and parts[2] in LEARNER_METRICS:
        return LEARNER_METRICS[parts[2]]
    for pattern, metric in RUN_METRICS.items():
        segments = pattern.split("/")
        if len(segments) == len(parts) and all(
            fnmatch.fnmatchcase(p, s) for p, s in zip(parts, segments, strict=True)
        ):
            return metric
    return None


#: Where a logger's results land in the algorithm's result: a runner's own logger
#: under RLlib's ENV_RUNNER_RESULTS, a learner's under LEARNER_RESULTS. The driver
#: merges those results as they come (:func:`run_aggregate`), their keys checked
#: where they were logged.
ENV_RUNNERS, LEARNERS = "env_runners", "learners"


def _key_path(*parts: str | tuple[str, ...] | None) -> str:
    """A result key as ``declared_metric`` reads it: the parts joined by "/"."""
    names: list[str] = []
    for part in parts:
        if part:
            names += [part] if isinstance(part, str) else list(part)
    return "/".join(names)


def _leaf_keys(values: dict, prefix: str) -> list[str]:
    """Every leaf of a (possibly nested) dict, as a full result key."""
    out = []
    for name, value in values.items():
        key = _key_path(prefix, str(name))
        out += _leaf_keys(value, key) if isinstance(value, dict) else [key]
    return out


def _check_declared(key: str) -> None:
    """Refuse an undeclared result key, saying where to declare it."""
    if declared_metric(key) is None:
        raise KeyError(
            f"metric {key!r} is not declared; add it to _RUN_ROWS (or _TRAJECTORY_ROWS "
            "for a batch statistic) in ragen_rllib/records/metrics.py"
        )


def run_log(
    metrics_logger, key: str | tuple[str, ...], value, *, under: str = "", **kwargs
) -> None:
    """``metrics_logger.log_value(key, value, **kwargs)`` (RLlib's reduce, window, ...)
    for a declared metric. ``under``: where the logger's results land in the
    algorithm's result (:data:`ENV_RUNNERS` for a runner's own logger), so that the
    full key is the one checked."""
    _check_declared(_key_path(under, key))
    metrics_logger.log_value(key, value, **kwargs)


def run_log_dict(
    metrics_logger,
    values: dict,
    *,
    key: str | tuple[str, ...] | None = None,
    under: str = "",
    **kwargs,
) -> None:
    """``metrics_logger.log_dict(values, key=key, **kwargs)``, every leaf declared
    (under ``key``, which prefixes them)."""
    for full in _leaf_keys(values, _key_path(under, key)):
        _check_declared(full)
    metrics_logger.log_dict(values, key=key, **kwargs)


def run_log_time(metrics_logger, key: str | tuple[str, ...], *, under: str = "", **kwargs):
    """``metrics_logger.log_time(key, **kwargs)`` (a context manager) for a declared timer."""
    _check_declared(_key_path(under, key))
    return metrics_logger.log_time(key, **kwargs)


def run_aggregate(metrics_logger, results: list[dict], *, key: str) -> None:
    """Merge the runners' or the learners' reduced results under ``key``: only those
    two, whose keys were checked where they were logged (:func:`run_log` with
    ``under=ENV_RUNNERS``, :func:`learner_log`)."""
    if key not in (ENV_RUNNERS, LEARNERS):
        raise KeyError(
            f"results merged under {key!r} are checked nowhere; log them with run_log "
            "(ragen_rllib/records/metrics.py)"
        )
    metrics_logger.aggregate(results, key=key)


def run_metrics_tables() -> str:
    """The markdown tables of the driver's declared metrics (docs/metrics.md)."""
    out = [f"Under each of {', '.join(f'`{f}/`' for f in TRAJECTORY_FAMILIES)}:", "",
           "| metric | what it is | unit |", "|---|---|---|"]  # fmt: skip
    out += [f"| `{r[0]}` | {r[1]} | {r[2] or '-'} |" for r in _TRAJECTORY_ROWS]
    out += [
        "",
        "The driver's other metrics:",
        "",
        "| metric | what it is | unit |",
        "|---|---|---|",
    ]
    out += [f"| `{r[0]}` | {r[1]} | {r[2] or '-'} |" for r in _RUN_ROWS]
    return "\n".join(out)
