"""The advantage estimators, one registry row each.

Every stage that depends on the estimator reads its row in :data:`ESTIMATORS`:
the config check (which knobs apply), the sample-batch stage (critic-free
estimators) and the learner stage (estimators with a critic). A row says

* ``needs_critic``: whether a value network is trained (and so where the
  advantages are computed, see below);
* ``default_reward_norm``: how a trajectory's reward is compared with its
  baseline group when ``reward_norm_method`` is null; None means the estimator
  has no group baseline, so the ``reward_norm_*`` knobs do not apply to it;
* ``default_loss_agg``: how token losses are averaged when ``loss_agg`` is null;
* ``advantages``: the function.

Why two stages compute advantages. Critic-free estimators compare a
trajectory with the other rollouts of its group, so they need whole groups,
which exist only on the driver (the learners each hold a shard of the batch,
split by tokens, which can cut a group). Estimators with a critic need the
critic's values, which exist only on the learners. So a critic-free row's
function maps a :class:`TurnBatch` to one advantage per turn (run by the
sample-batch connector), and a critic row's function maps a
:class:`StreamBatch` to token advantages and returns (run by the learner
connector). No estimator needs both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

from ragen_rllib.maths import advantages as adv


@dataclass(frozen=True)
class AdvantageSettings:
    """The estimator knobs of a config: reward normalisation, discounts, GiGPO."""

    reward_norm: str | None = None  # the method used (the row's default resolved)
    gamma: float = 1.0
    lam: float = 1.0
    reward_level: str = "trajectory"
    gamma_turn: float = 0.95
    lambda_turn: float = 1.0
    gamma_token: float = 1.0
    lambda_token: float = 1.0
    gigpo_gamma: float = 0.95
    gigpo_step_weight: float = 1.0
    rae_decay: float = 0.95


@dataclass
class TurnBatch:
    """What the critic-free estimators read, one entry per trajectory of the batch.

    ``groups``: its initial state's group; ``baseline_groups``: the group its reward
    is normalised in (``reward_norm_grouping``); ``anchors``: the observation each
    turn answered (GiGPO's step groups); ``turn_tokens``: generated tokens per turn
    (the weight of a turn in REINFORCE++'s whitening); ``roles``: its env and seat
    (RAE's baseline key); ``role_baselines``: RAE's running baselines, kept by the
    caller across batches and updated in place."""

    turn_rewards: list[list[float]]
    groups: list[Hashable]
    baseline_groups: list[Hashable]
    anchors: list[list[Hashable]]
    turn_tokens: list[list[int]]
    roles: list[Hashable] | None = None
    role_baselines: dict[Hashable, float] | None = None

    @property
    def totals(self) -> torch.Tensor:
        return torch.tensor([float(sum(r)) for r in self.turn_rewards], dtype=torch.float64)


@dataclass
class StreamBatch:
    """What the estimators with a critic read, on each trajectory's response stream
    (its generated tokens in order, across turns and segments).

    ``values``, ``mask``  # [B, L]; ``turn_end_index``, ``turn_rewards``  # [B, K]
    (index -1: no turn)."""

    values: torch.Tensor
    mask: torch.Tensor
    turn_end_index: torch.Tensor
    turn_rewards: torch.Tensor


def _per_turn(values: list[float], batch: TurnBatch) -> list[list[float]]:
    return [[float(v)] * len(r) for v, r in zip(values, batch.turn_rewards, strict=True)]


def _normalised(batch: TurnBatch, s: AdvantageSettings, leave_one_out: bool = False):
    ids = torch.tensor(adv.ids_of(batch.baseline_groups))
    return adv.group_normalize(batch.totals, ids, s.reward_norm, leave_one_out).tolist()


def _grpo(batch: TurnBatch, s: AdvantageSettings) -> list[list[float]]:
    """The trajectory's reward normalised in its group, on every turn (GRPO; Dr. GRPO
    with method "mean", its loss aggregation being the learner's business)."""
    return _per_turn(_normalised(batch, s), batch)


def _rloo(batch: TurnBatch, s: AdvantageSettings) -> list[list[float]]:
    """The reward against the leave-one-out mean of its group, on every turn."""
    return _per_turn(_normalised(batch, s, leave_one_out=True), batch)


def _reinforce_pp_baseline(batch: TurnBatch, s: AdvantageSettings) -> list[list[float]]:
    """The reward minus its group's mean on every turn, whitened over the batch's tokens."""
    return adv.whiten_turns(_grpo(batch, s), batch.turn_tokens)


def _reinforce_pp(batch: TurnBatch, s: AdvantageSettings) -> list[list[float]]:
    """Each turn's discounted return, whitened over the batch's tokens (no baseline)."""
    returns = [adv.discounted_returns(r, s.gamma) for r in batch.turn_rewards]
    return adv.whiten_turns(returns, batch.turn_tokens)


def _gigpo(batch: TurnBatch, s: AdvantageSettings) -> list[list[float]]:
    """The episode advantage plus a step advantage among the group's turns that
    answered the same observation (:func:`~ragen_rllib.maths.advantages.gigpo_advantages`)."""
    return adv.gigpo_advantages(
        batch.turn_rewards,
        batch.groups,
        batch.anchors,
        gamma=s.gigpo_gamma,
        step_weight=s.gigpo_step_weight,
        norm=s.reward_norm,
        episode_groups=batch.baseline_groups,
    )


def _rae(batch: TurnBatch, s: AdvantageSettings) -> list[list[float]]:
    """Role-conditioned advantages (SPIRAL's RAE): the reward minus a running baseline
    of its env and seat, on every turn. The whole batch is scored against the
    baselines as they were before it; then each baseline moves toward the batch's
    rewards one trajectory at a time, ``b = decay * b + (1 - decay) * R`` (from 0).
    A non-finite reward gets advantage 0 and never reaches a baseline (one NaN would
    make its seat's baseline NaN for the rest of the run)."""
    roles = batch.roles or [None] * len(batch.turn_rewards)
    baselines = batch.role_baselines if batch.role_baselines is not None else {}
    totals = batch.totals.tolist()
    values = [
        r - baselines.get(role, 0.0) if math.isfinite(r) else 0.0
        for r, role in zip(totals, roles, strict=True)
    ]
    for r, role in zip(totals, roles, strict=True):
        if math.isfinite(r):
            baselines[role] = s.rae_decay * baselines.get(role, 0.0) + (1 - s.rae_decay) * r
    return _per_turn(values, batch)


def _gae(batch: StreamBatch, s: AdvantageSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's GAE over the response stream, the reward on the last token of the
    trajectory or of each turn (``reward_level``)."""
    rewards = adv.token_rewards(
        batch.turn_end_index, batch.turn_rewards, batch.mask.shape[1], s.reward_level
    )
    return adv.gae(rewards, batch.values, batch.mask, s.gamma, s.lam)


def _bilevel_gae(batch: StreamBatch, s: AdvantageSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """TRICO's turn-level GAE seeding a token-level GAE inside each turn."""
    return adv.bilevel_gae(
        batch.turn_rewards,
        batch.values,
        batch.turn_end_index,
        batch.mask,
        turn=(s.gamma_turn, s.lambda_turn),
        token=(s.gamma_token, s.lambda_token),
    )


@dataclass(frozen=True)
class Estimator:
    """One registry row (see the module docstring)."""

    name: str
    needs_critic: bool
    default_reward_norm: str | None
    default_loss_agg: str
    advantages: Callable[[Any, AdvantageSettings], Any]
    summary: str

    @property
    def group_baseline(self) -> bool:
        """Whether the reward_norm_* knobs apply (the estimator compares with a group)."""
        return self.default_reward_norm is not None


_ROWS = (
    Estimator("gae", True, None, "token-mean", _gae, "PPO with a critic (StarPO)"),
    Estimator("bilevel_gae", True, None, "token-mean", _bilevel_gae, "TRICO's turn-then-token GAE"),
    Estimator("grpo", False, "mean_std", "token-mean", _grpo, "reward normalised in its group"),
    Estimator(
        "dr_grpo",
        False,
        "mean",
        "seq-mean-token-sum-norm",
        _grpo,
        "no std scaling, loss not normalised by length",
    ),
    Estimator("rloo", False, "mean", "token-mean", _rloo, "leave-one-out group mean"),
    Estimator(
        "reinforce_pp", False, None, "token-mean", _reinforce_pp, "discounted returns, whitened"
    ),
    Estimator(
        "reinforce_pp_baseline",
        False,
        "mean",
        "token-mean",
        _reinforce_pp_baseline,
        "group mean subtracted, then whitened",
    ),
    Estimator("gigpo", False, "mean_std", "token-mean", _gigpo, "GRPO plus step-level advantages"),
    Estimator(
        "rae", False, None, "token-mean", _rae, "reward minus a running baseline per env and seat"
    ),
)
#: name -> row, in the order the docs list them.
ESTIMATORS: dict[str, Estimator] = {row.name: row for row in _ROWS}


def estimator(name: str) -> Estimator:
    """The registry row of ``name``; a KeyError names the allowed ones."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise KeyError(
            f"unknown advantage estimator {name!r}; allowed: {list(ESTIMATORS)}"
        ) from None
