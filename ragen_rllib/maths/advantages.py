"""Token rewards and advantage estimators (pure torch, no Ray).

Data flow. The learner connector lays each trajectory's generated tokens end to
end, in order across its turns and training sequences: its *response stream*.
The estimators with a critic work on [B, L] stream tensors (``mask`` = 1 on a
stream's tokens, 0 on its padding) plus per-turn [B, K] tensors
(``turn_end_index`` = the stream position of each turn's last generated token,
-1 for a missing turn; ``turn_rewards``), so their result does not depend on
whether a trajectory trained as one sequence or as one sequence per turn:

* ``token_rewards`` + ``gae``: PPO with a critic (StarPO), reward either at the
  end of the trajectory or at the end of every turn (TRICO's turn-level reward);
* ``bilevel_gae``: VAGEN/TRICO's turn-level GAE followed by a token-level GAE
  inside each turn.

The critic-free estimators work on per-trajectory lists (one entry per turn):

* ``group_normalize``: group baselines (GRPO, Dr. GRPO, RLOO, REINFORCE++ with a
  baseline), with ``whiten_turns`` for REINFORCE++'s batch normalisation;
* ``gigpo_advantages``: GiGPO, GRPO's episode advantage plus a step advantage
  from the turns that start in the same state.

The functions also accept ordinary padded [B, T] token tensors: a masked-out
token is skipped as if it were not there, so observation tokens between turns
never act as actions. :mod:`ragen_rllib.maths.estimators` says which estimator
uses which function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch


# ----- masked reductions ---------------------------------------------------------------
def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the tokens where ``mask`` is 1 (0 when the mask is empty).

    ``torch.where`` (not ``x * mask``) so inf/nan in masked-out positions cannot leak in.
    """
    m = mask.bool()
    total = torch.where(m, x, torch.zeros_like(x)).sum(dim=dim)
    count = m.sum(dim=dim).to(total.dtype)
    return total / count.clamp_min(1)


