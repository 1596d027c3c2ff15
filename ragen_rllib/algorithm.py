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

import functools
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
    WEIGHTS_SEQ_NO,
)

from .buffer import FreshnessBuffer
from .checkpoint import verify_checkpoint, write_manifest
from .config import StarPOConfig
from .connectors import build_sample_pipeline
from .context import Trajectory
from .core.batching import minibatch_plan, shard_trajectories
from .env_loading import import_env_modules
from .env_runner import seed_stream_base, training_group_seeds
from .metrics import rollout_metrics
from .weights import to_wire

logger = logging.getLogger(__name__)

LIFETIME_COUNTERS = (
    "num_trajectories",
    "num_turns",
    "num_generated_tokens",
    "num_env_errors",
    "num_runner_failures",
    "num_resampled_groups",
)


def _sample_share(runner, key: int, group_seeds: list[int], groups: list[int], sample_seed: int):
    """What a runner does for share ``key`` of an iteration's groups: sample, and hand
    back the runner's metrics with the trajectories (so that no second call has to
    queue behind a busy runner)."""
    start = time.perf_counter()
    trajs = runner.sample_groups(group_seeds, groups, sample_seed)
    return key, trajs, runner.get_metrics(), time.perf_counter() - start


@dataclass
class _SampleRequest:
    """One iteration's P groups in shares: key -> (seeds, group ids, sampling seed). A
    share's key is the runner it was first given to."""

    call: int
    shares: dict[int, tuple[list[int], list[int], int]]
    results: dict[int, list[Trajectory]] = field(default_factory=dict)


class RunnerFailure(RuntimeError):
    """A share of the groups could not be sampled by any env runner."""


