"""StarPO: the RLlib Algorithm whose training step alternates rollout and update.

One ``training_step``, read top to bottom:

1. **rollout**: the env runners play P groups x N trajectories (fresh, or the
   buffered batch again while it has been used fewer than ``online_k`` times);
2. **sample-batch stage**: env-error groups dropped, StarPO-S rollout filtering
   and the critic-free estimators' advantages
   (:func:`~ragen_rllib.connectors.sample_batch.build_sample_pipeline`);
3. **update**: the batch is cut into one shard per learner; each learner turns its
   trajectories into token tensors, computes the critic's advantages (learner
   connectors) and takes ``num_epochs`` passes of gradient steps, the same number
   of minibatches on every learner;
4. **sync**: the actor's new weights go to every runner's rollout engine,
   stamped with the new policy version;
5. **evaluation**, every ``eval_interval`` iterations.

The other jobs are mixins, each in its own module: the driver's work with the env
runners (:mod:`.sampling`), what is logged and the collapse guard
(:mod:`.run_metrics`), evaluation (:mod:`.evaluation`) and the checkpoint's state
(:mod:`.run_state`). The config is :mod:`.config` (its knobs declared once each in
``config/knobs_*.py``); :class:`StarPOConfig`, at the end of this file, only adds
the algorithm class.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import time
from typing import Any

import ray
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.utils.metrics import (
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)

from ragen_rllib.algorithms.starpo.buffer import FreshnessBuffer
from ragen_rllib.algorithms.starpo.collapse import CollapseWatch
from ragen_rllib.algorithms.starpo.config.starpo_config import StarPOConfigBase
from ragen_rllib.algorithms.starpo.evaluation import EvaluationMixin
from ragen_rllib.algorithms.starpo.rollout_dump import RolloutDumper, dump_due
from ragen_rllib.algorithms.starpo.run_metrics import LIFETIME_COUNTERS, RunMetricsMixin, StepTimes
from ragen_rllib.algorithms.starpo.run_state import CheckpointStateMixin
from ragen_rllib.algorithms.starpo.sampling import SampleRequest, SamplingMixin
from ragen_rllib.connectors.sample_batch import build_sample_pipeline
from ragen_rllib.distributed.host_memory import trim_host_heap
from ragen_rllib.env_choice.env_loading import import_env_modules
from ragen_rllib.env_choice.env_mix import format_of, mix_entries
from ragen_rllib.env_runner.curriculum import parse_curriculum
from ragen_rllib.maths.batching import num_minibatches, shard_trajectories
from ragen_rllib.maths.seeding import mix_seed
from ragen_rllib.records.metrics import run_aggregate, run_log, run_log_dict, run_log_time
from ragen_rllib.records.trajectory import Trajectory
from ragen_rllib.warmup.format_warmup import model_path

logger = logging.getLogger(__name__)


class StarPO(SamplingMixin, RunMetricsMixin, EvaluationMixin, CheckpointStateMixin, Algorithm):
    """State-Thinking-Actions-Reward Policy Optimisation (StarPO / StarPO-S)."""

    @classmethod
    def get_default_config(cls) -> StarPOConfig:
        return StarPOConfig(cls)

    def __repr__(self) -> str:
        # Ray prefixes the trial's log lines with this: name the agent, not the unused env.
        text = super().__repr__()
        agent = getattr(self.config, "agent", None)
        short = str(agent).rsplit("/", 1)[-1]  # a file path: its file name
        return text.replace(f"env={self.config.env}", f"agent={short}") if agent else text

    def setup(self, config) -> None:
        import_env_modules(config)  # a Tune trial runs in its own process
        # The format warm-up (format_warmup_steps) trains here, once, before the learner
        # and the runner actors load the model; they find it in the cache.
        model_path(config)
        gc.collect()  # the warm-up's model and optimizer, should a cycle hold them
        trim_host_heap()  # then what they held goes back
        super().setup(config)
        self._buffer = FreshnessBuffer(self.config.online_k, self.config.max_policy_lag)
        self._sample_stage = build_sample_pipeline(self.config)
        self._mix = mix_entries(self.config)
        self._lifetime = dict.fromkeys(LIFETIME_COUNTERS, 0)
        # The training seed stream: the driver draws every iteration's P initial
        # states and hands the runners their shares, so the stream does not depend
        # on the number of runners, survives a runner's restart and is checkpointed.
        self._seed_base = mix_seed(self.config.seed)
        self._num_sample_calls = 0
        self._curriculum = parse_curriculum(self.config.curriculum)
        self._policy_version = 0  # learner updates so far
        self._request: SampleRequest | None = None
        self._last_step_end: float | None = None
        self._collapse = CollapseWatch(self.config)
        self._dumper = None
        if self.config.rollout_dump_interval:
            self._dumper = RolloutDumper(
                os.path.join(self.trial_dir, "rollouts"),
                run=self.trial_name,
                system=format_of(mix_entries(self.config)[0], self.config).system,
                seed=mix_seed(self.config.seed, 2),
            )

    @property
    def trial_dir(self) -> str:
        """The trial's folder in Tune's storage path (beside result.json and the
        checkpoints) when that is a local folder; else the trial's working folder."""
        storage = getattr(self, "_storage", None)
        if storage is not None and getattr(storage.storage_filesystem, "type_name", "") == "local":
            return storage.trial_fs_path
        return self.logdir

    def _maybe_dump(self, sampled: list[Trajectory], kept: list[Trajectory]) -> None:
        iteration = self.training_iteration + 1
        cfg = self.config
        if self._dumper is None or not dump_due(iteration, cfg.rollout_dump_interval, cfg.online_k):
            return
        with run_log_time(self.metrics, (TIMERS, "rollout_dump")):
            self._dumper.dump(sampled, kept, iteration, self._policy_version)

    def cleanup(self) -> None:
        if self._dumper is not None:
            self._dumper.close()
        super().cleanup()

    # ----- the iteration ----------------------------------------------------------
    def training_step(self) -> None:
        cfg = self.config
        times = StepTimes(start=time.perf_counter())
        if not self._buffer.has_fresh(self._policy_version):
            trajs = self._sample_batch_stage(self._sample_fresh(times))
            if cfg.dynamic_sampling_groups:
                trajs = self._fill_with_spread(trajs, times)
            self._buffer.add(trajs)
        batch = self._buffer.sample(policy_version=self._policy_version) or []
        if (
            cfg.async_rollouts
            and self._request is None
            and not self._buffer.has_fresh(self._policy_version + 1)
        ):
            # The next iteration needs a fresh batch: the runners sample it during
            # this update (not earlier, which would only make it staler).
            self._launch_sample()
        self._log_freshness(batch)
        learners = max(1, cfg.num_learners)
        if batch and self._no_signal(batch):
            # No policy-gradient signal in the whole batch: no optimizer step at all.
            run_log(self.metrics, ("rollout", "zero_advantage_batches"), 1, reduce="sum")
        elif len(batch) >= learners:
            times.update, times.sync = self._update_and_sync(batch)
            self._watch_for_collapse()
        else:  # every group dropped (env errors), filtered out or too stale
            # (With several learners each needs a trajectory: they meet in every pass.)
            logger.warning(
                "iteration %d: %d trajectories left to train on, %d learner(s) need at "
                "least one each; no update this iteration",
                self.iteration + 1,
                len(batch),
                learners,
            )
            run_log(self.metrics, ("rollout", "empty_batches"), 1, reduce="sum")
        self._log_timing(times)
        if cfg.eval_interval and (self.training_iteration + 1) % cfg.eval_interval == 0:
            with run_log_time(self.metrics, (TIMERS, "evaluation")):
                run_log_dict(self.metrics, self.evaluate_all(), key="evaluation", window=1)

    def _sample_fresh(self, times: StepTimes) -> list[Trajectory]:
        """The runners' next batch (launched now unless already in flight), logged."""
        with run_log_time(self.metrics, (TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            if self._request is None:
                self._launch_sample()
            wait_start = time.perf_counter()
            trajs, times.busy = self._collect_sample()
            times.waited = time.perf_counter() - wait_start
        self._log_rollout(trajs)
        return trajs

    def _sample_batch_stage(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """Env-error groups dropped, rollout filtering and the critic-free advantages
        (the sample-batch connector), with the batch dumped when due."""
        sampled = list(trajs)  # the stage filters in place
        self._sample_stage(rl_module=None, batch={}, episodes=trajs, metrics=self.metrics)
        self._maybe_dump(sampled, trajs)
        return trajs

    def _fill_with_spread(self, kept: list[Trajectory], times: StepTimes) -> list[Trajectory]:
        """DAPO's dynamic sampling: the kept groups with spread, topped up from
        up to ``dynamic_sampling_max_calls`` more sampling calls (each through the
        whole sample-batch stage, filter included; its metrics are the first call's)
        until ``dynamic_sampling_groups`` such groups are held; the first that many
        are trained on. Groups without spread (``dynamic_sampling_spread``) leave the
        batch; those left out for a non-finite reward are counted."""
        cfg = self.config
        rule = (cfg.dynamic_sampling_spread, cfg.dynamic_sampling_reward_tol)
        groups, nonfinite = groups_with_spread(kept, *rule)
        calls = 0
        while len(groups) < cfg.dynamic_sampling_groups and calls < cfg.dynamic_sampling_max_calls:
            calls += 1
            self._launch_sample()
            more, busy = self._collect_sample()
            times.busy += busy
            self._lifetime["num_dynamic_sampling_calls"] += 1
            self._count(more)  # logs the lifetime counters
            for t in more:  # group ids stay unique within the batch
                t.group += calls * cfg.env_groups
            self._sample_stage(rl_module=None, batch={}, episodes=more, metrics=None)
            more_groups, more_nonfinite = groups_with_spread(more, *rule)
            groups += more_groups
            nonfinite += more_nonfinite
        held = len(groups)
        if not held and cfg.dynamic_sampling_spread == "success":
            logger.warning(
                "iteration %d: dynamic sampling kept no group: in %d sampling calls no "
                "group had both successes and failures (an env without info['success'] "
                "counts a positive reward as success); with graded rewards set "
                "dynamic_sampling_spread: reward",
                self.iteration + 1,
                calls + 1,
            )
        run_log_dict(
            self.metrics,
            {"extra_calls": calls, "groups_with_spread": held,
             "nonfinite_groups": nonfinite,
             "short": int(held < cfg.dynamic_sampling_groups)},
            key="dynamic_sampling",
            window=1,
        )  # fmt: skip
        return [t for group in groups[: cfg.dynamic_sampling_groups] for t in group]

    def _no_signal(self, batch: list[Trajectory]) -> bool:
        """skip_zero_advantage_updates, critic-free, and every advantage 0."""
        cfg = self.config
        return (
            cfg.skip_zero_advantage_updates
            and not cfg.uses_critic
            and not any(a != 0.0 for t in batch for a in t.turn_advantages)
        )

    def step(self) -> dict[str, Any]:
        results = super().step()
        if self._collapse.stop_requested:  # collapse_guard "stop": Tune ends the trial
            results["done"] = True
        return results

    def _update_and_sync(self, batch: list[Trajectory]) -> tuple[float, float]:
        start = time.perf_counter()
        if self.env_runner is not None and self.env_runner.engine.sleep_level:
            # The engine beside the learner frees its memory for the update; the
            # weights pushed after it wake the engine (engine_sleep_level).
            with run_log_time(self.metrics, (TIMERS, "engine_release")):
                self.env_runner.release_engine()
        with run_log_time(self.metrics, (TIMERS, LEARNER_UPDATE_TIMER)):
            results = self.learner_group.update(
                **self._shard(batch),
                num_epochs=self.config.num_epochs,
                minibatch_size=self.config.minibatch_size,
                shuffle_batch_per_epoch=self.config.shuffle_batch_per_epoch,
                plan_seed=mix_seed(self.config.seed, self._policy_version),
            )
            run_aggregate(self.metrics, results, key=LEARNER_RESULTS)
        self._policy_version += 1
        mid = time.perf_counter()
        with run_log_time(self.metrics, (TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            # Asynchronous: the weights queue behind the runners' current sample and
            # reach them before their next one; synchronous: wait until loaded.
            self._push_weights(wait=not self.config.async_rollouts)
        return mid - start, time.perf_counter() - mid

    def _shard(self, batch: list[Trajectory]) -> dict[str, Any]:
        """Cut the batch for the learners: whole trajectories per learner, balanced by
        tokens, and how many minibatches an epoch has (the same on every learner, so
        that they step together). One learner gets the trajectories themselves;
        several get one object-store reference each, which RLlib hands out one per
        learner."""
        cfg = self.config
        learners = max(1, cfg.num_learners)
        shards = shard_trajectories([t.num_tokens for t in batch], learners)
        steps = num_minibatches([len(s) for s in shards], cfg.minibatch_size)
        if learners == 1:
            return {"episodes": batch, "minibatches_per_epoch": steps}
        return {
            "episodes_refs": [ray.put([batch[i] for i in shard]) for shard in shards],
            "minibatches_per_epoch": steps,
        }


def groups_with_spread(
    trajs: list[Trajectory], spread: str = "success", reward_tol: float = 1e-6
) -> tuple[list[list[Trajectory]], int]:
    """The groups (in batch order) that carry a learning signal for dynamic sampling,
    and how many groups were left out for a non-finite total reward.

    ``spread="success"`` (DAPO's rule): some of the group's trajectories succeeded and
    some did not. ``spread="reward"``: the group's total rewards span more than
    ``reward_tol``. Under either rule a group with a NaN or infinite total reward has no
    spread (its advantages would be undefined).
    """
    groups: dict[int, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.group, []).append(t)
    kept, nonfinite = [], 0
    for g in groups.values():
        rewards = [t.total_reward for t in g]
        if not all(math.isfinite(r) for r in rewards):
            nonfinite += 1
        elif spread == "success":
            if len({bool(t.success) for t in g}) > 1:
                kept.append(g)
        elif max(rewards) - min(rewards) > reward_tol:
            kept.append(g)
    return kept, nonfinite


class StarPOConfig(StarPOConfigBase):
    """StarPO's config (:class:`~.config.starpo_config.StarPOConfigBase`), building
    :class:`StarPO` unless told another algorithm class."""

    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or StarPO)
