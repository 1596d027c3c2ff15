"""The pure maths in ragen_rllib.maths: advantages, losses (no Ray)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ragen_rllib.learner.kl_estimators import kl_penalty
from ragen_rllib.learner.loss_terms import value_loss
from ragen_rllib.learner.policy_losses import policy_loss
from ragen_rllib.maths.advantages import (
    bilevel_gae,
    discounted_returns,
    gae,
    gigpo_advantages,
    group_normalize,
    masked_mean,
    masked_whiten,
    token_rewards,
)
from ragen_rllib.rl_module.logprobs import token_logprobs_and_entropy

F64 = torch.float64


def t64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# ----- token rewards -------------------------------------------------------------------
def test_token_rewards_turn_vs_trajectory_level():
    turn_end = torch.tensor([[1, 4, -1], [2, -1, -1], [0, -1, -1]])  # [B=3, K=3]
    rewards = t64([[0.5, 1.0, 7.0], [2.0, 0.0, 0.0], [3.0, 9.0, 9.0]])  # 7, 9: padding
    turn = token_rewards(turn_end, rewards, 6, level="turn")
    traj = token_rewards(turn_end, rewards, 6, level="trajectory")
    assert torch.equal(turn, t64([[0, 0.5, 0, 0, 1.0, 0], [0, 0, 2, 0, 0, 0], [3, 0, 0, 0, 0, 0]]))
    assert torch.equal(traj, t64([[0, 0, 0, 0, 1.5, 0], [0, 0, 2, 0, 0, 0], [3, 0, 0, 0, 0, 0]]))
    with pytest.raises(ValueError, match="episode"):
        token_rewards(turn_end, rewards, 6, level="episode")


# ----- GAE -----------------------------------------------------------------------------
def test_gae_hand_example_skips_masked_observation_tokens():
    # Tokens: g0 g1 obs g3 g4. The obs token's reward 9 and value 7 must be ignored.
    rewards = t64([[0.0, 0.5, 9.0, 0.0, 1.0]])
    values = t64([[0.1, 0.2, 7.0, 0.3, 0.4]])
    mask = t64([[1, 1, 0, 1, 1]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)  # gamma * lam = 0.72
    # t=4: delta = 1 + 0 - 0.4 = 0.6;                 A = 0.6
    # t=3: delta = 0 + 0.9*0.4 - 0.3 = 0.06;          A = 0.06 + 0.72*0.6     = 0.492
    # t=1: delta = 0.5 + 0.9*0.3 - 0.2 = 0.57;        A = 0.57 + 0.72*0.492   = 0.92424
    # t=0: delta = 0 + 0.9*0.2 - 0.1 = 0.08;          A = 0.08 + 0.72*0.92424 = 0.7454528
    expected_adv = t64([[0.7454528, 0.92424, 0.0, 0.492, 0.6]])
    expected_ret = t64([[0.8454528, 1.12424, 0.0, 0.792, 1.0]])
    torch.testing.assert_close(adv, expected_adv, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, expected_ret, atol=1e-6, rtol=0)


def test_gae_gamma_lam_one_is_reward_to_go_minus_value():
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(4, 12, generator=g) > 0.3).to(F64)
    rewards = torch.randn(4, 12, generator=g, dtype=F64) * mask
    values = torch.randn(4, 12, generator=g, dtype=F64)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    to_go = rewards.flip(1).cumsum(1).flip(1) * mask  # sum of rewards from t on
    torch.testing.assert_close(adv, (to_go - values) * mask, atol=1e-12, rtol=0)
    torch.testing.assert_close(ret, to_go, atol=1e-12, rtol=0)


def test_gae_ignores_values_and_rewards_off_mask():
    g = torch.Generator().manual_seed(1)
    mask = (torch.rand(3, 9, generator=g) > 0.4).to(F64)
    rewards, values = torch.randn(2, 3, 9, generator=g, dtype=F64)
    noise = torch.randn(2, 3, 9, generator=g, dtype=F64) * 100 * (1 - mask)
    a1, r1 = gae(rewards, values, mask, 0.95, 0.9)
    a2, r2 = gae(rewards + noise[0], values + noise[1], mask, 0.95, 0.9)
    assert torch.equal(a1, a2) and torch.equal(r1, r2)
    assert torch.all(a1[mask == 0] == 0) and torch.all(r1[mask == 0] == 0)


# ----- bi-level GAE --------------------------------------------------------------------
def bilevel_example():
    # Tokens: obs g1 g2 | obs g4 g5 g6; turn 1 ends at 2, turn 2 at 6.
    values = t64([[9.0, 0.1, 0.2, 9.0, 0.3, 0.4, 0.5]])
    mask = t64([[0, 1, 1, 0, 1, 1, 1]])
    return t64([[0.5, 1.0]]), values, torch.tensor([[2, 6]]), mask


def test_bilevel_gae_hand_example():
    turn_rewards, values, turn_end, mask = bilevel_example()
    adv, ret = bilevel_gae(turn_rewards, values, turn_end, mask, (0.9, 0.8), (1.0, 0.95))
    # Turn level (V_1 = 0.2, V_2 = 0.5, gamma_turn * lam_turn = 0.72):
    #   k=2: delta = 1.0 - 0.5 = 0.5;                 Ahat_2 = 0.5,                G_2 = 1.0
    #   k=1: delta = 0.5 + 0.9*0.5 - 0.2 = 0.75;      Ahat_1 = 0.75 + 0.72*0.5 = 1.11, G_1 = 1.31
    # Token level (gamma_token = 1, lam_token = 0.95), seeded with Ahat_k at the turn end:
    #   turn 2: A6 = 0.5; A5 = (0.5 - 0.4) + 0.95*0.5 = 0.575; A4 = (0.4 - 0.3) + 0.95*0.575
    #           = 0.64625
    #   turn 1: A2 = 1.11; A1 = (0.2 - 0.1) + 0.95*1.11 = 1.1545
    expected_adv = t64([[0.0, 1.1545, 1.11, 0.0, 0.64625, 0.575, 0.5]])
    expected_ret = t64([[0.0, 1.2545, 1.31, 0.0, 0.94625, 0.975, 1.0]])
    torch.testing.assert_close(adv, expected_adv, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, expected_ret, atol=1e-6, rtol=0)


def test_bilevel_gae_unit_token_gamma_lambda_gives_turn_return_minus_value():
    turn_rewards, values, turn_end, mask = bilevel_example()
    adv, _ = bilevel_gae(turn_rewards, values, turn_end, mask, (0.9, 0.8), (1.0, 1.0))
    g1, g2 = 1.31, 1.0  # turn-level returns from the hand example
    expected = t64([[0.0, g1 - 0.1, g1 - 0.2, 0.0, g2 - 0.3, g2 - 0.4, g2 - 0.5]])
    torch.testing.assert_close(adv, expected, atol=1e-12, rtol=0)


def test_bilevel_gae_padding_rows_and_missing_turns():
    turn_rewards, values, turn_end, mask = bilevel_example()
    single_adv, single_ret = bilevel_gae(
        turn_rewards, values, turn_end, mask, (0.9, 0.8), (1.0, 0.95)
    )
    # Row 0: the example padded to T=9, K=3; row 1: one turn ending at token 0.
    values_b = t64([[*values[0].tolist(), 5.0, 5.0], [0.25] + [3.0] * 8])
    mask_b = t64([[*mask[0].tolist(), 0, 0], [1] + [0] * 8])
    turn_end_b = torch.tensor([[2, 6, -1], [0, -1, -1]])
    rewards_b = t64([[0.5, 1.0, 4.0], [2.0, 4.0, 4.0]])
    adv, ret = bilevel_gae(rewards_b, values_b, turn_end_b, mask_b, (0.9, 0.8), (1.0, 0.95))
    torch.testing.assert_close(adv[0, :7], single_adv[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(ret[0, :7], single_ret[0], atol=1e-12, rtol=0)
    assert torch.all(adv[0, 7:] == 0)
    # Row 1: Ahat = 2.0 - 0.25 = 1.75 on token 0, return 2.0; nothing else.
    torch.testing.assert_close(adv[1], t64([1.75] + [0] * 8), atol=1e-12, rtol=0)
    torch.testing.assert_close(ret[1], t64([2.0] + [0] * 8), atol=1e-12, rtol=0)


# ----- GRPO and masked helpers ---------------------------------------------------------
def test_grpo_mean_std_normalisation():
    scores = torch.tensor([1.0, 2.0, 3.0, 5.0, 1.0, 4.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])  # group 2: single; group 3: equal
    adv = group_normalize(scores, groups, eps=1e-6)
    # Group 0: mean 2, sample std 1. Group 1: mean 3, sample std sqrt(8) = 2.828427.
    s1 = math.sqrt(8.0)
    expected = [-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6), 2 / (s1 + 1e-6), -2 / (s1 + 1e-6), 0, 0, 0]
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-6, rtol=0)
    for g in (0, 1):
        members = adv[groups == g].double()
        assert abs(members.mean().item()) < 1e-6
        assert abs(members.std(unbiased=True).item() - 1.0) < 1e-5


def test_grpo_mean_and_identity_modes():
    scores = torch.tensor([1.0, 2.0, 3.0, 5.0, 1.0, 4.0])
    groups = np.array([7, 7, 7, 2, 2, 9])  # numpy ids, not contiguous
    mean_adv = group_normalize(scores, groups, "mean")
    torch.testing.assert_close(mean_adv, torch.tensor([-1.0, 0.0, 1.0, 2.0, -2.0, 0.0]))
    ident = group_normalize(scores, groups, "identity")
    assert torch.equal(ident, scores)
    with pytest.raises(ValueError, match="median"):
        group_normalize(scores, groups, "median")


# ----- GiGPO ----------------------------------------------------------------------------
# Two groups; anchor "s" repeats across trajectories of both groups, "t" twice in group 0
# (turn 2 of trajectory 0 and turn 3 of trajectory 1), "u" and group 1's "t" once.
GIGPO_REWARDS = [[0, 1], [0, 0, 1], [0], [1, 0], [0]]
GIGPO_GROUPS = [0, 0, 0, 1, 1]
GIGPO_ANCHORS = [["s", "t"], ["s", "u", "t"], ["s"], ["s", "t"], ["s"]]


def test_discounted_returns():
    assert discounted_returns([0, 0, 1], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([1, -1], 1.0) == [0.0, -1.0]
    assert discounted_returns([], 0.9) == []


def test_gigpo_hand_example_mean_norm():
    got = gigpo_advantages(GIGPO_REWARDS, GIGPO_GROUPS, GIGPO_ANCHORS, gamma=0.5, norm="mean")
    # Episode: group 0 totals (1, 1, 0) - 2/3; group 1 totals (1, 0) - 1/2.
    # Step groups: (0, s) returns (0.5, 0.25, 0) - 0.25; (0, t) returns (1, 1) - 1;
    # (0, u) and (1, t) alone: 0; (1, s) returns (1, 0) - 0.5.
    third = 1 / 3
    expected = [
        [third + 0.25, third + 0.0],
        [third + 0.0, third + 0.0, third + 0.0],
        [-2 * third - 0.25],
        [0.5 + 0.5, 0.5 + 0.0],
        [-0.5 - 0.5],
    ]
    for row, want in zip(got, expected, strict=True):
        assert row == pytest.approx(want, abs=1e-9)
    # The step weight scales only the step part.
    doubled = gigpo_advantages(
        GIGPO_REWARDS, GIGPO_GROUPS, GIGPO_ANCHORS, gamma=0.5, step_weight=2.0, norm="mean"
    )
    assert doubled[0] == pytest.approx([third + 0.5, third], abs=1e-9)
    assert doubled[3] == pytest.approx([1.5, 0.5], abs=1e-9)


def test_gigpo_mean_std_and_identity_norms():
    got = gigpo_advantages(GIGPO_REWARDS, GIGPO_GROUPS, GIGPO_ANCHORS, gamma=0.5)
    ep0 = (1 / 3) / math.sqrt(1 / 3)  # group 0: sample std of (1, 1, 0) is sqrt(1/3)
    ep1 = 0.5 / math.sqrt(0.5)  # group 1: sample std of (1, 0) is sqrt(1/2)
    # (0, s): returns (0.5, 0.25, 0), sample std 0.25 -> (1, 0, -1); (1, s): (1, 0) -> +-1/sqrt(.5)
    assert got[0] == pytest.approx([ep0 + 1.0, ep0], rel=1e-5)
    assert got[1] == pytest.approx([ep0, ep0, ep0], rel=1e-5)
    assert got[2] == pytest.approx([-2 * ep0 - 1.0], rel=1e-5)
    assert got[3] == pytest.approx([ep1 + ep1, ep1], rel=1e-5)
    assert got[4] == pytest.approx([-ep1 - ep1], rel=1e-5)
    ident = gigpo_advantages(GIGPO_REWARDS, GIGPO_GROUPS, GIGPO_ANCHORS, gamma=0.5, norm="identity")
    # Episode part = the total reward itself; the step part is still centred.
    assert ident[0] == pytest.approx([1 + 0.25, 1.0]) and ident[4] == pytest.approx([0 - 0.5])


def test_gigpo_equals_grpo_when_no_state_repeats():
    rewards = [[0, 1], [1], [0, 0, 0]]
    anchors = [["a", "b"], ["c"], ["d", "e", "f"]]
    got = gigpo_advantages(rewards, [7, 7, 7], anchors)
    episode = group_normalize(torch.tensor([1.0, 1.0, 0.0]), [7, 7, 7]).tolist()
    assert [row[0] for row in got] == pytest.approx(episode, rel=1e-6)
    assert all(len(set(row)) == 1 for row in got)  # every step group is a singleton


def test_equal_scores_give_exactly_zero_whatever_the_rounding():
    """Ten copies of -0.1 sum to -0.9999999999999999, so a mean taken as sum / n is off
    by an ulp; a std division would turn that into ~1e-11. Equal scores must give 0.0
    exactly (a batch of them carries no signal, and is skipped on that test)."""
    scores = torch.full((10,), -0.1, dtype=torch.float64)
    assert torch.equal(group_normalize(scores, [0] * 10), torch.zeros(10, dtype=torch.float64))
    turns = [[-0.1, -0.1]] * 3  # discounted returns: equal within each step group
    out = gigpo_advantages(turns, [0] * 3, [["a", "b"]] * 3)
    assert all(a == 0.0 for row in out for a in row)


def test_gigpo_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="one entry per trajectory"):
        gigpo_advantages([[1.0]], [0, 1], [["a"]])
    with pytest.raises(ValueError, match="2 turn rewards but 1 anchors"):
        gigpo_advantages([[1.0, 0.0]], [0], [["a"]])
    with pytest.raises(ValueError, match="norm"):
        gigpo_advantages([[1.0]], [0], [["a"]], norm="z")
    assert gigpo_advantages([], [], []) == []


def test_masked_mean_and_whiten():
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1.0]])
    x = torch.tensor([[float("nan"), 1.0, 3.0, float("inf")], [2.0, 4.0, 6.0, 8.0]])
    assert masked_mean(x, mask).item() == pytest.approx(24 / 6)
    w = masked_whiten(x, mask).double()
    assert torch.all(w[mask == 0] == 0)
    assert abs(w[mask == 1].mean().item()) < 1e-6
    assert abs(w[mask == 1].std(unbiased=True).item() - 1.0) < 1e-5
    # Two learners holding one part each: the statistics are the whole batch's. Here
    # both parts are x, so summing over the learners doubles every partial sum.
    both = masked_whiten(torch.cat([x, x]), torch.cat([mask, mask]))
    parts = masked_whiten(x, mask, reduce_sum=lambda t: 2 * t)
    assert torch.allclose(parts, both[:2], atol=1e-6)
    assert not torch.allclose(parts, masked_whiten(x, mask), atol=1e-3)  # n - 1 differs


# ----- policy loss ---------------------------------------------------------------------
def one_token(ratio: float, adv: float, **kwargs):
    logp_new = torch.tensor([[math.log(ratio)]], dtype=F64, requires_grad=True)
    loss, stats = policy_loss(logp_new, t64([[0.0]]), t64([[adv]]), t64([[1.0]]), **kwargs)
    loss.backward()
    return loss.item(), logp_new.grad.item(), stats


def test_positive_advantage_clipped_above_has_no_gradient():
    loss, grad, stats = one_token(1.5, 2.0)
    assert loss == pytest.approx(-2.0 * 1.28) and grad == 0.0
    assert stats["clip_frac"].item() == 1.0 and stats["clip_frac_high"].item() == 1.0


def test_negative_advantage_clipped_below_has_no_gradient():
    loss, grad, stats = one_token(0.5, -2.0)
    assert loss == pytest.approx(2.0 * 0.8) and grad == 0.0
    assert stats["clip_frac_low"].item() == 1.0 and stats["clip_frac_high"].item() == 0.0


def test_dual_clip_caps_loss_for_negative_advantage():
    loss, grad, stats = one_token(10.0, -1.5, dual_clip=3.0)
    assert loss == pytest.approx(3.0 * 1.5) and grad == 0.0
    assert stats["dual_clip_frac"].item() == 1.0
    loss, grad, _ = one_token(10.0, -1.5, dual_clip=None)
    assert loss == pytest.approx(15.0) and grad == pytest.approx(15.0)
    loss, _, stats = one_token(2.0, -1.5, dual_clip=3.0)  # below the cap: untouched
    assert loss == pytest.approx(3.0) and stats["dual_clip_frac"].item() == 0.0
    with pytest.raises(ValueError, match="0.5"):
        one_token(1.0, 1.0, dual_clip=0.5)


def test_asymmetric_clip_bounds():
    loss, grad, stats = one_token(1.25, 1.0, clip_high=0.28)
    assert loss == pytest.approx(-1.25) and grad == pytest.approx(-1.25)  # d(-A r)/dlogp = -A r
    assert stats["clip_frac"].item() == 0.0
    loss, grad, stats = one_token(1.25, 1.0, clip_high=0.2)
    assert loss == pytest.approx(-1.2) and grad == 0.0 and stats["clip_frac"].item() == 1.0
    loss, grad, _ = one_token(0.75, -1.0, clip_low=0.2)  # 0.75 < 0.8: clipped below
    assert loss == pytest.approx(0.8) and grad == 0.0


def random_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor(
        [[0, 0, 1, 1, 1, 0, 1, 0], [0, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 0, 0, 0, 0]]
    )
    behaviour_logp = -torch.rand(3, 8, generator=g, dtype=F64) * 2
    logp_new = behaviour_logp + torch.randn(3, 8, generator=g, dtype=F64) * 0.3
    adv = torch.randn(3, 8, generator=g, dtype=F64)
    return logp_new, behaviour_logp, adv, mask.to(F64)


def test_masked_tokens_get_zero_gradient_and_do_not_change_the_loss():
    logp_new, behaviour_logp, adv, mask = random_batch()
    lp = logp_new.clone().requires_grad_(True)
    loss, _ = policy_loss(lp, behaviour_logp, adv, mask)
    loss.backward()
    assert torch.all(lp.grad[mask == 0] == 0)
    assert torch.count_nonzero(lp.grad[mask == 1]) > 0
    off = mask == 0
    lp2 = torch.where(off, torch.full_like(logp_new, 1e4), logp_new).requires_grad_(True)
    old2 = torch.where(off, torch.full_like(behaviour_logp, -1e4), behaviour_logp)
    adv2 = torch.where(off, torch.full_like(adv, float("nan")), adv)
    loss2, stats2 = policy_loss(lp2, old2, adv2, mask)
    loss2.backward()
    assert loss2.item() == loss.item()
    assert torch.all(lp2.grad[off] == 0) and not torch.isnan(lp2.grad).any()
    assert all(torch.isfinite(v) for v in stats2.values())


def manual_token_losses(logp_new, behaviour_logp, adv, mask, lo=0.2, hi=0.28, c=3.0):
    out = []
    for b in range(mask.shape[0]):
        row = []
        for t in range(mask.shape[1]):
            if mask[b, t] == 0:
                continue
            r, a = math.exp(logp_new[b, t] - behaviour_logp[b, t]), adv[b, t].item()
            loss = max(-a * r, -a * min(max(r, 1 - lo), 1 + hi))
            row.append(min(loss, -a * c) if a < 0 else loss)
        out.append(row)
    return out


def test_loss_aggregations_match_manual_computation():
    logp_new, behaviour_logp, adv, mask = random_batch(3)
    logp_new[0, 2] = behaviour_logp[0, 2] + 2.0  # a large ratio so some clipping happens
    adv[0, 2] = -1.0
    rows = manual_token_losses(logp_new, behaviour_logp, adv, mask)
    flat = [x for row in rows for x in row]
    expected = {
        "token-mean": sum(flat) / len(flat),
        "seq-mean-token-sum": sum(sum(r) for r in rows) / len(rows),
        "seq-mean-token-mean": sum(sum(r) / len(r) for r in rows) / len(rows),
    }
    for agg, value in expected.items():
        loss, stats = policy_loss(logp_new, behaviour_logp, adv, mask, agg=agg)
        assert loss.item() == pytest.approx(value, abs=1e-12), agg
    ratio = (logp_new - behaviour_logp).exp()[mask == 1]
    k3 = (ratio - 1 - ratio.log()).mean()
    assert stats["approx_kl"].item() == pytest.approx(k3.item())
    assert stats["ratio_max"].item() == pytest.approx(ratio.max().item())
    with pytest.raises(ValueError, match="sum"):
        policy_loss(logp_new, behaviour_logp, adv, mask, agg="sum")


# ----- value loss, entropy, KL ---------------------------------------------------------
def test_value_loss_clipping():
    mask = t64([[1.0, 1.0, 0.0]])
    values = t64([[1.0, 2.0, 50.0]]).requires_grad_(True)
    old, returns = t64([[0.0, 0.0, 0.0]]), t64([[1.0, 0.0, 0.0]])
    loss = value_loss(values, old, returns, mask, clip=0.5)
    # Token 0: unclipped 0, clipped (0.5 - 1)^2 = 0.25 -> 0.25.  Token 1: max(4, 0.25) = 4.
    assert loss.item() == pytest.approx(0.5 * (0.25 + 4.0) / 2)
    loss.backward()
    assert values.grad.tolist() == [[0.0, pytest.approx(0.5 * 2 * 2.0 / 2), 0.0]]
    assert value_loss(values, old, returns, mask, clip=None).item() == pytest.approx(0.5 * 4 / 2)


def test_entropy_of_uniform_logits_is_log_v():
    for v in (2, 7, 151_936):
        logits = torch.full((1, 2, v), 3.5, dtype=torch.bfloat16)
        _, entropy = token_logprobs_and_entropy(logits, torch.zeros((1, 2), dtype=torch.long))
        torch.testing.assert_close(entropy, torch.full((1, 2), math.log(v)))
    x = torch.randn(4, 10, dtype=F64) * 5
    naive = -(x.softmax(-1) * x.log_softmax(-1)).sum(-1)
    _, entropy = token_logprobs_and_entropy(x[None], torch.zeros((1, 4), dtype=torch.long))
    torch.testing.assert_close(entropy[0], naive)


def test_kl_penalty_estimators():
    logp, ref = t64([-1.0, -2.0, -0.5]), t64([-1.5, -1.0, -0.5])
    d = logp - ref
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), d)
    torch.testing.assert_close(kl_penalty(logp, ref, "abs"), d.abs())
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), 0.5 * d**2)
    k3 = kl_penalty(logp, ref, "k3")
    torch.testing.assert_close(k3, (-d).exp() - 1 + d)
    assert torch.all(k3 >= 0) and k3[2] == 0
    torch.testing.assert_close(kl_penalty(logp, ref, "k3_st"), k3)  # k3's value
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(logp, ref, "k4")


def test_kl_estimators_expected_gradients():
    """The expected gradient of each estimator used as a loss on tokens y ~ pi (the
    sampling not differentiated), computed exactly over a 5-token distribution."""
    theta = torch.tensor([0.3, -1.2, 0.8, 0.0, -0.4], dtype=F64, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([1.0, 0.2, -0.5, 0.1, 0.0], dtype=F64), 0)

    def expected_grad(kind):
        logp = torch.log_softmax(theta, 0)
        weights = logp.exp().detach()  # E over y ~ pi
        (grad,) = torch.autograd.grad((weights * kl_penalty(logp, ref, kind)).sum(), theta)
        return grad

    logp = torch.log_softmax(theta, 0)
    (reverse,) = torch.autograd.grad((logp.exp() * (logp - ref)).sum(), theta)  # KL(pi||ref)
    logp = torch.log_softmax(theta, 0)
    (forward,) = torch.autograd.grad((ref.exp() * (ref - logp)).sum(), theta)  # KL(ref||pi)
    assert reverse.abs().max() > 0.05 and (reverse - forward).abs().max() > 0.05
    torch.testing.assert_close(expected_grad("k1"), torch.zeros(5, dtype=F64))
    torch.testing.assert_close(expected_grad("k2"), reverse)
    torch.testing.assert_close(expected_grad("k3_st"), reverse)
    torch.testing.assert_close(expected_grad("k3"), forward)


@pytest.mark.parametrize("chunk", [1, 4, 10, 10_000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_entropy_equal_naive(chunk, temperature):
    g = torch.Generator().manual_seed(0)
    full = (torch.randn(3, 8, 50, generator=g) * 4).requires_grad_(True)
    logits = full[:, :-1]  # non-contiguous, as the RL module passes it
    targets = torch.randint(0, 50, (3, 7), generator=g)
    weights = torch.randn(2, 3, 7, generator=g)

    logp, ent = token_logprobs_and_entropy(logits, targets, temperature, chunk=chunk)
    (logp * weights[0] + ent * weights[1]).sum().backward()
    grad_chunked, full.grad = full.grad.clone(), None

    logsm = (logits / temperature).log_softmax(-1)
    naive_logp = logsm.gather(-1, targets[..., None]).squeeze(-1)
    naive_ent = -(logsm.exp() * logsm).sum(-1)
    (naive_logp * weights[0] + naive_ent * weights[1]).sum().backward()
    torch.testing.assert_close(logp, naive_logp, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, naive_ent, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(grad_chunked, full.grad, atol=1e-6, rtol=1e-5)