class StarPO(Algorithm):
    """State-Thinking-Actions-Reward Policy Optimisation (StarPO / StarPO-S)."""

    @classmethod
    def get_default_config(cls) -> StarPOConfig:
        return StarPOConfig(cls)

    def setup(self, config) -> None:
        import_env_modules(config)  # a Tune trial runs in its own process
        super().setup(config)
        self._buffer = FreshnessBuffer(self.config.online_k, self.config.max_policy_lag)
        self._sample_stage = build_sample_pipeline(self.config)
        self._lifetime = dict.fromkeys(LIFETIME_COUNTERS, 0)
        # The training seed stream: the driver draws every iteration's P initial
        # states and hands the runners their shares, so the stream does not depend
        # on the number of runners, survives a runner's restart and is checkpointed.
        self._seed_base = seed_stream_base(self.config.seed)
        self._num_sample_calls = 0
        self._policy_version = 0  # learner updates so far: the weights version
        self._request: _SampleRequest | None = None
        self._last_step_end: float | None = None

    # ----- the iteration ----------------------------------------------------------
    def training_step(self) -> None:
        cfg = self.config
        step_start = time.perf_counter()
        waited = busy = 0.0
        if not self._buffer.has_fresh(self._policy_version):
            with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
                if self._request is None:
                    self._launch_sample()
                wait_start = time.perf_counter()
                trajs, busy = self._collect_sample()
                waited = time.perf_counter() - wait_start
            self.metrics.log_dict(rollout_metrics(trajs), key="rollout", window=1)
            self._count(trajs)
            self._sample_stage(rl_module=None, batch={}, episodes=trajs, metrics=self.metrics)
            self._buffer.add(trajs)
        batch = self._buffer.sample(policy_version=self._policy_version)
        if (
            cfg.async_rollouts
            and self._request is None
            and not self._buffer.has_fresh(self._policy_version + 1)
        ):
            # The next iteration needs a fresh batch: the runners sample it during
            # this update (not earlier, which would only make it staler).
            self._launch_sample()
        self._log_freshness(batch or [])
        update_s = sync_s = 0.0
        learners = max(1, cfg.num_learners)
        if batch and len(batch) >= learners:
            update_s, sync_s = self._update_and_sync(batch)
        else:  # every group dropped (env errors), filtered out or too stale
            # (With several learners each needs a trajectory: they meet in every pass.)
            logger.warning(
                "iteration %d: %d trajectories left to train on, %d learner(s) need at "
                "least one each; no update this iteration",
                self.iteration + 1,
                len(batch or []),
                learners,
            )
            self.metrics.log_value(("rollout", "empty_batches"), 1, reduce="sum")
        self._log_timing(step_start, waited, busy, update_s, sync_s)

        every = cfg.eval_interval
        if every and (self.training_iteration + 1) % every == 0:
            self.metrics.log_dict(self.evaluate_success(), key="evaluation", window=1)

    def _update_and_sync(self, batch: list[Trajectory]) -> tuple[float, float]:
        start = time.perf_counter()
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            results = self.learner_group.update(
                **self._plan_update(batch),
                num_epochs=self.config.num_epochs,
                minibatch_size=self.config.minibatch_size,
                shuffle_batch_per_epoch=self.config.shuffle_batch_per_epoch,
            )
            self.metrics.aggregate(results, key=LEARNER_RESULTS)
        self._policy_version += 1
        mid = time.perf_counter()
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            # Asynchronous: the weights queue behind the runners' current sample and
            # reach them before their next one; synchronous: wait until loaded.
            self._push_weights(wait=not self.config.async_rollouts)
        return mid - start, time.perf_counter() - mid

    def _plan_update(self, batch: list[Trajectory]) -> dict[str, Any]:
        """Cut the batch for the learners: whole trajectories per learner, balanced by
        tokens, and every epoch's minibatches (counted in trajectories) drawn from all
        shards, so that every learner steps the same number of times. One learner
        gets the trajectories themselves; several get one object-store reference
        each, which RLlib hands out one per learner."""
        cfg = self.config
        learners = max(1, cfg.num_learners)
        shards = shard_trajectories([t.num_tokens for t in batch], learners)
        plan = minibatch_plan(
            shards,
            cfg.minibatch_size,
            cfg.num_epochs,
            cfg.shuffle_batch_per_epoch,
            seed=int(cfg.seed or 0) * 1_000_003 + self._policy_version,
        )
        for t, ids in zip(batch, plan, strict=True):
            t.minibatch_ids = tuple(int(i) for i in ids)
        if learners == 1:
            return {"episodes": batch}
        return {"episodes_refs": [ray.put([batch[i] for i in shard]) for shard in shards]}

    # ----- sampling: the runners' shares ---------------------------------------------
    def _runner_ids(self) -> list[int]:
        """Remote runners that may take a share (empty with a local runner)."""
        if self.env_runner is not None:
            return []
        ids = sorted(self.env_runner_group.healthy_env_runner_ids())
        if not ids:
            raise RunnerFailure(
                "no healthy env runner is left (raise max_num_env_runner_restarts, or check "
                "the runners' logs for why they died)"
            )
        return ids

    def _launch_sample(self) -> None:
        """Draw this iteration's P initial states and start the runners on their shares."""
        cfg = self.config
        seeds, sample_seed = training_group_seeds(
            self._seed_base, self._num_sample_calls, cfg.env_groups
        )
        self._num_sample_calls += 1
        runners = self._runner_ids() or [0]
        parts = np.array_split(np.arange(cfg.env_groups), len(runners))
        shares = {
            rid: ([seeds[g] for g in part], [int(g) for g in part], sample_seed + rid)
            for rid, part in zip(runners, parts, strict=True)
            if len(part)
        }
        self._request = _SampleRequest(self._num_sample_calls - 1, shares)
        if self.env_runner is None:
            self._send(self._request, list(shares))

    def _send(self, request: _SampleRequest, keys: list[int], to: list[int] | None = None) -> None:
        """Start the shares ``keys`` (a share's key is the runner it was first given to)
        on the runners ``to`` (default: each share's own runner)."""
        for key, rid in zip(keys, to or keys, strict=True):
            seeds, groups, sample_seed = request.shares[key]
            made = self.env_runner_group.foreach_env_runner_async(
                functools.partial(
                    _sample_share,
                    key=key,
                    group_seeds=seeds,
                    groups=groups,
                    sample_seed=sample_seed,
                ),
                tag="sample",
                remote_worker_ids=[rid],
            )
            if not made:  # the runner died since the health check: handled on collect
                logger.warning("env runner %d took no sample request", rid)

    def _collect_sample(self) -> tuple[list[Trajectory], float]:
        """Wait for the pending request; re-sample the shares of runners that failed.
        Returns the trajectories and the runners' mean busy seconds for their shares."""
        request, self._request = self._request, None
        assert request is not None
        runner_metrics, busy_s = [], []
        if self.env_runner is not None:
            seeds, groups, sample_seed = request.shares[0]
            _, trajs, metrics, busy = _sample_share(self.env_runner, 0, seeds, groups, sample_seed)
            request.results[0] = trajs
            runner_metrics.append(metrics)
            busy_s.append(busy)
        else:
            group = self.env_runner_group
            for attempt in range(3):
                # A runner that dies drops its request (RLlib marks it unhealthy).
                while group.num_in_flight_async_reqs(tag="sample"):
                    ready = group.fetch_ready_async_reqs(tags="sample", timeout_seconds=1.0)
                    for _, (key, trajs, metrics, busy) in ready:
                        request.results[key] = trajs
                        runner_metrics.append(metrics)
                        busy_s.append(busy)
                missing = [key for key in request.shares if key not in request.results]
                if not missing:
                    break
                self._recover(request, missing, attempt)
            else:
                raise RunnerFailure(
                    f"the groups of runner share(s) {missing} could not be sampled after 3 "
                    "attempts: env runners keep failing (see their logs)"
                )
        if runner_metrics:
            self.metrics.aggregate(runner_metrics, key=ENV_RUNNER_RESULTS)
        trajs = [t for key in sorted(request.results) for t in request.results[key]]
        return trajs, sum(busy_s) / max(1, len(request.shares))

    def _recover(self, request: _SampleRequest, missing: list[int], attempt: int) -> None:
        """Runners died holding shares: count them, bring the runners back and re-sample."""
        groups = sum(len(request.shares[k][1]) for k in missing)
        logger.warning(
            "env runner share(s) %s of sample call %d failed (%d groups); re-sampling them "
            "(attempt %d)",
            missing,
            request.call,
            groups,
            attempt + 1,
        )
        self._lifetime["num_runner_failures"] += len(missing)
        self._lifetime["num_resampled_groups"] += groups
        self.restore_env_runners(self.env_runner_group)
        healthy = self._runner_ids()
        self._send(request, missing, to=[healthy[i % len(healthy)] for i in range(len(missing))])

    def restore_env_runners(self, env_runner_group) -> list[int]:
        """Restart failed runners (RLlib's fault tolerance) and give them the current weights."""
        if env_runner_group is not self.env_runner_group or self.env_runner is not None:
            return []
        restored = env_runner_group.probe_unhealthy_env_runners()
        if restored:
            logger.warning(
                "env runner(s) %s restarted; sending them weights %d",
                restored,
                self._policy_version,
            )
            self._push_weights(worker_ids=restored, wait=True)
        return restored

    def _push_weights(self, worker_ids: list[int] | None = None, wait: bool = True) -> None:
        """The actor's weights, stamped with their version, to the runners' engines."""
        state = self.learner_group.get_state(
            components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{DEFAULT_MODULE_ID}",
            inference_only=True,
        )[COMPONENT_LEARNER]
        if self.env_runner is not None:
            self.env_runner.set_state(
                {
                    COMPONENT_RL_MODULE: state[COMPONENT_RL_MODULE],
                    WEIGHTS_SEQ_NO: self._policy_version,
                }
            )
            return
        module_state = state[COMPONENT_RL_MODULE]
        module_state = module_state.get(DEFAULT_MODULE_ID, module_state)
        payload = {COMPONENT_RL_MODULE: to_wire(module_state), WEIGHTS_SEQ_NO: self._policy_version}
        # An earlier push still queued behind a sample lands first (one per runner).
        self._await_weight_pushes()
        self.env_runner_group.foreach_env_runner_async(
            "set_state",
            tag="weights",
            kwargs={"state": ray.put(payload)},
            remote_worker_ids=worker_ids,
        )
        if wait:
            self._await_weight_pushes()

    def _await_weight_pushes(self) -> None:
        group = self.env_runner_group
        while group.num_in_flight_async_reqs(tag="weights"):
            group.fetch_ready_async_reqs(tags="weights", timeout_seconds=1.0)

    # ----- metrics ------------------------------------------------------------------
    def _log_freshness(self, batch: list[Trajectory]) -> None:
        buf = self._buffer
        self.metrics.log_dict(
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

    def _log_timing(
        self, start: float, waited: float, busy: float, update_s: float, sync_s: float
    ) -> None:
        """Stage times and idle shares of this iteration (since the previous one ended)."""
        # The iteration's wall time: since the previous step ended (so the driver's
        # own work between steps counts), or since this one began for the first.
        now = time.perf_counter()
        prev, self._last_step_end = self._last_step_end, now
        span = now - (prev if prev is not None else start)
        self.metrics.log_dict(
            {
                "sample_wait_s": waited,
                "rollout_s": busy,
                "update_s": update_s,
                "sync_s": sync_s,
                "iteration_s": span,
                "learner_idle_share": max(0.0, 1 - update_s / span) if span > 0 else 0.0,
                "runner_idle_share": max(0.0, 1 - busy / span) if span > 0 else 0.0,
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
        self.metrics.log_dict(
            {f"{key}_lifetime": value for key, value in self._lifetime.items()},
            key="counters",
            window=1,
        )
        # A turn is one env step.
        self.metrics.log_value(
            NUM_ENV_STEPS_SAMPLED_LIFETIME, self._lifetime["num_turns"], window=1
        )

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
            lambda runner: runner.evaluate(*args)[0],
            local_env_runner=False,
            remote_worker_ids=self._runner_ids()[:1],
        )
        if not results:
            raise RunnerFailure("the env runner chosen for evaluation failed; see its log")
        return results[0]

    # ----- checkpoints --------------------------------------------------------------
    def get_state(self, *args, **kwargs) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        state["rollout_buffer"] = self._buffer.get_state()
        state["lifetime_counters"] = dict(self._lifetime)
        # A sample in flight is not saved: a restored run draws its seeds again.
        pending = self._request
        state["num_sample_calls"] = pending.call if pending else self._num_sample_calls
        state["policy_version"] = self._policy_version
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
        if "rollout_buffer" in state:
            self._buffer.set_state(state["rollout_buffer"])
        self._num_sample_calls = int(state.get("num_sample_calls", self._num_sample_calls))
        self._policy_version = int(state.get("policy_version", self._policy_version))
        self._request = None  # a sample in flight at save time is drawn again
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
