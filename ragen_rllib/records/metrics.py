"""Metric declarations: each metric's name, definition, unit, and how its values
reduce over a minibatch's micro-batches and over the learners.

One declaration serves every reader: the learner's logging (:func:`learner_log`
and :func:`~ragen_rllib.learner.loss.minibatch_logs`), the reduction over learners
(RLlib merges what each learner logged by the reduction declared here), and the
generated table in ``docs/metrics.md`` (:func:`metrics_table`, kept current by the
suite). This module declares the learners' metrics (``learners/<module id>/``).

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
    ("entropy", "token-mean entropy of the policy on the response tokens", "nats"),
    ("response_tokens", "response tokens of the minibatch, all learners together", "tokens"),
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
