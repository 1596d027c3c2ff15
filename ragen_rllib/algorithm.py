"""StarPO: the RLlib Algorithm that alternates rollout and update stages.

One ``training_step``:

1. **rollout**: the env runners play P groups x N trajectories (fresh, or the
   buffered batch again while it has been used fewer than ``online_k`` times);
2. **sample-batch stage**: StarPO-S reward-std filtering and, for GRPO, the
   within-group score normalisation (:func:`~ragen_rllib.connectors.build_sample_pipeline`);
3. **update**: the learner group turns the trajectories into token tensors,
   computes advantages (learner connector) and takes ``num_epochs`` passes of
   ``minibatch_size``-trajectory gradient steps;
4. **sync**: the actor's new weights go to every runner's rollout engine,
   stamped with the learner's weights sequence number.

Metrics land in ``self.metrics`` (Tune results, TensorBoard) under
``rollout/``, ``filter/``, ``learners/``, ``env_runners/`` (rollout time,
generated tokens/s), ``counters/`` (lifetime totals, kept in checkpoints) and
``evaluation/``.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)

from .checkpoint import verify_checkpoint, write_manifest
from .config import StarPOConfig
from .connectors import build_sample_pipeline
from .context import Trajectory
from .env_loading import import_env_modules
from .metrics import rollout_metrics

logger = logging.getLogger(__name__)

LIFETIME_COUNTERS = ("num_trajectories", "num_turns", "num_generated_tokens", "num_env_errors")


class RolloutReuseBuffer:
    """Online-k: hands out the same rollout batch for ``k`` consecutive updates.

    ``k=1`` is fully on-policy. With ``k>1`` the stored log-probabilities
    grow stale as the policy moves; the PPO ratio corrects for that, and the
    batch is dropped after its ``k``-th use, which bounds the staleness.
    """

    def __init__(self, k: int):
        self.k = k
        self.batch: list[Trajectory] | None = None
        self.uses = 0

    def needs_fresh(self) -> bool:
        return self.batch is None or self.uses >= self.k

    def put(self, batch: list[Trajectory]) -> None:
        self.batch, self.uses = batch, 0

    def take(self) -> list[Trajectory]:
        assert self.batch is not None
        self.uses += 1
        return list(self.batch)

    def get_state(self) -> dict[str, Any]:
        return {"batch": self.batch, "uses": self.uses}

    def set_state(self, state: dict[str, Any]) -> None:
        self.batch, self.uses = state.get("batch"), int(state.get("uses", 0))


class StarPO(Algorithm):
    """State-Thinking-Actions-Reward Policy Optimisation (StarPO / StarPO-S)."""

    @classmethod
    def get_default_config(cls) -> StarPOConfig:
        return StarPOConfig(cls)

    def setup(self, config) -> None:
        import_env_modules(config)  # a Tune trial runs in its own process
        super().setup(config)
        self._reuse = RolloutReuseBuffer(self.config.online_k)
        self._sample_stage = build_sample_pipeline(self.config)
        self._lifetime = dict.fromkeys(LIFETIME_COUNTERS, 0)

    # ----- the iteration ----------------------------------------------------------
    def training_step(self) -> None:
        if self._reuse.needs_fresh():
            with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
                trajs = self._sample()
            self.metrics.log_dict(rollout_metrics(trajs), key="rollout", window=1)
            self._count(trajs)
            self._sample_stage(rl_module=None, batch={}, episodes=trajs, metrics=self.metrics)
            self._reuse.put(trajs)
        batch = self._reuse.take()
        self.metrics.log_value("rollout/batch_uses", self._reuse.uses, window=1)
        if batch:
            self._update_and_sync(batch)
        else:  # every group dropped (env errors) or filtered out
            logger.warning("iteration %d: no trajectory left to train on", self.iteration + 1)
            self.metrics.log_value(("rollout", "empty_batches"), 1, reduce="sum")

        every = self.config.eval_interval
        if every and (self.training_iteration + 1) % every == 0:
            self.metrics.log_dict(self.evaluate_success(), key="evaluation", window=1)

    def _update_and_sync(self, batch: list[Trajectory]) -> None:
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            results = self.learner_group.update(
                episodes=batch,
                num_epochs=self.config.num_epochs,
                minibatch_size=self.config.minibatch_size,
                shuffle_batch_per_epoch=self.config.shuffle_batch_per_epoch,
            )
            self.metrics.aggregate(results, key=LEARNER_RESULTS)

        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            self.env_runner_group.sync_weights(
                from_worker_or_learner_group=self.learner_group,
                policies=[DEFAULT_MODULE_ID],
                inference_only=True,
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
        self.metrics.log_dict(
            {f"{key}_lifetime": value for key, value in self._lifetime.items()},
            key="counters",
            window=1,
        )
        # A turn is one env step.
        self.metrics.log_value(
            NUM_ENV_STEPS_SAMPLED_LIFETIME, self._lifetime["num_turns"], window=1
        )

    def _sample(self) -> list[Trajectory]:
        if self.env_runner is not None:
            trajs = self.env_runner.sample()
            self.metrics.aggregate([self.env_runner.get_metrics()], key=ENV_RUNNER_RESULTS)
            return trajs
        # Remote runners: each plays its own seeds; renumber groups so they stay distinct.
        per_runner = self.env_runner_group.foreach_env_runner(
            lambda runner: runner.sample(), local_env_runner=False
        )
        runner_metrics = self.env_runner_group.foreach_env_runner(
            lambda runner: runner.get_metrics(), local_env_runner=False
        )
        self.metrics.aggregate(runner_metrics, key=ENV_RUNNER_RESULTS)
        trajs: list[Trajectory] = []
        for index, runner_trajs in enumerate(per_runner):
            for t in runner_trajs:
                t.group += index * self.config.env_groups
                trajs.append(t)
        return trajs

    # ----- evaluation ---------------------------------------------------------------
    def evaluate_success(
        self,
        num_states: int | None = None,
        temperature: float | None = None,
        first_seed: int | None = None,
    ) -> dict[str, float]:
        """Success and rewards on fixed initial states (the paper's protocol by default)."""
        cfg = self.config
        args = (
            num_states or cfg.eval_num_states,
            cfg.eval_seed if first_seed is None else first_seed,
            cfg.eval_temperature if temperature is None else temperature,
        )
        if self.env_runner is not None:
            metrics, _ = self.env_runner.evaluate(*args)
            return metrics
        results = self.env_runner_group.foreach_env_runner(
            lambda runner: runner.evaluate(*args)[0], local_env_runner=False, remote_worker_ids=[1]
        )
        return results[0]

    # ----- checkpoints --------------------------------------------------------------
    def get_state(self, *args, **kwargs) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        state["rollout_reuse_buffer"] = self._reuse.get_state()
        state["lifetime_counters"] = dict(self._lifetime)
        # Sampling and minibatch order draw from explicitly seeded generators; the
        # global ones are saved too, for anything (a user's env, say) that uses them.
        state["rng_states"] = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        }
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if "rollout_reuse_buffer" in state:
            self._reuse.set_state(state["rollout_reuse_buffer"])
        if "lifetime_counters" in state:
            self._lifetime.update(state["lifetime_counters"])
        if "rng_states" in state:
            random.setstate(state["rng_states"]["python"])
            np.random.set_state(state["rng_states"]["numpy"])
            torch.set_rng_state(state["rng_states"]["torch"])

    def save_to_path(self, *args, **kwargs) -> str:
        path = super().save_to_path(*args, **kwargs)
        write_manifest(path)  # sizes and hashes, checked before any restore
        return path

    def restore_from_path(self, path, *args, **kwargs) -> None:
        if kwargs.get("component") is None:
            verify_checkpoint(path)
        super().restore_from_path(path, *args, **kwargs)

    @classmethod
    def from_checkpoint(cls, path, *args, **kwargs):
        verify_checkpoint(path)  # before RLlib unpickles anything
        return super().from_checkpoint(path, *args, **kwargs)
