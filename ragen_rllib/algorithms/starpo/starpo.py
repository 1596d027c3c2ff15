"""StarPO and StarPOConfig: the RLlib Algorithm that alternates rollout and update
stages, and its config.

The two live in one file, as RLlib keeps its own algorithms (``ppo.py``), so that
neither imports the other; that is why this file is longer than the others. The
knobs are in :mod:`~ragen_rllib.algorithms.starpo.defaults`, their checks in
:mod:`~ragen_rllib.algorithms.starpo.config_checks`, and the driver's work with
the env runners in :mod:`~ragen_rllib.algorithms.starpo.sampling`.

One ``training_step``:

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
   stamped with the new policy version.

Metrics land in ``self.metrics`` (Tune results, TensorBoard) under
``rollout/``, ``filter/``, ``learners/``, ``env_runners/`` (rollout time,
generated tokens/s), ``counters/`` (lifetime totals, kept in checkpoints),
``collapse/`` (diversity, the early warning's EMAs and ``warning``) and
``evaluation/``.
"""

from __future__ import annotations

import logging
import os
import random
import time
from typing import Any

import numpy as np
import ray
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.utils.metrics import (
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)

from ragen_rllib.algorithms.starpo import config_checks
from ragen_rllib.algorithms.starpo.buffer import FreshnessBuffer
from ragen_rllib.algorithms.starpo.checkpoint import verify_checkpoint, write_manifest
from ragen_rllib.algorithms.starpo.collapse import CollapseWatch, diversity_metrics
from ragen_rllib.algorithms.starpo.defaults import STARPO_DEFAULTS
from ragen_rllib.algorithms.starpo.rollout_dump import RolloutDumper, dump_due
from ragen_rllib.algorithms.starpo.sampling import RunnerFailure, SampleRequest, SamplingMixin
from ragen_rllib.connectors.learner import build_learner_pipeline
from ragen_rllib.connectors.sample_batch import build_sample_pipeline
from ragen_rllib.distributed.learner_group import build_learner_group
from ragen_rllib.env_runner.curriculum import parse_curriculum
from ragen_rllib.env_runner.env_loading import import_env_modules
from ragen_rllib.env_runner.env_mix import format_of, mix_entries
from ragen_rllib.env_runner.eval_suites import EvalEnv, resolve_suites
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
from ragen_rllib.env_runner.metrics import by_env, mean_over_envs, rollout_metrics
from ragen_rllib.env_runner.trajectory import Trajectory
from ragen_rllib.env_runner.warmup import model_path
from ragen_rllib.learner.starpo_learner import StarPOTorchLearner
from ragen_rllib.maths.batching import num_minibatches, shard_trajectories
from ragen_rllib.maths.estimators import ESTIMATORS, AdvantageSettings, Estimator
from ragen_rllib.maths.seeding import mix_seed
from ragen_rllib.rl_module.llm_rl_module import LLMRLModule

logger = logging.getLogger(__name__)

LIFETIME_COUNTERS = (
    "num_trajectories",
    "num_turns",
    "num_generated_tokens",
    "num_env_errors",
    "num_runner_failures",
    "num_resampled_groups",
    "num_runner_restarts",
)


