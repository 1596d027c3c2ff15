"""What StarPO logs each iteration, and the collapse guard that reads it.

A mixin of :class:`~ragen_rllib.algorithms.starpo.starpo.StarPO`. Metrics land in
``self.metrics`` (Tune results, TensorBoard) under ``rollout/`` (per env of a
mixture too), ``collapse/`` (diversity, prompt-reasoning information, the early
warning's EMAs and ``warning``), ``counters/`` (lifetime totals, kept in
checkpoints) and ``timing/`` (stage times and idle shares). The guard feeds each
update's signals to :class:`~ragen_rllib.algorithms.starpo.collapse.CollapseWatch`
and acts as ``collapse_guard`` says.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import numpy as np
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import LEARNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME

from ragen_rllib.algorithms.starpo.collapse import diversity_metrics
from ragen_rllib.env_runner.metrics import by_env, rollout_metrics
from ragen_rllib.records.metrics import run_log, run_log_dict
from ragen_rllib.records.trajectory import Trajectory

logger = logging.getLogger(__name__)

LIFETIME_COUNTERS = (
    "num_trajectories",
    "num_turns",
    "num_generated_tokens",
    "num_env_errors",
    "num_runner_failures",
    "num_resampled_groups",
    "num_runner_restarts",
    "num_dynamic_sampling_calls",
)


@dataclass
class StepTimes:
    """One iteration's stage times, in seconds."""

    start: float
    waited: float = 0.0  # the driver waiting for the runners' sample
    busy: float = 0.0  # the runners sampling
    update: float = 0.0
    sync: float = 0.0


class RunMetricsMixin:
    """The iteration's logging (every method only logs, or counts)."""

    def _log_rollout(self, trajs: list[Trajectory]) -> None:
        """A fresh batch's rollout, diversity and (every collapse_metrics_interval)
        information metrics, and the lifetime counters."""
        run_log_dict(self.metrics, rollout_metrics(trajs), key="rollout", window=1)
        if len(self._mix) > 1:  # every rollout metric per env of the mixture too
            for name, part in by_env(trajs).items():
                run_log_dict(self.metrics, rollout_metrics(part), key=("rollout", name), window=1)
        run_log_dict(self.metrics, diversity_metrics(trajs), key="collapse", window=1)
        every = self.config.collapse_metrics_interval
        if every and self.training_iteration % every == 0:
            iteration = self.training_iteration + 1
            info = self._collapse.information(self.learner_group, trajs, iteration)
            run_log_dict(self.metrics, info, key="collapse", window=1)
        self._count(trajs)

    def _log_freshness(self, batch: list[Trajectory]) -> None:
        buf = self._buffer
        run_log_dict(
            self.metrics,
            {
                "batch_uses": max((t.uses for t in batch), default=0),
                "policy_lag_mean": float(np.mean([t.policy_lag for t in batch])) if batch else 0.0,
                "policy_lag_max": max((t.policy_lag for t in batch), default=0),
                "dropped_stale_lifetime": buf.num_dropped_stale,
                "batches_held": len(buf),
                "policy_version": self._policy_version,
            },
            key="rollout",
            window=1,
        )

    def _log_timing(self, times: StepTimes) -> None:
        """Stage times and idle shares of this iteration (since the previous one ended)."""
        # The iteration's wall time: since the previous step ended (so the driver's
        # own work between steps counts), or since this one began for the first.
        now = time.perf_counter()
        prev, self._last_step_end = self._last_step_end, now
        span = now - (prev if prev is not None else times.start)
        run_log_dict(
            self.metrics,
            {
                "sample_wait_s": times.waited,
                "rollout_s": times.busy,
                "update_s": times.update,
                "sync_s": times.sync,
                "iteration_s": span,
                "learner_idle_share": max(0.0, 1 - times.update / span) if span > 0 else 0.0,
                "runner_idle_share": max(0.0, 1 - times.busy / span) if span > 0 else 0.0,
            },
            key="timing",
            window=1,
        )

    def _count(self, trajs: list[Trajectory]) -> None:
        """Lifetime counters: kept in the algorithm's state, so they survive a restore."""
        counts = {
            "num_trajectories": len(trajs),
            "num_turns": sum(t.num_turns for t in trajs),
            "num_generated_tokens": sum(t.response_tokens for t in trajs),
            "num_env_errors": sum(t.end_reason == "env_error" for t in trajs),
        }
        for key, value in counts.items():
            self._lifetime[key] += value
        run_log_dict(
            self.metrics,
            {f"{key}_lifetime": value for key, value in self._lifetime.items()},
            key="counters",
            window=1,
        )
        # A turn is one env step.
        run_log(self.metrics, NUM_ENV_STEPS_SAMPLED_LIFETIME, self._lifetime["num_turns"], window=1)

    def _watch_for_collapse(self) -> None:
        """Feed this update's signals to the early warning; log it, and act on it as
        ``collapse_guard`` says (see :mod:`~ragen_rllib.algorithms.starpo.collapse`)."""

        def peek(*key) -> float:
            value = self.metrics.peek(key, default=None)
            return float("nan") if value is None else float(value)

        learner = (LEARNER_RESULTS, DEFAULT_MODULE_ID)
        metrics, reason = self._collapse.observe(
            peek("rollout", "in_group_reward_std"),
            peek(*learner, "approx_kl"),
            peek(*learner, "gradients_actor_global_norm"),
            peek(*learner, "entropy"),
        )
        run_log_dict(self.metrics, metrics, key="collapse", window=1)
        if reason is None:
            return
        iteration = self.training_iteration + 1
        logger.warning("iteration %d: collapse warning: %s", iteration, reason)
        if self.config.collapse_guard == "checkpoint":
            path = os.path.join(self.trial_dir, f"checkpoint_collapse_warning_{iteration:06d}")
            self.save_to_path(path)
            logger.warning("collapse guard: checkpoint saved to %s", path)
