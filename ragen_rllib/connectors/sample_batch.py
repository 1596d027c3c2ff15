"""Sample-batch connectors: what the driver does to a whole rollout batch before the update.

An RLlib ConnectorV2 pipeline that ``StarPO.training_step`` runs on every fresh
batch, before the batch is split between the learners, so that every group of
rollouts is still whole:

1. :class:`DropEnvErrorGroups`: the groups of trajectories whose env raised leave
   the update (or the run stops, past ``max_env_error_share``);
2. :class:`OverlongPenalty` (``overlong: penalty``): DAPO's soft penalty on
   answers that come within ``overlong_buffer`` tokens of ``max_new_tokens``;
3. :class:`RolloutFilter`: StarPO-S / RAGEN-2 rollout filtering by in-group reward
   spread;
4. :class:`GroupAdvantages`: the critic-free estimators' advantages, one per turn
   (estimators with a critic get theirs in :mod:`ragen_rllib.learner.connectors`,
   where the critic is; :mod:`ragen_rllib.maths.estimators` says why two stages).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from ray.rllib.connectors.connector_v2 import ConnectorV2

from ragen_rllib.maths.estimators import ESTIMATORS, AdvantageSettings, TurnBatch
from ragen_rllib.maths.filters import filter_groups
from ragen_rllib.records.metrics import run_log, run_log_dict
from ragen_rllib.records.trajectory import Trajectory, env_name


class EnvErrorBudgetExceeded(RuntimeError):
    """More of a batch failed in the env than ``max_env_error_share`` allows."""


class DropEnvErrorGroups(ConnectorV2):
    """Drops every group that holds a trajectory whose env raised in reset() or step(),
    or whose first prompt left no room for an answer (``context_overflow`` before any
    turn).

    A failed trajectory has no true return, and any stand-in value would bias its
    group's baseline, so the whole group leaves the update. When more than
    ``max_share`` of the batch failed, the run stops with an error instead.
    """

    def __init__(self, max_share: float, **kwargs):
        super().__init__(**kwargs)
        self.max_share = max_share

    def __call__(self, *, rl_module, batch, episodes: list[Trajectory], metrics=None, **kwargs):
        trajectories = episodes  # RLlib's name for them
        failed = [t for t in trajectories if t.unplayable]
        bad_groups = {t.group for t in failed}
        if metrics is not None:
            run_log(metrics, ("rollout", "env_error_groups_dropped"), len(bad_groups), window=1)
        if not failed:
            return batch
        share = len(failed) / len(trajectories)
        if share > self.max_share:
            first = failed[0]
            raise EnvErrorBudgetExceeded(
                f"{len(failed)} of {len(trajectories)} trajectories ({share:.0%}) could not be "
                f"played (an exception in the env, or a first prompt past max_context_tokens), "
                f"more than max_env_error_share={self.max_share}. First: env "
                f"{first.env_id!r}, seed {first.seed}: {first.error}"
            )
        trajectories[:] = [t for t in trajectories if t.group not in bad_groups]
        return batch


class OverlongPenalty(ConnectorV2):
    """DAPO's soft overlong penalty, added to each turn's reward: 0 for an answer of
    at most ``limit - buffer`` tokens, then falling linearly to ``-penalty`` at
    ``limit`` (``max_new_tokens``), the answers cut there included. It runs before
    the filter and the advantages, which see the penalised rewards; the rollout
    metrics (logged before this stage) keep the env's own."""

    def __init__(self, limit: int, buffer: int, penalty: float, **kwargs):
        super().__init__(**kwargs)
        self.limit, self.buffer, self.penalty = limit, buffer, penalty

    def turn_penalty(self, tokens: int) -> float:
        over = tokens - (self.limit - self.buffer)
        return -self.penalty * min(over, self.buffer) / self.buffer if over > 0 else 0.0

    def __call__(self, *, rl_module, batch, episodes: list[Trajectory], metrics=None, **kwargs):
        penalised, total = 0, 0.0
        for t in episodes:
            for k, (_, start, end) in enumerate(t.turn_spans[: t.num_turns]):
                value = self.turn_penalty(end - start)
                if value:
                    t.turn_rewards[k] += value
                    penalised, total = penalised + 1, total + value
        if metrics is not None:
            turns = max(1, sum(t.num_turns for t in episodes))
            run_log_dict(
                metrics,
                {"penalised_turn_share": penalised / turns, "penalty_mean": total / turns},
                key="overlong",
                window=1,
            )
        return batch