class StarPOConfig(AlgorithmConfig):
    """Configuration of the StarPO algorithm: RLlib's settings plus every knob of
    :data:`~ragen_rllib.algorithms.starpo.defaults.STARPO_DEFAULTS` (one documented
    line each). The fluent ``.environment()``, ``.training()`` and
    ``.env_runners()`` calls work; an experiment file's flat ``config:`` mapping is
    read with :meth:`from_user_dict`."""

    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or StarPO)
        for key, value in STARPO_DEFAULTS.items():
            setattr(self, key, value)
        # RLlib knobs with the paper's values.
        self.lr = 1e-6  # actor learning rate (paper 1e-6)
        self.gamma = 1.0  # paper 1.0
        self.grad_clip = 1.0  # paper 1.0
        self.grad_clip_by = "global_norm"
        self.minibatch_size = 32  # trajectories per gradient step (paper 32)
        self.num_epochs = 1  # passes over a rollout batch per update (paper 1)
        self.num_env_runners = 0  # one runner in the driver; raise for remote runners
        self.num_learners = 0
        self.env_runner_cls = LLMEnvRunner
        # No sync of the runners' states after every iteration (as RLlib's IMPALA):
        # the runners hold no connector state and the driver keeps the counters, and
        # the sync is a blocking call on every runner, which queues behind the
        # runner's sample and weight load when sampling is asynchronous (measured:
        # bench/bench_async.py --device-time; the weights go by _push_weights).
        self._dont_auto_sync_env_runner_states = True
        self.env = "ragen/SimpleSokoban-v0"

    def training(self, **kwargs: Any) -> StarPOConfig:
        """RLlib's ``training()`` plus every StarPO knob, e.g. ``.training(group_size=8)``.

        An unknown keyword raises TypeError, as RLlib's own ``training()`` does.
        """
        ours = {key: kwargs.pop(key) for key in list(kwargs) if key in STARPO_DEFAULTS}
        if "lambda" in kwargs:
            ours["lambda_"] = kwargs.pop("lambda")
        super().training(**kwargs)
        for key, value in ours.items():
            setattr(self, key, value)
        return self

    @classmethod
    def from_user_dict(cls, config: dict[str, Any]) -> StarPOConfig:
        """A config from a flat dict (YAML ``config:`` section); an unknown key is an
        error naming close matches (see ``config_checks.config_from_user_dict``)."""
        return config_checks.config_from_user_dict(cls, config)

    # ----- RLlib extension points -------------------------------------------------
    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=LLMRLModule, model_config=self.llm_module_config())

    def get_default_learner_class(self):
        return StarPOTorchLearner

    def build_learner_group(self, **kwargs):
        """RLlib's, with a LearnerGroup that gathers FSDP learners' state from all of them."""
        return build_learner_group(self, **kwargs)

    def build_learner_connector(self, input_observation_space, input_action_space, device=None):
        return build_learner_pipeline(self, device)

    # ----- derived settings ---------------------------------------------------------
    @property
    def estimator(self) -> Estimator:
        """The advantage estimator's registry row."""
        return ESTIMATORS[self.advantage_estimator]

    @property
    def uses_critic(self) -> bool:
        return self.estimator.needs_critic

    @property
    def reward_norm_method_used(self) -> str | None:
        """``reward_norm_method``, or the estimator's own when that is null."""
        if self.reward_norm_method is not None:
            return self.reward_norm_method
        return self.estimator.default_reward_norm

    @property
    def loss_agg_used(self) -> str:
        """``loss_agg``, or the estimator's own when that is null."""
        return self.loss_agg if self.loss_agg is not None else self.estimator.default_loss_agg

    @property
    def loss_norm_tokens(self) -> int:
        """seq-mean-token-sum-norm's constant: the most tokens one training sequence can
        generate (a turn's with a context window, a whole trajectory's without)."""
        turns = 1 if self.context_window is not None else self.max_turns
        return self.max_new_tokens * turns

    def advantage_settings(self) -> AdvantageSettings:
        """The knobs the advantage estimators read."""
        return AdvantageSettings(
            reward_norm=self.reward_norm_method_used,
            gamma=self.gamma,
            lam=self.lambda_,
            reward_level=self.reward_level,
            gamma_turn=self.gamma_turn,
            lambda_turn=self.lambda_turn,
            gamma_token=self.gamma_token,
            lambda_token=self.lambda_token,
            gigpo_gamma=self.gigpo_gamma,
            gigpo_step_weight=self.gigpo_step_weight,
        )

    @property
    def filter_value_used(self) -> float:
        """The filter strategy's value: ``filter_value``, or for top_k when that is null,
        ``filter_keep_ratio``."""
        if self.filter_value is None and self.filter_strategy == "top_k":
            return self.filter_keep_ratio
        return self.filter_value

    @property
    def filter_keeps_everything(self) -> bool:
        return (
            self.filter_strategy == "top_k"
            and self.filter_value_used >= 1.0
            and self.filter_include_zero
        )

    def llm_module_config(self) -> dict[str, Any]:
        return {
            "model_path": model_path(self),
            "dtype": self.model_dtype,
            "critic": self.uses_critic,
            "temperature": self.temperature,
            "gradient_checkpointing": self.gradient_checkpointing,
            "pack_sequences": self.pack_sequences,
            "lora": self.lora_settings(),
        }

    def lora_settings(self) -> dict[str, Any] | None:
        """The LoRA settings as the module and the rollout actors take them (None: off)."""
        if not self.lora_rank:
            return None
        target = self.lora_target_modules
        return {
            "rank": self.lora_rank,
            "alpha": self.lora_alpha,
            "dropout": self.lora_dropout,
            "target_modules": target if isinstance(target, str) else list(target),
        }

    # ----- checks -------------------------------------------------------------------
    def check(self) -> None:
        """Raise ValueError (or FileNotFoundError for a model path) on any bad value."""
        self.check_values()
        self.check_model()

    def check_values(self) -> None:
        """Every check but the model's (``llm``): cheap, and raises ValueError naming the key."""
        config_checks.check_values(self)

    def check_model(self) -> None:
        """Resolve ``llm``; a missing local path, or a hub id that cannot be loaded within
        seconds, raises FileNotFoundError."""
        config_checks.check_model(self)

    def validate(self) -> None:
        if self.in_evaluation:
            # RLlib's derived evaluation config (its own runner counts); StarPO
            # evaluates through its training runners (StarPO.evaluate_success).
            super().validate()
            return
        # Remote runners do all the sampling: no idle runner in the driver.
        self.create_local_env_runner = self.num_env_runners == 0
        super().validate()
        self.check()


