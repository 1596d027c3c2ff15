"""Connector pieces between the env runners and the learner's loss.

Two stages, each an RLlib ConnectorV2 pipeline:

* the **sample-batch stage** (driver side, in ``StarPO.training_step``), which
  sees the whole rollout batch and only needs rewards: dropping the groups
  of trajectories whose env failed (:class:`DropEnvErrorGroups`), StarPO-S
  uncertainty filtering (:class:`RolloutFilter`) and the critic-free
  advantages of GRPO and GiGPO (:class:`GroupAdvantages`). Running it before the
  batch is split across learners keeps every group whole.
* the **learner stage** (inside each Learner): :class:`TrajectoriesToBatch`
  pads the token sequences into tensors, :class:`ComputeAdvantages` places the
  rewards on tokens and computes advantages (GAE and bi-level GAE query the
  critic through the RL module).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core import DEFAULT_MODULE_ID

from .context import Trajectory
from .core import advantages as adv
from .core.filters import filter_groups


class EnvErrorBudgetExceeded(RuntimeError):
    """More of a batch failed in the env than ``max_env_error_share`` allows."""


class DropEnvErrorGroups(ConnectorV2):
    """Drops every group that holds a trajectory whose env raised in reset() or step().

    A failed trajectory has no true return, and any stand-in value would bias its
    group's baseline, so the whole group leaves the update. When more than
    ``max_share`` of the batch failed, the run stops with an error instead.
    """

    def __init__(self, max_share: float, **kwargs):
        super().__init__(**kwargs)
        self.max_share = max_share

    def __call__(self, *, rl_module, batch, episodes: list[Trajectory], metrics=None, **kwargs):
        failed = [t for t in episodes if t.end_reason == "env_error"]
        bad_groups = {t.group for t in failed}
        if metrics is not None:
            metrics.log_value(("rollout", "env_error_groups_dropped"), len(bad_groups), window=1)
        if not failed:
            return batch
        share = len(failed) / len(episodes)
        if share > self.max_share:
            first = failed[0]
            raise EnvErrorBudgetExceeded(
                f"{len(failed)} of {len(episodes)} trajectories ({share:.0%}) hit an exception "
                f"in the env, more than max_env_error_share={self.max_share}. First: env "
                f"{first.env_id!r}, seed {first.seed}: {first.error}"
            )
        episodes[:] = [t for t in episodes if t.group not in bad_groups]
        return batch


class RolloutFilter(ConnectorV2):
    """StarPO-S / RAGEN-2 rollout filtering: keep the groups whose rewards vary most
    (:func:`~ragen_rllib.core.filters.filter_groups` says how), and log the kept
    share of trajectories, the groups kept, and the mean in-group reward std
    before and after."""

    def __init__(self, strategy, value, direction, include_zero, metric, **kwargs):
        super().__init__(**kwargs)
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
        if self.keeps_everything or not episodes:
            return batch
        rewards = np.array([t.total_reward for t in episodes])
        groups = np.array([t.group for t in episodes])
        result = filter_groups(rewards, groups, **self.settings)
        kept = [t for t, k in zip(episodes, result.keep.tolist(), strict=True) if k]
        if metrics is not None:
            metrics.log_dict(
                {
                    "kept_fraction": len(kept) / len(episodes),
                    "groups_kept": result.groups_after,
                    "groups_before": result.groups_before,
                    "in_group_std_before": result.std_before,
                    "in_group_std_after": result.std_after,
                },
                key="filter",
                window=1,
            )
        episodes[:] = kept
        return batch


class GroupAdvantages(ConnectorV2):
    """Critic-free advantages from the whole batch, one per turn (``turn_advantages``).

    ``R`` is a trajectory's total reward, relative to a baseline group by
    :func:`~ragen_rllib.core.advantages.group_normalize` with ``method``; the
    groups are the rollouts of one initial state (``grouping="state"``), the
    whole batch (``"batch"``) or one env id (``"env"``).

    * ``"grpo"``, ``"dr_grpo"``: normalised ``R`` on every turn (Dr. GRPO with
      ``method="mean"``; its loss aggregation is the learner's business);
    * ``"rloo"``: ``R`` against the leave-one-out mean of its group;
    * ``"reinforce_pp_baseline"``: ``R`` minus its group's mean, on every turn,
      then whitened over the batch's generated tokens;
    * ``"reinforce_pp"``: each turn's discounted return (``gamma``, per turn),
      whitened over the batch's generated tokens (no group baseline);
    * ``"gigpo"``: the episode advantage plus ``step_weight`` times a step
      advantage among the group's turns that start from the same observation
      (:func:`~ragen_rllib.core.advantages.gigpo_advantages`).
    """

    def __init__(
        self,
        estimator: str,
        method: str = "mean_std",
        grouping: str = "state",
        gamma: float = 1.0,
        gigpo_gamma: float = 0.95,
        step_weight: float = 1.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.estimator, self.method, self.grouping = estimator, method, grouping
        self.gamma, self.gigpo_gamma, self.step_weight = gamma, gigpo_gamma, step_weight

    def _baseline_groups(self, episodes: list[Trajectory]) -> list[Any]:
        if self.grouping == "batch":
            return [0] * len(episodes)
        if self.grouping == "env":
            return [t.env_id for t in episodes]
        return [t.group for t in episodes]

    def __call__(self, *, rl_module, batch, episodes: list[Trajectory], **kwargs):
        if not episodes:
            return batch
        groups = self._baseline_groups(episodes)
        if self.estimator == "gigpo":
            per_turn = adv.gigpo_advantages(
                [t.turn_rewards for t in episodes],
                [t.group for t in episodes],
                [t.turn_observations[: t.num_turns] for t in episodes],
                gamma=self.gigpo_gamma,
                step_weight=self.step_weight,
                norm=self.method,
                episode_groups=groups,
            )
        elif self.estimator == "reinforce_pp":
            per_turn = adv.discounted_turn_returns([t.turn_rewards for t in episodes], self.gamma)
        else:
            scores = torch.tensor([t.total_reward for t in episodes], dtype=torch.float64)
            ids = torch.tensor(adv.ids_of(groups))
            normed = adv.group_normalize(
                scores, ids, self.method, leave_one_out=self.estimator == "rloo"
            ).tolist()
            per_turn = [[a] * t.num_turns for a, t in zip(normed, episodes, strict=True)]
        if self.estimator in ("reinforce_pp", "reinforce_pp_baseline"):
            tokens = [[end - start for _, start, end in t.turn_spans] for t in episodes]
            per_turn = adv.whiten_turns(per_turn, tokens)
        for t, values in zip(episodes, per_turn, strict=True):
            t.turn_advantages = [float(a) for a in values]
        return batch


def build_sample_pipeline(config) -> ConnectorPipelineV2:
    pieces: list[ConnectorV2] = [
        DropEnvErrorGroups(config.max_env_error_share),
        RolloutFilter(
            config.filter_strategy,
            config.filter_value_used,
            config.filter_direction,
            config.filter_include_zero,
            config.filter_metric,
        ),
    ]
    if not config.uses_critic:
        pieces.append(
            GroupAdvantages(
                config.advantage_estimator,
                config.reward_norm_method_used,
                config.reward_norm_grouping,
                config.gamma,
                config.gigpo_gamma,
                config.gigpo_step_weight,
            )
        )
    return ConnectorPipelineV2(connectors=pieces)


#: Per-trajectory columns: read by ComputeAdvantages and removed there, so that every
#: column the learner's minibatches see has one row per training sequence.
TRAJECTORY_COLUMNS = (
    "stream_index",
    "stream_turn",
    "turn_end_index",
    "turn_rewards",
    "turn_advantages",
)


class TrajectoriesToBatch(ConnectorV2):
    """Right-pad every training sequence (segment) of the trajectories into [R, T] rows.

    Row columns: ``input_ids``, ``attention_mask``, ``response_mask`` (1 on generated
    tokens), ``old_logp`` and ``row_trajectory`` (the row's trajectory, so that the
    minibatches keep a trajectory's rows together), and ``row_minibatch``  # [R, epochs]
    when the algorithm planned the update's minibatches. Per-trajectory columns for the
    advantage estimators: ``stream_index``  # [B, L], the flat [R * T] position of each of
    the trajectory's generated tokens in order (its "response stream", -1 as padding),
    ``stream_turn``  # [B, L], the turn of each stream token (-1 as padding),
    ``turn_end_index``  # [B, K], each turn's last token in that stream (-1: none),
    ``turn_rewards`` and ``turn_advantages``  # [B, K] (the latter from the sample stage).
    """

    def __call__(self, *, rl_module, batch, episodes: list[Trajectory], **kwargs):
        segments = [(b, seg) for b, t in enumerate(episodes) for seg in t.segments]
        rows, width = len(segments), max(len(seg) for _, seg in segments)
        turns = max(max(t.num_turns for t in episodes), 1)
        stream = max(max(t.response_tokens for t in episodes), 1)
        cols: dict[str, Any] = {
            "input_ids": np.zeros((rows, width), np.int64),
            "attention_mask": np.zeros((rows, width), np.int64),
            "response_mask": np.zeros((rows, width), np.float32),
            "old_logp": np.zeros((rows, width), np.float32),
            "row_trajectory": np.array([b for b, _ in segments], np.int64),
            "stream_index": np.full((len(episodes), stream), -1, np.int64),
            "turn_end_index": np.full((len(episodes), turns), -1, np.int64),
            "stream_turn": np.full((len(episodes), stream), -1, np.int64),
            "turn_rewards": np.zeros((len(episodes), turns), np.float32),
            "turn_advantages": np.zeros((len(episodes), turns), np.float32),
        }
        for r, (_, seg) in enumerate(segments):
            length = len(seg)
            cols["input_ids"][r, :length] = seg.input_ids
            cols["attention_mask"][r, :length] = 1
            cols["response_mask"][r, :length] = seg.loss_mask
            cols["old_logp"][r, :length] = seg.logprobs
        first_row = 0
        for b, t in enumerate(episodes):
            pos = 0
            for k, (seg, start, end) in enumerate(t.turn_spans):
                flat = (first_row + seg) * width  # the row's first token, flattened
                span = np.arange(flat + start, flat + end)
                cols["stream_index"][b, pos : pos + len(span)] = span
                cols["stream_turn"][b, pos : pos + len(span)] = k
                pos += end - start
                # A turn whose answer is empty has no token to carry its reward.
                cols["turn_end_index"][b, k] = pos - 1 if end > start else -1
            cols["turn_rewards"][b, : t.num_turns] = t.turn_rewards
            cols["turn_advantages"][b, : len(t.turn_advantages)] = t.turn_advantages
            first_row += len(t.segments)
        if episodes and all(t.minibatch_ids for t in episodes):
            cols["row_minibatch"] = np.array(
                [episodes[b].minibatch_ids for b, _ in segments], np.int64
            )  # [R, epochs]
        batch[DEFAULT_MODULE_ID] = cols
        return batch


def to_stream(x: torch.Tensor, stream_index: torch.Tensor) -> torch.Tensor:
    """Row tokens  # [R, T] -> each trajectory's response stream  # [B, L] (0 as padding)."""
    flat = x.reshape(-1)
    return torch.where(stream_index >= 0, flat[stream_index.clamp_min(0)], flat.new_zeros(()))


def from_stream(x: torch.Tensor, stream_index: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Response streams  # [B, L] -> row tokens of ``shape``  # [R, T] (0 off the streams)."""
    out = x.new_zeros(shape.numel() + 1)  # the spare last slot takes the padding
    spare = torch.full_like(stream_index, shape.numel())
    out[torch.where(stream_index >= 0, stream_index, spare).reshape(-1)] = x.reshape(-1)
    return out[:-1].reshape(shape)


class ComputeAdvantages(ConnectorV2):
    """Token rewards, then advantages and value targets for the loss.

    The estimators run on each trajectory's response stream (its generated tokens
    in order, across turns and segments), so they give the same result whether a
    trajectory is one sequence or one sequence per turn; the results are then
    placed back on the rows.
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.estimator = config.advantage_estimator
        self.uses_critic = config.uses_critic
        self.reward_level = config.reward_level
        self.gamma, self.lam = config.gamma, config.lambda_
        self.turn_gae = (
            config.gamma_turn,
            config.lambda_turn,
            config.gamma_token,
            config.lambda_token,
        )
        self.whiten = config.whiten_advantages
        self.max_tokens = config.max_tokens_per_microbatch

    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        cols = batch[DEFAULT_MODULE_ID]
        per_traj = {key: torch.from_numpy(cols.pop(key)) for key in TRAJECTORY_COLUMNS}
        mask = torch.from_numpy(cols["response_mask"])  # [R, T]
        index = per_traj["stream_index"]  # [B, L]
        if not self.uses_critic:  # the sample stage gave every turn its advantage
            turn = per_traj["stream_turn"]  # [B, L]
            stream_adv = per_traj["turn_advantages"].gather(1, turn.clamp_min(0))  # [B, L]
            stream_adv = torch.where(turn >= 0, stream_adv, torch.zeros_like(stream_adv))
            a = from_stream(stream_adv, index, mask.shape)
            cols["advantages"] = a.numpy().astype(np.float32)
            return batch
        module = rl_module[DEFAULT_MODULE_ID] if DEFAULT_MODULE_ID in rl_module else rl_module
        module = module.unwrapped() if hasattr(module, "unwrapped") else module
        device = next(module.parameters()).device
        values = critic_values(
            module, cols["input_ids"], cols["attention_mask"], device, self.max_tokens
        )  # [R, T]
        values = values * mask
        stream_mask = (index >= 0).float()  # [B, L]
        stream_values = to_stream(values, index)  # [B, L]
        turn_end, turn_rewards = per_traj["turn_end_index"], per_traj["turn_rewards"]
        if self.estimator == "gae":
            rewards = adv.token_rewards(turn_end, turn_rewards, index.shape[1], self.reward_level)
            advantages, returns = adv.gae(rewards, stream_values, stream_mask, self.gamma, self.lam)
        else:
            g_turn, l_turn, g_tok, l_tok = self.turn_gae
            advantages, returns = adv.bilevel_gae(
                turn_rewards, stream_values, turn_end, stream_mask, g_turn, l_turn, g_tok, l_tok
            )
        if self.whiten:  # over the whole batch, also when learners hold parts of it
            from .fsdp import summed_over_learners

            advantages = adv.masked_whiten(
                advantages, stream_mask, reduce_sum=lambda t: summed_over_learners(t, device)
            )
        cols["advantages"] = from_stream(advantages, index, mask.shape).numpy().astype(np.float32)
        cols["value_targets"] = from_stream(returns, index, mask.shape).numpy().astype(np.float32)
        cols["old_values"] = values.numpy().astype(np.float32)
        return batch


def critic_values(module, input_ids, attention_mask, device, max_tokens) -> torch.Tensor:
    """The critic's values for a [R, T] batch, in micro-batches of at most
    ``max_tokens`` padded tokens (None: one pass)  # -> [R, T] fp32 on the CPU."""
    from .core.batching import fill_plan, microbatch_rows, take_rows
    from .fsdp import agreed_count, is_sharded

    ids, attn = torch.from_numpy(input_ids), torch.from_numpy(attention_mask)
    out = torch.zeros(ids.shape, dtype=torch.float32)
    plan = microbatch_rows(attn.sum(1).tolist(), max_tokens)
    if any(is_sharded(p) for p in module.parameters()):
        # FSDP: each forward gathers the critic's layers from all learners, which must
        # therefore run as many passes as the learner with the most.
        plan = fill_plan(plan, agreed_count(len(plan), device))
    with torch.no_grad():
        for rows in plan:
            part = take_rows({"input_ids": ids, "attention_mask": attn}, rows or [0])
            values = module.compute_values({k: v.to(device) for k, v in part.items()})
            if rows:
                out[torch.as_tensor(rows), : values.shape[1]] = values.float().cpu()
    return out


class ToTensors(ConnectorV2):
    """Last piece: numpy columns to torch tensors on the learner's device."""

    def __init__(self, device=None, **kwargs):
        super().__init__(**kwargs)
        self.device = device

    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        for module_id, cols in batch.items():
            batch[module_id] = {k: torch.as_tensor(v, device=self.device) for k, v in cols.items()}
        return batch


def build_learner_pipeline(config, device=None) -> ConnectorPipelineV2:
    pieces = [TrajectoriesToBatch(), ComputeAdvantages(config), ToTensors(device)]
    return ConnectorPipelineV2(connectors=pieces)
