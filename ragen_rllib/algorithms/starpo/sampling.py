"""How StarPO's driver works with its env runners: groups out, trajectories and weights.

A mixin of :class:`~ragen_rllib.algorithms.starpo.starpo.StarPO`. Every iteration's
P initial states are drawn on the driver (from one seed stream, so the draw does
not depend on how many runners there are, survives a runner's restart and is
checkpointed) and split into shares, one per healthy remote runner, sampled
asynchronously (:meth:`SamplingMixin._launch_sample`, then
:meth:`SamplingMixin._collect_sample`). A runner that dies holding a share is
counted, restarted through RLlib's fault tolerance, given the current weights,
and its share is sampled again with the same seeds, so every batch is whole.
Ray restarts a runner lost with its node on another node that has the resources
one runner asks for; when no alive node has them, the algorithm does not wait for
a restart that cannot happen: it goes on with the runners it has, or, with none
left, stops with an error naming the resources (:mod:`ragen_rllib.distributed.cluster`).
After each update the actor's weights, stamped with their policy version, go
to every runner's engine through Ray's object store (:meth:`SamplingMixin._push_weights`);
with ``partial_rollouts`` they are also posted where a runner that is mid-sample
loads them at its next turn boundary
(:class:`~ragen_rllib.distributed.mailbox.WeightMailbox`).
With ``num_env_runners: 0`` the one runner lives in the driver and is called
directly.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import ray
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, WEIGHTS_SEQ_NO

from ragen_rllib.distributed.cluster import no_runner_host
from ragen_rllib.distributed.mailbox import WeightMailbox
from ragen_rllib.distributed.wire import to_wire
from ragen_rllib.env_runner.curriculum import stage_at
from ragen_rllib.maths.seeding import training_group_seeds
from ragen_rllib.records.metrics import run_aggregate, run_log
from ragen_rllib.records.trajectory import Trajectory

logger = logging.getLogger(__name__)


def _sample_share(
    runner,
    key: int,
    group_seeds: list[int],
    groups: list[int],
    sample_seed: int,
    reset_options: dict | None = None,
):
    """What a runner does for share ``key`` of an iteration's groups: sample, and hand
    back the runner's metrics with the trajectories (so that no second call has to
    queue behind a busy runner)."""
    start = time.perf_counter()
    # Without a curriculum the call is the one a runner subclass written before
    # reset options existed overrides.
    extra = () if reset_options is None else (reset_options,)
    trajs = runner.sample_groups(group_seeds, groups, sample_seed, *extra)
    return key, trajs, runner.get_metrics(), time.perf_counter() - start


@dataclass
class SampleRequest:
    """One iteration's P groups in shares: key -> (seeds, group ids, sampling seed). A
    share's key is the runner it was first given to."""

    call: int
    shares: dict[int, tuple[list[int], list[int], int]]
    reset_options: dict | None = None  # the curriculum stage's, for every env
    results: dict[int, list[Trajectory]] = field(default_factory=dict)


class RunnerFailure(RuntimeError):
    """A share of the groups could not be sampled by any env runner."""