class StarPO(SamplingMixin, Algorithm):
    """State-Thinking-Actions-Reward Policy Optimisation (StarPO / StarPO-S)."""

    @classmethod
    def get_default_config(cls) -> StarPOConfig:
        return StarPOConfig(cls)

    def setup(self, config) -> None:
        import_env_modules(config)  # a Tune trial runs in its own process
        # The format warm-up (format_warmup_steps) trains here, once, before the learner
        # and the runner actors load the model; they find it in the cache.
        model_path(config)
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
        with self.metrics.log_time((TIMERS, "rollout_dump")):
            self._dumper.dump(sampled, kept, iteration, self._policy_version)

    def cleanup(self) -> None:
        if self._dumper is not None:
            self._dumper.close()
        super().cleanup()

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
            if len(self._mix) > 1:  # every rollout metric per env of the mixture too
                for name, part in by_env(trajs).items():
                    self.metrics.log_dict(rollout_metrics(part), key=("rollout", name), window=1)
            self.metrics.log_dict(diversity_metrics(trajs), key="collapse", window=1)
            every = cfg.collapse_metrics_interval
            if every and self.training_iteration % every == 0:
                iteration = self.training_iteration + 1
                info = self._collapse.information(self.learner_group, trajs, iteration)
                self.metrics.log_dict(info, key="collapse", window=1)
            self._count(trajs)
            sampled = list(trajs)  # the stage filters in place
            self._sample_stage(rl_module=None, batch={}, episodes=trajs, metrics=self.metrics)
            self._maybe_dump(sampled, trajs)
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
        if (
            batch
            and cfg.skip_zero_advantage_updates
            and not cfg.uses_critic
            and not any(a != 0.0 for t in batch for a in t.turn_advantages)
        ):
            # No policy-gradient signal in the whole batch: no optimizer step at all.
            self.metrics.log_value(("rollout", "zero_advantage_batches"), 1, reduce="sum")
        elif batch and len(batch) >= learners:
            update_s, sync_s = self._update_and_sync(batch)
            self._watch_for_collapse()
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
            with self.metrics.log_time((TIMERS, "evaluation")):
                results = {**self.evaluate_success(), **self.evaluate_suites()}
            self.metrics.log_dict(results, key="evaluation", window=1)

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
        self.metrics.log_dict(metrics, key="collapse", window=1)
        if reason is None:
            return
        iteration = self.training_iteration + 1
        logger.warning("iteration %d: collapse warning: %s", iteration, reason)
        if self.config.collapse_guard == "checkpoint":
            path = os.path.join(self.trial_dir, f"checkpoint_collapse_warning_{iteration:06d}")
            self.save_to_path(path)
            logger.warning("collapse guard: checkpoint saved to %s", path)

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
            with self.metrics.log_time((TIMERS, "engine_release")):
                self.env_runner.release_engine()
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            results = self.learner_group.update(
                **self._shard(batch),
                num_epochs=self.config.num_epochs,
                minibatch_size=self.config.minibatch_size,
                shuffle_batch_per_epoch=self.config.shuffle_batch_per_epoch,
                plan_seed=mix_seed(self.config.seed, self._policy_version),
            )
            self.metrics.aggregate(results, key=LEARNER_RESULTS)
        self._policy_version += 1
        mid = time.perf_counter()
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
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
        env: EvalEnv | None = None,
        trajectories: list | None = None,
    ) -> dict[str, float]:
        """Success, pass@k and rewards on fixed initial states of the training env, or
        of a suite's ``env`` (the paper's protocol by default). With a mixture: each
        env's metrics under its name, and their mean over the envs. The trajectories
        are appended to ``trajectories`` when it is given."""
        cfg = self.config
        if env is None and len(self._mix) > 1:
            kwargs = {
                "num_states": num_states,
                "temperature": temperature,
                "trajectories": trajectories,
            }
            per_env = {
                e.name: self.evaluate_success(first_seed=first_seed, env=e, **kwargs)
                for e in self._mix
            }
            return {**mean_over_envs(per_env), **per_env}
        args = (
            num_states or cfg.eval_num_states,
            cfg.eval_seed if first_seed is None else first_seed,
            cfg.eval_temperature if temperature is None else temperature,
            env,
            cfg.eval_samples_per_state,
            tuple(cfg.eval_pass_k),
        )
        keep = trajectories is not None
        if self.env_runner is not None:
            metrics, trajs = self.env_runner.evaluate(*args)
        else:

            def run(runner):  # the trajectories cross to the driver only when kept
                metrics, trajs = runner.evaluate(*args)
                return metrics, (trajs if keep else [])

            results = self.env_runner_group.foreach_env_runner(
                run,
                local_env_runner=False,
                remote_worker_ids=self._runner_ids()[:1],
            )
            if not results:
                raise RunnerFailure("the env runner chosen for evaluation failed; see its log")
            metrics, trajs = results[0]
        if keep:
            trajectories.extend(trajs)
        return metrics

    def evaluate_suites(
        self, suites: dict[str, list[EvalEnv]] | None = None, **kwargs
    ) -> dict[str, dict[str, dict[str, float]]]:
        """:meth:`evaluate_success` on every env of every suite (the configured
        ``eval_suites`` by default): suite -> env name -> metrics."""
        suites = resolve_suites(self.config) if suites is None else suites
        return {
            suite: {entry.name: self.evaluate_success(env=entry, **kwargs) for entry in envs}
            for suite, envs in suites.items()
        }

    # ----- checkpoints --------------------------------------------------------------
    def get_state(self, *args, **kwargs) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        state["rollout_buffer"] = self._buffer.get_state()
        state["lifetime_counters"] = dict(self._lifetime)
        # A sample in flight is not saved: a restored run draws its seeds again.
        pending = self._request
        state["num_sample_calls"] = pending.call if pending else self._num_sample_calls
        state["policy_version"] = self._policy_version
        state["collapse_warning"] = self._collapse.get_state()
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
        if "collapse_warning" in state:
            self._collapse.set_state(state["collapse_warning"])
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
