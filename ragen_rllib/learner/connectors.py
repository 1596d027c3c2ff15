"""Learner connectors: trajectories into the token batch the loss reads.

An RLlib ConnectorV2 pipeline run inside every learner on its shard of the
batch (RLlib's ``episodes`` argument: here always
:class:`~ragen_rllib.records.trajectory.Trajectory` records):

1. :class:`TrajectoriesToBatch` right-pads every training sequence into [R, T]
   rows and lays out each trajectory's response stream;
2. :class:`RecomputeLogProbs` scores the batch with the learner's weights before
   any optimizer step (the proximal log-probs, for ``rollout_correction``) and logs
   how far they are from the engine's (``log_rollout_mismatch``);
3. :class:`ComputeAdvantages` gives every generated token its advantage: by the
   estimator's registry row with the critic's values (GAE, bi-level GAE), or, for
   the critic-free estimators, from the per-turn advantages the sample-batch
   stage computed on whole groups (:mod:`ragen_rllib.maths.estimators` says why
   two stages);
4. :class:`MaskLoss` takes tokens out of the loss after the advantages are
   computed (so the estimators still see every turn): with ``overlong: mask``
   the answers cut by ``max_new_tokens``, with ``loss_tokens: answer`` every
   answer's reasoning;
5. :class:`ToTensors` moves the columns onto the learner's device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core import DEFAULT_MODULE_ID

from ragen_rllib.distributed.collectives import agreed_count, is_sharded, summed_over_learners
from ragen_rllib.learner.loss import gap_over_learners
from ragen_rllib.maths import advantages as adv
from ragen_rllib.maths import off_policy
from ragen_rllib.maths.batching import fill_plan, from_stream, microbatches, take_rows, to_stream
from ragen_rllib.maths.estimators import ESTIMATORS, StreamBatch
from ragen_rllib.records.metrics import learner_log
from ragen_rllib.records.trajectory import Trajectory

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
    tokens), ``behaviour_logp``, ``row_trajectory`` (the row's trajectory, so that
    the minibatches keep a trajectory's rows together), ``token_lag`` (policy
    versions between each token's sampling weights and the learner's; read by
    :class:`RecomputeLogProbs` or the learner), ``cut_mask`` (1 on the tokens of
    answers cut by ``max_new_tokens``) and ``reasoning_mask`` (1 on each answer's
    reasoning tokens, where the runner counted them); :class:`MaskLoss` removes
    both.
    Per-trajectory columns for the advantage estimators: ``stream_index``  # [B, L],
    the flat [R * T] position of each of the trajectory's generated tokens in order
    (its "response stream", -1 as padding),
    ``stream_turn``  # [B, L], the turn of each stream token (-1 as padding),
    ``turn_end_index``  # [B, K], each turn's last token in that stream (-1: none),
    ``turn_rewards`` and ``turn_advantages``  # [B, K] (the latter from the sample stage).
    """

    def __call__(self, *, rl_module, batch, episodes: list[Trajectory], **kwargs):
        trajectories = episodes  # RLlib's name for them
        segments = [(b, seg) for b, t in enumerate(trajectories) for seg in t.segments]
        rows, width = len(segments), max(len(seg) for _, seg in segments)
        turns = max(max(t.num_turns for t in trajectories), 1)
        stream = max(max(t.response_tokens for t in trajectories), 1)
        n = len(trajectories)
        cols: dict[str, Any] = {
            "input_ids": np.zeros((rows, width), np.int64),
            "attention_mask": np.zeros((rows, width), np.int64),
            "response_mask": np.zeros((rows, width), np.float32),
            "behaviour_logp": np.zeros((rows, width), np.float32),
            "row_trajectory": np.array([b for b, _ in segments], np.int64),
            "token_lag": np.zeros((rows, width), np.int64),
            "cut_mask": np.zeros((rows, width), np.float32),
            "reasoning_mask": np.zeros((rows, width), np.float32),
            "stream_index": np.full((n, stream), -1, np.int64),
            "turn_end_index": np.full((n, turns), -1, np.int64),
            "stream_turn": np.full((n, stream), -1, np.int64),
            "turn_rewards": np.zeros((n, turns), np.float32),
            "turn_advantages": np.zeros((n, turns), np.float32),
        }
        for r, (_, seg) in enumerate(segments):
            length = len(seg)
            cols["input_ids"][r, :length] = seg.input_ids
            cols["attention_mask"][r, :length] = 1
            cols["response_mask"][r, :length] = seg.response_mask
            cols["behaviour_logp"][r, :length] = seg.behaviour_logp
            if seg.versions:  # the learner's version minus each token's (context: unused)
                traj = trajectories[segments[r][0]]
                learner_version = traj.policy_version + traj.policy_lag
                cols["token_lag"][r, :length] = learner_version - np.asarray(seg.versions)
        first_row = 0
        for b, t in enumerate(trajectories):
            pos = 0
            for k, (seg, start, end) in enumerate(t.turn_spans):
                if k < len(t.turn_cut) and t.turn_cut[k]:
                    cols["cut_mask"][first_row + seg, start:end] = 1
                if k < len(t.turn_reasoning_tokens):
                    think = t.turn_reasoning_tokens[k]
                    if not 0 <= think <= end - start:
                        raise ValueError(
                            f"turn {k} counts {think} reasoning tokens in an answer of "
                            f"{end - start}: the counts and the turns are out of step"
                        )
                    cols["reasoning_mask"][first_row + seg, start : start + think] = 1
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
        batch[DEFAULT_MODULE_ID] = cols
        return batch