class RolloutFilter(ConnectorV2):
    """StarPO-S / RAGEN-2 rollout filtering: keep the groups whose rewards vary most
    (:func:`~ragen_rllib.maths.filters.filter_groups` says how), and log the kept
    share of trajectories, the groups kept, and the mean in-group reward std
    before and after."""

    def __init__(self, strategy, value, direction, include_zero, metric, scope="all", **kwargs):
        super().__init__(**kwargs)
        self.scope = scope  # "env": each env of a mixture is filtered on its own
        self.settings = {
            "strategy": strategy,
            "value": value,
            "direction": direction,
            "include_zero": include_zero,
            "metric": metric,
        }

    @property
    def keeps_everything(self) -> bool:
        s = self.settings
        return s["strategy"] == "top_k" and s["value"] >= 1.0 and s["include_zero"]

    def __call__(self, *, rl_module, batch, episodes: list[Trajectory], metrics=None, **kwargs):
        trajectories = episodes  # RLlib's name for them
        if self.keeps_everything or not trajectories:
            return batch
        parts: dict[str, list[Trajectory]] = {}
        for t in trajectories:
            parts.setdefault(env_name(t) if self.scope == "env" else "", []).append(t)
        kept: list[Trajectory] = []
        before = after = 0
        std_before = std_after = 0.0  # sums over groups
        for part in parts.values():
            rewards = np.array([t.total_reward for t in part])
            groups = np.array([t.group for t in part])
            result = filter_groups(rewards, groups, **self.settings)
            kept += [t for t, k in zip(part, result.keep.tolist(), strict=True) if k]
            before += result.groups_before
            after += result.groups_after
            std_before += result.std_before * result.groups_before
            std_after += result.std_after * result.groups_after
        if metrics is not None:
            run_log_dict(
                metrics,
                {
                    "kept_fraction": len(kept) / len(trajectories),
                    "groups_kept": after,
                    "groups_before": before,
                    "in_group_reward_std_before": std_before / max(1, before),
                    "in_group_reward_std_after": std_after / max(1, after),
                },
                key="filter",
                window=1,
            )
        kept_ids = {id(t) for t in kept}
        trajectories[:] = [t for t in trajectories if id(t) in kept_ids]  # in batch order
        return batch


def role_of(traj: Trajectory) -> tuple[str, Any]:
    """A trajectory's role: its env and, in a two-player game, its seat
    (``info["seat"]``)."""
    seat = traj.turn_infos[-1].get("seat") if traj.turn_infos else None
    return env_name(traj), seat


class GroupAdvantages(ConnectorV2):
    """Critic-free advantages from the whole batch: one per turn of every trajectory
    (``turn_advantages``), by the estimator's registry row
    (:mod:`ragen_rllib.maths.estimators`).

    A trajectory's reward is compared with a baseline group: the rollouts of its
    initial state (``grouping="state"``), those of its initial state at its seat of
    a two-player game (``"state_seat"``: in self-play the games of a group share
    their deal, so each seat is compared with itself in the same position), the
    whole batch (``"batch"``) or its env of the mixture (``"env"``).
    """

    def __init__(self, estimator: str, settings: AdvantageSettings, grouping: str = "state", **kw):
        super().__init__(**kw)
        self.estimator = ESTIMATORS[estimator]
        if self.estimator.needs_critic:
            raise ValueError(f"{estimator!r} needs a critic: its advantages are the learner's")
        self.settings, self.grouping = settings, grouping
        #: RAE's running baseline per (env, seat), kept across batches and in checkpoints
        self.role_baselines: dict[Any, float] = {}

    def get_state(self, *args, **kwargs) -> dict[str, Any]:
        """RAE's baselines as ``[env, seat, value]`` rows (empty for other estimators)."""
        if not self.role_baselines:
            return {}
        rows = [[env, seat, value] for (env, seat), value in self.role_baselines.items()]
        return {"role_baselines": rows}

    def set_state(self, state: dict[str, Any]) -> None:
        rows = state.get("role_baselines", [])
        self.role_baselines = {(env, seat): float(value) for env, seat, value in rows}

    def _baseline_groups(self, trajectories: list[Trajectory]) -> list[Any]:
        if self.grouping == "batch":
            return [0] * len(trajectories)
        if self.grouping == "env":
            return [env_name(t) for t in trajectories]
        if self.grouping == "state_seat":
            return [(t.group, role_of(t)[1]) for t in trajectories]
        return [t.group for t in trajectories]

    def __call__(self, *, rl_module, batch, episodes: list[Trajectory], **kwargs):
        trajectories = episodes  # RLlib's name for them
        if not trajectories:
            return batch
        inputs = TurnBatch(
            turn_rewards=[t.turn_rewards for t in trajectories],
            groups=[t.group for t in trajectories],
            baseline_groups=self._baseline_groups(trajectories),
            anchors=[t.turn_observations[: t.num_turns] for t in trajectories],
            turn_tokens=[[end - start for _, start, end in t.turn_spans] for t in trajectories],
            roles=[role_of(t) for t in trajectories],
            role_baselines=self.role_baselines,
        )
        per_turn = self.estimator.advantages(inputs, self.settings)
        for t, values in zip(trajectories, per_turn, strict=True):
            t.turn_advantages = [float(a) for a in values]
        return batch


def build_sample_pipeline(config) -> ConnectorPipelineV2:
    pieces: list[ConnectorV2] = [
        DropEnvErrorGroups(config.max_env_error_share),
    ]
    if config.overlong == "penalty":
        pieces.append(
            OverlongPenalty(config.max_new_tokens, config.overlong_buffer, config.overlong_penalty)
        )
    pieces += [
        RolloutFilter(
            config.filter_strategy,
            config.filter_value_used,
            config.filter_direction,
            config.filter_include_zero,
            config.filter_metric,
            config.filter_scope,
        ),
    ]
    if not config.uses_critic:
        pieces.append(
            GroupAdvantages(
                config.advantage_estimator,
                config.advantage_settings(),
                config.reward_norm_grouping,
            )
        )
    return ConnectorPipelineV2(connectors=pieces)
