"""The learner's loss: an extreme log-ratio keeps the gradient finite, and one update's
total loss equals an independent formula (entropy, KL, value terms and the world
factor included). No Ray."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import loss_config

from ragen_rllib.learner.kl_estimators import kl_penalty
from ragen_rllib.learner.loss import Denominators, minibatch_logs, starpo_loss
from ragen_rllib.learner.policy_losses import policy_loss
from ragen_rllib.maths.log_ratio import LOG_RATIO_BOUND
from ragen_rllib.rl_module.logprobs import token_logprobs_and_entropy

F64 = torch.float64


# ----- an extreme log-ratio -----------------------------------------------------------
@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_an_extreme_log_ratio_gives_a_finite_gradient(advantage):
    """A token whose new log-prob is 100 nats above the behaviour one: exp(100)
    overflows float32, and without the clamp the backward pass is NaN (the loss
    itself stays finite, since the clipped term is chosen)."""
    logp_new = torch.tensor([[-0.5, -1.0, -2.0]], requires_grad=True)
    behaviour = torch.tensor([[-0.6, -101.0, -2.1]])
    adv = torch.full((1, 3), advantage)
    mask = torch.ones(1, 3)
    loss, stats = policy_loss(logp_new, behaviour, adv, mask)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logp_new.grad).all(), logp_new.grad
    # The clamped token's ratio is exp(20): the clamp gives it no gradient (with a
    # negative advantage and no dual clip, one the unclipped objective would have;
    # dropped on purpose, see learner/loss_terms.py); the other tokens keep theirs.
    assert logp_new.grad[0, 1] == 0.0
    assert logp_new.grad[0, 0] != 0.0
    assert stats["ratio_max"] == pytest.approx(math.exp(LOG_RATIO_BOUND), rel=1e-5)


def test_a_masked_vocabulary_entry_leaves_the_entropy_finite():
    """A logit of -inf (a masked entry) has probability 0 and adds 0 to the entropy,
    not 0 * -inf = NaN; the gradient stays finite too."""
    logits = torch.tensor([[[0.0, 1.0, -math.inf]]], requires_grad=True)
    logp, entropy = token_logprobs_and_entropy(logits, torch.tensor([[1]]))
    p = torch.softmax(torch.tensor([0.0, 1.0]), -1)
    assert entropy.item() == pytest.approx(float(-(p * p.log()).sum()), rel=1e-6)  # 0.582
    assert entropy.item() == pytest.approx(0.582, abs=1e-3)
    (logp.sum() + entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all(), logits.grad


@pytest.mark.parametrize("kind", ["k3", "k3_st"])
def test_k3_stays_finite_far_below_the_reference(kind):
    logp = torch.tensor([-120.0, -1.0], requires_grad=True)  # d = -119: exp(119) overflows
    ref = torch.tensor([-1.0, -1.2])
    kl = kl_penalty(logp, ref, kind)
    kl.sum().backward()
    assert torch.isfinite(kl).all() and torch.isfinite(logp.grad).all(), (kl, logp.grad)
    # Inside the bound nothing changes: the second token is exact.
    d = 0.2
    assert kl[1].item() == pytest.approx(math.expm1(-d) + d, rel=1e-5)


def test_log_ratios_inside_the_bound_are_exact():
    logp_new = torch.tensor([[-1.0, -2.0]], dtype=F64, requires_grad=True)
    behaviour = torch.tensor([[-1.1, -1.95]], dtype=F64)
    adv = torch.tensor([[0.5, -0.7]], dtype=F64)
    loss, _ = policy_loss(logp_new, behaviour, adv, torch.ones(1, 2), clip_low=0.5, clip_high=0.5)
    ratios = [math.exp(0.1), math.exp(-0.05)]
    assert loss.item() == pytest.approx(-(0.5 * ratios[0] - 0.7 * ratios[1]) / 2, rel=1e-12)


# ----- one update's total loss, from an independent formula -----------------------------
config = loss_config


def random_batch(seed=0, rows=3, width=6):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) > 0.3).double()
    mask[:, 0] = 0  # the prompt's first token is never scored
    batch = {
        "response_mask": mask,
        "behaviour_logp": -torch.rand(rows, width, generator=g, dtype=F64) * 2,
        "advantages": torch.randn(rows, width, generator=g, dtype=F64),
        "old_values": torch.randn(rows, width, generator=g, dtype=F64),
        "value_targets": torch.randn(rows, width, generator=g, dtype=F64),
    }
    fwd = {
        "logp": batch["behaviour_logp"] + torch.randn(rows, width, generator=g, dtype=F64) * 0.4,
        "entropy": torch.rand(rows, width, generator=g, dtype=F64) * 3,
        "values": batch["old_values"] + torch.randn(rows, width, generator=g, dtype=F64),
    }
    ref = fwd["logp"] + torch.randn(rows, width, generator=g, dtype=F64) * 0.3
    return batch, fwd, ref


def independent_total(cfg, batch, fwd, ref, tokens, world):
    """The loss written out token by token in plain Python floats."""
    pg = ent = kl = vf = 0.0
    rows, width = batch["response_mask"].shape
    for b in range(rows):
        for t in range(width):
            if batch["response_mask"][b, t] == 0:
                continue
            a = float(batch["advantages"][b, t])
            r = math.exp(float(fwd["logp"][b, t] - batch["behaviour_logp"][b, t]))
            clipped = min(max(r, 1 - cfg.clip_low), 1 + cfg.clip_high)
            term = max(-a * r, -a * clipped)
            if a < 0:
                term = min(term, -a * cfg.dual_clip)
            pg += term
            ent += float(fwd["entropy"][b, t])
            d = float(fwd["logp"][b, t] - ref[b, t])
            kl += math.exp(-d) - 1 + d  # k3
            v, v_old = float(fwd["values"][b, t]), float(batch["old_values"][b, t])
            target = float(batch["value_targets"][b, t])
            v_clip = v_old + min(max(v - v_old, -cfg.vf_clip), cfg.vf_clip)
            vf += 0.5 * max((v - target) ** 2, (v_clip - target) ** 2)
    total = (
        pg / tokens
        - cfg.entropy_coeff * ent / tokens
        + cfg.kl_coeff * kl / tokens
        + cfg.vf_loss_coeff * vf / tokens
    )
    return total * world


def test_one_update_total_equals_the_independent_formula():
    cfg = config()
    batch, fwd, ref = random_batch()
    denoms = Denominators.of(batch["response_mask"])
    total, logs = starpo_loss(cfg, batch, fwd, denoms, lambda: ref)
    tokens = float(batch["response_mask"].sum())
    assert total.item() == pytest.approx(independent_total(cfg, batch, fwd, ref, tokens, 1), 1e-9)
    # What is logged adds back up to the total.
    back = (
        logs["policy_loss"]
        - cfg.entropy_coeff * logs["entropy"]
        + cfg.kl_coeff * logs["kl_to_reference"]
        + cfg.vf_loss_coeff * logs["value_loss"]
    )
    assert back.item() == pytest.approx(total.item(), 1e-9)


def test_micro_batches_and_learners_share_the_minibatch_loss():
    """Split into micro-batches (rows) on two "learners": with the minibatch's
    denominators and the world factor, each part is its share, the parts' totals add
    up to world x the whole loss (DDP then averages the gradients), and the logged
    terms (shares x world, averaged over learners) are the whole minibatch's."""
    cfg = config()
    batch, fwd, ref = random_batch(seed=1, rows=4)
    whole, whole_logs = starpo_loss(
        cfg, batch, fwd, Denominators.of(batch["response_mask"]), lambda: ref
    )
    world = 2
    tokens = batch["response_mask"].sum().clamp_min(1).float()
    sequences = (batch["response_mask"].sum(1) > 0).sum().float()
    denoms = Denominators(tokens, sequences, world)
    learners = [[[0], [1]], [[2, 3]]]  # learner -> its micro-batches (rows)
    totals, per_learner_logs = [], []
    for micro_batches in learners:
        parts = []
        for rows in micro_batches:
            take = {k: v[rows] for k, v in batch.items()}
            out = {k: v[rows] for k, v in fwd.items()}
            total, logs = starpo_loss(cfg, take, out, denoms, lambda rows=rows: ref[rows])
            totals.append(total)
            parts.append(logs)
        per_learner_logs.append(minibatch_logs(parts, world))
    assert sum(t.item() for t in totals) == pytest.approx(world * whole.item(), 1e-6)
    for key in ("policy_loss", "entropy", "kl_to_reference", "value_loss", "clip_frac"):
        mean_over_learners = sum(logs[key].item() for logs in per_learner_logs) / world
        assert mean_over_learners == pytest.approx(whole_logs[key].item(), rel=1e-5), key
    total_tokens = sum(logs["response_tokens"].item() for logs in per_learner_logs) / world
    assert total_tokens == batch["response_mask"].sum().item()


def test_seq_mean_aggregation_uses_the_sequence_count():
    cfg = config(loss_agg_used="seq-mean-token-sum", kl_coeff=0.0, entropy_coeff=0.0)
    batch, fwd, _ = random_batch(seed=2)
    fwd = {k: v for k, v in fwd.items() if k != "values"}
    denoms = Denominators.of(batch["response_mask"])
    total, _ = starpo_loss(cfg, batch, fwd, denoms)
    mask = batch["response_mask"] > 0
    ratio = (fwd["logp"] - batch["behaviour_logp"]).exp()
    adv = batch["advantages"]
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * 3.0), pg)
    per_seq = torch.where(mask, pg, 0).sum(1)
    expected = per_seq[mask.any(1)].sum() / mask.any(1).sum()
    assert total.item() == pytest.approx(expected.item(), 1e-9)