class ComputeAdvantages(ConnectorV2):
    """Token rewards, then advantages and value targets for the loss.

    The estimators run on each trajectory's response stream (its generated tokens
    in order, across turns and segments), so they give the same result whether a
    trajectory is one sequence or one sequence per turn; the results are then
    placed back on the rows.
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.estimator = ESTIMATORS[config.advantage_estimator]
        self.settings = config.advantage_settings()
        self.whiten = config.whiten_advantages
        self.max_tokens = config.max_tokens_per_microbatch

    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        cols = batch[DEFAULT_MODULE_ID]
        per_traj = {key: torch.from_numpy(cols.pop(key)) for key in TRAJECTORY_COLUMNS}
        mask = torch.from_numpy(cols["response_mask"])  # [R, T]
        index = per_traj["stream_index"]  # [B, L]
        if not self.estimator.needs_critic:  # the sample stage gave every turn its own
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
        stream = StreamBatch(
            values=to_stream(values, index),  # [B, L]
            mask=(index >= 0).float(),  # [B, L]
            turn_end_index=per_traj["turn_end_index"],  # [B, K]
            turn_rewards=per_traj["turn_rewards"],  # [B, K]
        )
        advantages, returns = self.estimator.advantages(stream, self.settings)
        stream_mask = stream.mask
        if self.whiten:  # over the whole batch, also when learners hold parts of it
            advantages = adv.masked_whiten(
                advantages, stream_mask, reduce_sum=lambda t: summed_over_learners(t, device)
            )
        cols["advantages"] = from_stream(advantages, index, mask.shape).numpy().astype(np.float32)
        cols["value_targets"] = from_stream(returns, index, mask.shape).numpy().astype(np.float32)
        cols["old_values"] = values.numpy().astype(np.float32)
        return batch


class RecomputeLogProbs(ConnectorV2):
    """The learner's log-probs of the sampled tokens, before the update's first step.

    With ``rollout_correction`` they are the proximal log-probs the loss clips
    against (column ``proximal_logp``); with it or ``log_rollout_mismatch`` the gap
    to the engine's behaviour log-probs over the whole batch is logged
    (:mod:`ragen_rllib.maths.off_policy`), reduced over all learners:
    ``rollout_mismatch_kl`` and ``_max_abs`` on the tokens sampled with the
    learner's own weights (lag 0), ``off_policy_kl`` on all, and the tokens'
    policy lag. Neither: nothing runs here, the ``token_lag`` column stays, and
    the learner logs the same figures for free from its first minibatch's forward
    pass (:meth:`~ragen_rllib.learner.starpo_learner.StarPOTorchLearner._log_gap`)."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.keep = config.rollout_correction != "none"
        self.log = config.log_rollout_mismatch or self.keep
        self.max_tokens = config.max_tokens_per_microbatch

    def __call__(self, *, rl_module, batch, episodes, metrics=None, **kwargs):
        cols = batch[DEFAULT_MODULE_ID]
        log = self.log and metrics is not None
        if not (self.keep or log):
            return batch  # the learner measures the gap on its first minibatch
        token_lag = cols.pop("token_lag")
        module = rl_module[DEFAULT_MODULE_ID] if DEFAULT_MODULE_ID in rl_module else rl_module
        module = module.unwrapped() if hasattr(module, "unwrapped") else module
        device = next(module.parameters()).device
        logp = learner_logprobs(module, cols, device, self.max_tokens)  # [R, T]
        if self.keep:
            cols["proximal_logp"] = logp.numpy()
        if log:
            sums = off_policy.mismatch_sums(
                logp,
                torch.from_numpy(cols["behaviour_logp"]),
                torch.from_numpy(cols["response_mask"]),
                torch.from_numpy(token_lag),
            )
            for key, value in gap_over_learners(sums, device).items():
                learner_log(metrics, DEFAULT_MODULE_ID, key, value)
        return batch