class SamplingMixin:
    """The driver's side of sampling (see the module docstring). Expects the
    algorithm's ``config``, ``env_runner``, ``env_runner_group``, ``learner_group``,
    ``metrics``, and its ``_seed_base``, ``_num_sample_calls``, ``_request``,
    ``_policy_version`` and ``_lifetime`` counters, and its parsed ``_curriculum``."""

    def setup(self, config) -> None:
        """Refuse runner actors that no node of the cluster could hold before RLlib
        starts them (Ray would keep them pending, and the build would wait forever)."""
        cfg = self.config
        if cfg.num_env_runners and not cfg.in_evaluation:
            if not ray.is_initialized():
                ray.init()  # what RLlib's first remote call would do
            problem = no_runner_host(cfg)
            if problem:
                raise ValueError(f"num_env_runners={cfg.num_env_runners}: {problem}")
        super().setup(config)
        self._mailbox = None
        if cfg.partial_rollouts:  # newer weights, for the runners to load between turns
            self._mailbox = WeightMailbox.remote()
            self._give_mailbox()

    def _give_mailbox(self, worker_ids: list[int] | None = None) -> None:
        mailbox = self._mailbox
        self.env_runner_group.foreach_env_runner(
            lambda runner: runner.set_mailbox(mailbox),
            remote_worker_ids=worker_ids,
            local_env_runner=False,
        )

    # ----- sampling: the runners' shares ---------------------------------------------
    def _runner_ids(self) -> list[int]:
        """Remote runners that may take a share (empty with a local runner)."""
        if self.env_runner is not None:
            return []
        ids = sorted(self.env_runner_group.healthy_env_runner_ids())
        if not ids:
            problem = no_runner_host(self.config)
            raise RunnerFailure(
                f"no healthy env runner is left: {problem}"
                if problem
                else "no healthy env runner is left (raise max_num_env_runner_restarts, or "
                "check the runners' logs for why they died)"
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
        call = self._num_sample_calls - 1
        _, options = stage_at(self._curriculum, call)
        self._request = SampleRequest(call, shares, reset_options=options)
        if self.env_runner is None:
            self._send(self._request, list(shares))

    def _send(self, request: SampleRequest, keys: list[int], to: list[int] | None = None) -> None:
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
                    reset_options=request.reset_options,
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
            _, trajs, metrics, busy = _sample_share(
                self.env_runner, 0, seeds, groups, sample_seed, request.reset_options
            )
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
            run_aggregate(self.metrics, runner_metrics, key=ENV_RUNNER_RESULTS)
        if self._curriculum:  # the stage of the call that drew this batch
            stage, _ = stage_at(self._curriculum, request.call)
            run_log(self.metrics, ("curriculum", "stage"), stage, window=1)
        trajs = [t for key in sorted(request.results) for t in request.results[key]]
        return trajs, sum(busy_s) / max(1, len(request.shares))

    def _recover(self, request: SampleRequest, missing: list[int], attempt: int) -> None:
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
        if not self._lost_runners_have_a_node(env_runner_group):
            return []
        restored = env_runner_group.probe_unhealthy_env_runners()
        if restored:
            self._lifetime["num_runner_restarts"] += len(restored)
            logger.warning(
                "env runner(s) %s restarted; sending them weights %d",
                restored,
                self._policy_version,
            )
            self._push_weights(worker_ids=restored, wait=True)
            if self._mailbox is not None:
                self._give_mailbox(restored)
        return restored

    def _lost_runners_have_a_node(self, group) -> bool:
        """Whether probing lost runners is worth its wait: False when some runners are
        lost and no alive node has the resources one needs (Ray keeps their restarts
        pending until such a node joins, so the probe would only sit out
        ``env_runner_health_probe_timeout_s``); the healthy runners take every share
        meanwhile. With no healthy runner left either, raise :class:`RunnerFailure`."""
        healthy = group.num_healthy_remote_env_runners()
        if healthy == group.num_remote_env_runners():
            return True
        problem = no_runner_host(self.config)
        if problem is None:
            return True
        if not healthy:
            raise RunnerFailure(f"every env runner is lost, and {problem}")
        logger.warning(
            "%d env runner(s) lost cannot be restarted yet (%s); %d healthy runner(s) take "
            "every share until a node with the resources joins",
            group.num_remote_env_runners() - healthy,
            problem,
            healthy,
        )
        return False

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
        ref = ray.put(payload)
        if self._mailbox is not None:  # partial rollouts: loaded between turns if sooner
            self._mailbox.post.remote(self._policy_version, [ref])
        self.env_runner_group.foreach_env_runner_async(
            "set_state",
            tag="weights",
            kwargs={"state": ref},
            remote_worker_ids=worker_ids,
        )
        if wait:
            self._await_weight_pushes()

    def _await_weight_pushes(self) -> None:
        group = self.env_runner_group
        while group.num_in_flight_async_reqs(tag="weights"):
            group.fetch_ready_async_reqs(tags="weights", timeout_seconds=1.0)