def masked_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked tokens of the whole batch; 0 outside.

    The variance is the sample (Bessel-corrected, n - 1) variance, like the group std
    of ``group_normalize``. With ``shift_mean=False`` the mean is added back (scale only).
    ``reduce_sum``: when several learners each hold part of the batch, a function that
    sums a tensor over all of them, so that the mean and variance are the whole
    batch's (None: ``x`` is the whole batch).
    """
    total = reduce_sum or (lambda t: t)
    m = mask.bool()
    zero = torch.zeros_like(x)
    n, s = total(torch.stack([m.sum().double(), torch.where(m, x, zero).sum().double()]))
    mean = (s / n.clamp_min(1)).to(x.dtype)
    centred = torch.where(m, x - mean, zero)
    squares = total((centred.double() ** 2).sum().reshape(1))[0]
    var = (squares / (n - 1).clamp_min(1)).to(x.dtype)
    out = centred * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, zero)


# ----- rewards -------------------------------------------------------------------------
def token_rewards(
    turn_end_index: torch.Tensor, turn_rewards: torch.Tensor, T: int, level: str = "trajectory"
) -> torch.Tensor:
    """Scatter per-turn rewards onto tokens  # -> [B, T].

    ``turn_end_index``  # [B, K] long, last generated token of each turn, -1: no turn
    ``turn_rewards``    # [B, K], ignored where ``turn_end_index`` is -1

    * ``"trajectory"``: the sum of the trajectory's (valid) turn rewards on the
      last generated token of its last turn (StarPO's sparse outcome reward);
    * ``"turn"``: each turn's reward on that turn's last generated token (TRICO).
    """
    if level not in ("trajectory", "turn"):
        raise ValueError(f"level must be 'trajectory' or 'turn', got {level!r}")
    if turn_end_index.numel() and int(turn_end_index.max()) >= T:
        raise ValueError(f"turn_end_index {int(turn_end_index.max())} out of range for T={T}")
    valid = turn_end_index >= 0  # [B, K]
    r = torch.where(valid, turn_rewards, torch.zeros_like(turn_rewards))
    out = torch.zeros((turn_end_index.shape[0], T), dtype=r.dtype, device=r.device)
    if level == "turn":
        # Invalid turns add 0 at index 0, so scatter_add needs no filtering.
        out.scatter_add_(1, turn_end_index.clamp_min(0), r)
        return out
    last = turn_end_index.max(dim=1).values  # [B], -1 when the trajectory has no turn
    total = torch.where(last >= 0, r.sum(dim=1), torch.zeros_like(r[:, 0]))  # [B]
    out.scatter_add_(1, last.clamp_min(0)[:, None], total[:, None])
    return out


# ----- GAE -----------------------------------------------------------------------------
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the ``mask == 1`` tokens only.

    For a generated token t let t' be the next generated token of the same row
    (tokens with mask 0 are skipped; no t' after the last one):
        delta_t = r_t + gamma * V_t' - V_t          (V_t' := 0 after the last one)
        A_t     = delta_t + gamma * lam * A_t'      (A_t'  := 0 after the last one)
    Rewards and values on mask-0 tokens are ignored. Returns = A + V.
    ``rewards``, ``values``, ``mask``  # [B, T]  ->  (advantages, returns)  # [B, T], 0 off-mask
    """
    m = mask.bool()
    B, T = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(B)  # V at the next generated token  # [B]
    next_adv = rewards.new_zeros(B)  # A at the next generated token  # [B]
    for t in reversed(range(T)):
        m_t = m[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(m_t, adv_t, torch.zeros_like(adv_t))
        # A masked token is transparent: carry the later token's value/advantage over it.
        next_value = torch.where(m_t, values[:, t], next_value)
        next_adv = torch.where(m_t, adv_t, next_adv)
    returns = torch.where(m, advantages + values, torch.zeros_like(advantages))
    return advantages, returns


def bilevel_gae(
    turn_rewards: torch.Tensor,
    values: torch.Tensor,
    turn_end_index: torch.Tensor,
    mask: torch.Tensor,
    turn: tuple[float, float] = (0.95, 1.0),
    token: tuple[float, float] = (1.0, 1.0),
) -> tuple[torch.Tensor, torch.Tensor]:
    """VAGEN/TRICO bi-level GAE  # -> (advantages, returns) [B, T], 0 off-mask.

    ``turn = (gamma_turn, lam_turn)`` and ``token = (gamma_token, lam_token)``: the
    discount and GAE lambda between turns and between the tokens of a turn.

    ``turn_rewards``, ``turn_end_index``  # [B, K]  (index -1: no turn, skipped)
    ``values``, ``mask``                  # [B, T]

    Definition. Let e_k be the last generated token of turn k, V_k = values[e_k]
    and R_k the turn's reward.

    1. Turn level (a GAE whose "tokens" are the turn ends):
           delta_k = R_k + gamma_turn * V_{k+1} - V_k        (V_{K+1} := 0)
           Ahat_k  = delta_k + gamma_turn * lam_turn * Ahat_{k+1}
           G_k     = Ahat_k + V_k                        (turn-level return target)
    2. Token level, inside turn k (its generated tokens lie in (e_{k-1}, e_k]):
           A[e_k] = Ahat_k                (i.e. the pass is seeded with G_k at e_k)
           for a generated token t < e_k of turn k, with t' the next generated token:
           A_t = gamma_token * V_t' - V_t + gamma_token * lam_token * A_t'
       No reward inside a turn: the turn's reward enters only through Ahat_k.
       With gamma_token = lam_token = 1 every token of turn k gets A_t = G_k - V_t.
    Returns = A + V. Generated tokens after the last turn end get 0.
    """
    (gamma_turn, lam_turn), (gamma_token, lam_token) = turn, token
    m = mask.bool()
    B, T = values.shape
    valid = turn_end_index >= 0  # [B, K]
    end_idx = turn_end_index.clamp_min(0)
    turn_rewards = turn_rewards.to(values.dtype)
    # 1. Turn level: plain GAE on the [B, K] sequence of turn ends (missing turns masked).
    turn_values = torch.where(valid, values.gather(1, end_idx), torch.zeros_like(turn_rewards))
    turn_adv, _ = gae(turn_rewards, turn_values, valid, gamma_turn, lam_turn)  # [B, K]

    # Turn ends and their seed advantages laid out on tokens; missing turns write to a
    # spare column T that is dropped, so they cannot collide with a real turn ending at 0.
    spare_idx = torch.where(valid, turn_end_index, torch.full_like(turn_end_index, T))  # [B, K]
    is_end = torch.zeros((B, T + 1), dtype=torch.bool, device=values.device)
    is_end = is_end.scatter_(1, spare_idx, True)[:, :T]  # [B, T]
    seed = values.new_zeros((B, T + 1)).scatter_add_(1, spare_idx, turn_adv)[:, :T]  # [B, T]
    # A token belongs to some turn iff a turn end lies at or after it.
    covered = is_end.flip(1).cumsum(1).flip(1) > 0  # [B, T]

    # 2. Token level: backward pass inside each turn, restarted at every turn end.
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(B)
    next_adv = values.new_zeros(B)
    for t in reversed(range(T)):
        m_t = m[:, t] & covered[:, t]
        inner = gamma_token * next_value - values[:, t] + gamma_token * lam_token * next_adv
        adv_t = torch.where(is_end[:, t], seed[:, t], inner)
        advantages[:, t] = torch.where(m_t, adv_t, torch.zeros_like(adv_t))
        next_value = torch.where(m_t, values[:, t], next_value)
        next_adv = torch.where(m_t, adv_t, next_adv)
    keep = m & covered
    returns = torch.where(keep, advantages + values, torch.zeros_like(advantages))
    return advantages, returns


# ----- GRPO ----------------------------------------------------------------------------
def group_stats(
    scores: Any, group_ids: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group statistics of trajectory scores, computed in float64.

    Returns ``(unique_ids [G] sorted, inverse [N], counts [G], mean [G], std [G])``.
    ``std`` is the SAMPLE standard deviation (Bessel, n - 1), as ``torch.std`` and
    RAGEN/verl's GRPO use; a group of size 1 has std 0.
    """
    s = torch.as_tensor(scores).to(torch.float64).reshape(-1)  # [N]
    g = torch.as_tensor(group_ids).reshape(-1).to(s.device)  # [N]
    if s.shape != g.shape:
        raise ValueError(f"scores {tuple(s.shape)} and group_ids {tuple(g.shape)} differ")
    unique_ids, inverse = torch.unique(g, sorted=True, return_inverse=True)
    G = unique_ids.numel()
    counts = s.new_zeros(G).index_add_(0, inverse, torch.ones_like(s))
    mean = s.new_zeros(G).index_add_(0, inverse, s) / counts.clamp_min(1)
    # A group of equal scores has exactly that mean (a sum of n copies divided by n
    # can be off by an ulp, and r - mean would then be ~1e-17 instead of 0, which a
    # std division blows up): its members then get exactly 0.
    high = s.new_full((G,), -math.inf).scatter_reduce_(0, inverse, s, "amax")
    low = s.new_full((G,), math.inf).scatter_reduce_(0, inverse, s, "amin")
    mean = torch.where(high == low, high, mean)
    # Two passes (centre first) for a numerically stable variance.
    sq = s.new_zeros(G).index_add_(0, inverse, (s - mean[inverse]) ** 2)
    var = torch.where(counts > 1, sq / (counts - 1).clamp_min(1), torch.zeros_like(sq))
    return unique_ids, inverse, counts, mean, var.sqrt()


REWARD_NORM_METHODS = ("mean_std", "mean", "identity", "asym_clip")
#: asym_clip bounds (RAGEN's): a mean_std score clipped to [-1, 3], so a rollout far
#: below its group is pushed down at most one std, one far above up to three.
ASYM_CLIP = (-1.0, 3.0)


def group_normalize(
    scores: Any,
    group_ids: Any,
    method: str = "mean_std",
    leave_one_out: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Scores relative to their group  # [N] -> [N] (float32 for integer input).

    With b the group's mean (``leave_one_out``: the mean of the OTHER members, as
    in RLOO; a group of one has no other member, so b = r) and s the group's
    SAMPLE std (n - 1):

    * ``"mean"``:      r - b  (Dr. GRPO, RLOO, REINFORCE++'s baseline);
    * ``"mean_std"``:  (r - b) / (s + eps)  (GRPO);
    * ``"asym_clip"``: the ``mean_std`` value clipped to [-1, 3];
    * ``"identity"``:  r (no baseline).

    A group whose scores are all equal gets 0 under every method but identity.
    """
    if method not in REWARD_NORM_METHODS:
        raise ValueError(f"method must be one of {REWARD_NORM_METHODS}, got {method!r}")
    scores = torch.as_tensor(scores)
    dtype = scores.dtype if scores.is_floating_point() else torch.float32
    if method == "identity":
        return scores.to(dtype).clone()
    _, inverse, counts, mean, std = group_stats(scores, group_ids)
    s = scores.to(torch.float64).reshape(-1)
    n = counts[inverse]
    if leave_one_out:
        others = (mean[inverse] * n - s) / (n - 1).clamp_min(1)
        baseline = torch.where(n > 1, others, s)
    else:
        baseline = mean[inverse]
    out = s - baseline
    if method in ("mean_std", "asym_clip"):
        out = out / (std[inverse] + eps)
    if method == "asym_clip":
        out = out.clamp(*ASYM_CLIP)
    return out.to(dtype).reshape(scores.shape)


def whiten_turns(
    values: Sequence[Sequence[float]], tokens: Sequence[Sequence[int]], eps: float = 1e-8
) -> list[list[float]]:
    """Whiten per-turn values over the batch's generated tokens  # ragged [N][K_i].

    A turn's value is what each of its ``tokens[i][k]`` generated tokens carries,
    so this is :func:`masked_whiten` over every response token of the batch (the
    REINFORCE++ normalisation): (v - mean) / sqrt(var + eps), mean and SAMPLE
    variance weighted by token counts. A turn without tokens carries no weight."""
    flat = torch.tensor([float(v) for row in values for v in row], dtype=torch.float64)
    weight = torch.tensor([float(w) for row in tokens for w in row], dtype=torch.float64)
    if flat.shape != weight.shape:
        raise ValueError(f"{flat.numel()} turn values but {weight.numel()} token counts")
    total = weight.sum()
    if total <= 0:
        return [[0.0] * len(row) for row in values]
    mean = (flat * weight).sum() / total
    var = (weight * (flat - mean) ** 2).sum() / (total - 1).clamp_min(1)
    out = ((flat - mean) / torch.sqrt(var + eps)).tolist()
    rows, first = [], 0
    for row in values:
        rows.append(out[first : first + len(row)])
        first += len(row)
    return rows


# ----- GiGPO ---------------------------------------------------------------------------
def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """R_t = r_t + gamma * R_{t+1} for one trajectory's turn rewards (R after the last: 0)."""
    out, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def gigpo_advantages(
    turn_rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Any],
    anchors: Sequence[Sequence[Hashable]],
    gamma: float = 0.95,
    step_weight: float = 1.0,
    norm: str = "mean_std",
    eps: float = 1e-6,
    episode_groups: Sequence[Any] | None = None,
) -> list[list[float]]:
    """GiGPO: one advantage per turn  # ragged [N][K_i] -> [N][K_i].

    ``turn_rewards[i][t]``: reward of trajectory i's turn t; ``group_ids[i]``: its
    group (the rollouts of one initial state); ``anchors[i][t]``: the state turn t
    started from (e.g. the observation text), compared by equality.

    * Episode advantage: :func:`group_normalize` of the trajectories' total
      rewards with ``norm``, within their group (or within ``episode_groups``,
      when the episode baseline is taken over other sets, such as the batch).
    * Step advantage: the turns of one group that start from the same anchor
      state form a step group; a turn's discounted return
      R_t = sum_k gamma^(k-t) r_k (k >= t, its own trajectory) relative to the
      step group by :func:`group_normalize` with ``norm`` ("identity" here is
      "mean": a step advantage is always relative). A step group of one turn
      gives 0.
    * Turn advantage = episode advantage + ``step_weight`` * step advantage.
    """
    n = len(turn_rewards)
    if not (len(group_ids) == len(anchors) == n):
        raise ValueError(
            f"turn_rewards ({n}), group_ids ({len(group_ids)}) and anchors ({len(anchors)}) "
            "must have one entry per trajectory"
        )
    for i, (rewards, states) in enumerate(zip(turn_rewards, anchors, strict=True)):
        if len(rewards) != len(states):
            raise ValueError(
                f"trajectory {i}: {len(rewards)} turn rewards but {len(states)} anchors"
            )
    if norm not in REWARD_NORM_METHODS:
        raise ValueError(f"norm must be one of {REWARD_NORM_METHODS}, got {norm!r}")
    if n == 0:
        return []
    totals = torch.tensor([float(sum(r)) for r in turn_rewards], dtype=torch.float64)
    baseline_groups = group_ids if episode_groups is None else episode_groups
    episode = group_normalize(totals, ids_of(baseline_groups), norm, eps=eps)
    keys: dict[tuple[Any, Hashable], int] = {}
    step_key, step_return = [], []
    for i, (rewards, states) in enumerate(zip(turn_rewards, anchors, strict=True)):
        step_return.extend(discounted_returns(rewards, gamma))
        step_key.extend(keys.setdefault((group_ids[i], s), len(keys)) for s in states)
    if not step_key:
        return [[] for _ in range(n)]
    returns = torch.tensor(step_return, dtype=torch.float64)  # [M] every turn of the batch
    keys_t = torch.tensor(step_key)
    _, inverse, counts, _, _ = group_stats(returns, keys_t)
    # The step advantage is relative by definition: "identity" still subtracts the mean.
    step = group_normalize(returns, keys_t, "mean" if norm == "identity" else norm, eps=eps)
    step = torch.where(counts[inverse] > 1, step, torch.zeros_like(step))
    out, first = [], 0
    for i, rewards in enumerate(turn_rewards):
        part = step[first : first + len(rewards)]
        out.append([float(episode[i]) + step_weight * float(x) for x in part])
        first += len(rewards)
    return out


def ids_of(group_ids: Sequence[Any]) -> list[int]:
    """Any hashable group labels as integers (first come, first numbered)."""
    seen: dict[Any, int] = {}
    return [seen.setdefault(g, len(seen)) for g in group_ids]