def learner_logprobs(module, cols: dict[str, Any], device, max_tokens) -> torch.Tensor:
    """The actor's log-probs of a [R, T] batch's response tokens, without gradients, in
    micro-batches of at most ``max_tokens`` padded tokens  # -> [R, T] fp32 on the CPU."""
    names = ("input_ids", "attention_mask", "response_mask")
    rows = {k: torch.from_numpy(cols[k]) for k in names}
    return _by_microbatches(module, rows, device, max_tokens, lambda b: module.score(b)["logp"])


def critic_values(module, input_ids, attention_mask, device, max_tokens) -> torch.Tensor:
    """The critic's values for a [R, T] batch, in micro-batches of at most
    ``max_tokens`` padded tokens (None: one pass)  # -> [R, T] fp32 on the CPU."""
    rows = {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(attention_mask),
    }
    return _by_microbatches(module, rows, device, max_tokens, module.compute_values)


def _by_microbatches(module, rows: dict[str, torch.Tensor], device, max_tokens, forward):
    """``forward`` (a [r, t] output per micro-batch) over a [R, T] batch without
    gradients, in micro-batches of at most ``max_tokens`` padded tokens  # -> [R, T]
    fp32 on the CPU."""
    out = torch.zeros(rows["input_ids"].shape, dtype=torch.float32)
    plan = microbatches(
        rows["input_ids"], rows["attention_mask"], max_tokens, module.shares_prefixes
    )
    if any(is_sharded(p) for p in module.parameters()):
        # FSDP: each forward gathers the layers from all learners, which must
        # therefore run as many passes as the learner with the most.
        plan = fill_plan(plan, agreed_count(len(plan), device))
    with torch.no_grad():
        for part_rows in plan:
            part = take_rows(rows, part_rows or [0])
            values = forward({k: v.to(device) for k, v in part.items()})
            if part_rows:
                out[torch.as_tensor(part_rows), : values.shape[1]] = values.float().cpu()
    return out


class MaskLoss(ConnectorV2):
    """Tokens that leave the loss: with ``overlong: mask`` the answers cut by
    ``max_new_tokens``, with ``loss_tokens: answer`` each answer's reasoning (its
    tokens up to and including ``</think>``). Runs after the advantages, so the
    estimators see every turn; only the loss (and its token counts, the KL and
    entropy terms included) skip these tokens. With a critic the value loss skips
    them too (so ``loss_tokens: answer`` is refused with one: the values its GAE
    reads on the reasoning would never be fitted). The ``cut_mask`` and
    ``reasoning_mask`` columns are removed either way."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.cut = config.overlong == "mask"
        self.reasoning = config.loss_tokens == "answer"

    def __call__(self, *, rl_module, batch, episodes, metrics=None, **kwargs):
        cols = batch[DEFAULT_MODULE_ID]
        cut, reasoning = cols.pop("cut_mask"), cols.pop("reasoning_mask")
        if self.cut:
            cols["response_mask"] = cols["response_mask"] * (1.0 - cut)
        if self.reasoning:
            cols["response_mask"] = cols["response_mask"] * (1.0 - reasoning)
        return batch


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
    pieces = [
        TrajectoriesToBatch(),
        RecomputeLogProbs(config),
        ComputeAdvantages(config),
        MaskLoss(config),
        ToTensors(device),
    ]
    return ConnectorPipelineV2(connectors=pieces)
