"""The loss menu (PPO, GSPO, CISPO) and the rollout correction (TIS, MIS; per token and
per sequence) against independent implementations written from each method's
definition, on random batches with ragged masks; and the same loss when a minibatch
is cut into micro-batches on two learners. No Ray.

The independent side is plain Python floats, token by token (values), or the
sequence-level objective as GSPO's paper writes it with autograd through the
sequence ratio itself (gradients)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import loss_config

from ragen_rllib.learner.loss import Denominators, minibatch_logs, starpo_loss
from ragen_rllib.learner.policy_losses import policy_loss
from ragen_rllib.maths.off_policy import correction_weights, mismatch_stats, mismatch_sums

F64 = torch.float64
KINDS = ("ppo", "gspo", "cispo")
CORRECTIONS = ("none", "tis", "mis")
LEVELS = ("token", "sequence")
AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
SEEDS = range(6)


def config(**over):
    """The loss menu's settings on random batches: no entropy or KL term."""
    return loss_config(
        **{
            "gspo_clip_low": 0.03,  # wider than GSPO's default, so that both sides of
            "gspo_clip_high": 0.04,  # the clip occur in small random batches
            "cispo_weight_cap": 1.3,
            "rollout_correction_cap": 1.5,
            "entropy_coeff": 0.0,
            "kl_coeff": 0.0,
            **over,
        }
    )


def random_batch(seed, rows=5, width=9):
    """Ragged masks (a row may have no response token), log-probs of three policies
    that differ by up to ~0.5 nats, per-token advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) > 0.35).double()
    mask[:, 0] = 0
    mask[seed % rows] = 0  # one row without a response token
    behaviour = -torch.rand(rows, width, generator=g, dtype=F64) * 3
    proximal = behaviour + torch.randn(rows, width, generator=g, dtype=F64) * 0.25
    current = proximal + torch.randn(rows, width, generator=g, dtype=F64) * 0.1
    batch = {
        "response_mask": mask,
        "behaviour_logp": behaviour,
        "proximal_logp": proximal,
        "advantages": torch.randn(rows, width, generator=g, dtype=F64),
    }
    fwd = {"logp": current.clone().requires_grad_(True), "entropy": torch.zeros_like(current)}
    return batch, fwd


# ----- the independent side ------------------------------------------------------------
def cells(mask):
    rows, width = mask.shape
    return [(b, t) for b in range(rows) for t in range(width) if mask[b, t] > 0]


def weights_by_definition(cfg, batch):
    """Per token: the behaviour -> proximal importance weight after TIS/MIS."""
    mask = batch["response_mask"]
    w = {}
    for b, t in cells(mask):
        if cfg.rollout_correction_level == "token":
            log_w = float(batch["proximal_logp"][b, t] - batch["behaviour_logp"][b, t])
        else:  # the sequence's weight: the product of its tokens' ratios
            log_w = sum(
                float(batch["proximal_logp"][b, s] - batch["behaviour_logp"][b, s])
                for s in range(mask.shape[1])
                if mask[b, s] > 0
            )
        raw, cap = math.exp(log_w), cfg.rollout_correction_cap
        if cfg.rollout_correction == "tis":
            w[b, t] = min(raw, cap)
        elif cfg.rollout_correction == "mis":
            w[b, t] = raw if 1 / cap <= raw <= cap else 0.0
        else:
            w[b, t] = 1.0
    return w


def token_terms_by_definition(cfg, batch, logp):
    """Per token: the policy loss term (before aggregation), from the definitions."""
    mask = batch["response_mask"]
    old = batch["proximal_logp"] if cfg.rollout_correction != "none" else batch["behaviour_logp"]
    weights = weights_by_definition(cfg, batch)
    terms = {}
    for b, t in cells(mask):
        a = float(batch["advantages"][b, t])
        r = math.exp(float(logp[b, t] - old[b, t]))
        if cfg.policy_loss == "cispo":
            term = -min(r, cfg.cispo_weight_cap) * a * float(logp[b, t])
        else:
            low, high = cfg.clip_low, cfg.clip_high
            if cfg.policy_loss == "gspo":
                row = [s for s in range(mask.shape[1]) if mask[b, s] > 0]
                r = math.exp(sum(float(logp[b, s] - old[b, s]) for s in row) / len(row))
                low, high = cfg.gspo_clip_low, cfg.gspo_clip_high
            term = max(-a * r, -a * min(max(r, 1 - low), 1 + high))
            if a < 0 and cfg.dual_clip is not None:
                term = min(term, -a * cfg.dual_clip)
        terms[b, t] = term * weights[b, t]
    return terms


def aggregate_by_definition(cfg, terms, mask):
    rows = sorted({b for b, _ in terms})
    if cfg.loss_agg_used == "token-mean":
        return sum(terms.values()) / len(terms)
    per_row = []
    for b in rows:
        row = [v for (bb, _), v in terms.items() if bb == b]
        if cfg.loss_agg_used == "seq-mean-token-mean":
            per_row.append(sum(row) / len(row))
        elif cfg.loss_agg_used == "seq-mean-token-sum":
            per_row.append(sum(row))
        else:
            per_row.append(sum(row) / cfg.loss_norm_tokens)
    return sum(per_row) / len(per_row)


CASES = list(itertools.product(KINDS, CORRECTIONS, LEVELS, SEEDS))


@pytest.mark.parametrize(("kind", "correction", "level", "seed"), CASES)
def test_each_loss_equals_its_definition(kind, correction, level, seed):
    """Value of every (loss, correction, level) on random ragged batches, under each
    aggregation: 3 x 3 x 2 x 6 seeds = 108 cases, 4 aggregations each."""
    if correction == "none" and level == "sequence":
        pytest.skip("the level is unused without a correction")
    batch, fwd = random_batch(seed)
    for agg in AGGS:
        cfg = config(
            policy_loss=kind,
            rollout_correction=correction,
            rollout_correction_level=level,
            loss_agg_used=agg,
        )
        total, _ = starpo_loss(cfg, batch, fwd, Denominators.of(batch["response_mask"]))
        terms = token_terms_by_definition(cfg, batch, fwd["logp"].detach())
        expected = aggregate_by_definition(cfg, terms, batch["response_mask"])
        assert total.item() == pytest.approx(expected, rel=1e-9, abs=1e-12), (agg, kind)


@pytest.mark.parametrize("seed", SEEDS)
def test_gspo_token_form_has_the_sequence_objectives_gradient(seed):
    """GSPO's paper: J = mean_i min(s_i A_i, clip(s_i) A_i), s_i = exp(mean_t log r_it),
    one advantage per sequence. With seq-mean-token-mean and no dual clip, the
    token form's value and gradient equal that objective's (autograd through s_i)."""
    batch, fwd = random_batch(seed)
    mask = batch["response_mask"]
    adv = torch.randn(mask.shape[0], 1, generator=torch.Generator().manual_seed(seed), dtype=F64)
    batch["advantages"] = adv.expand_as(mask).clone()
    cfg = config(policy_loss="gspo", loss_agg_used="seq-mean-token-mean", dual_clip=None)
    total, _ = starpo_loss(cfg, batch, fwd, Denominators.of(mask))
    (grad,) = torch.autograd.grad(total, fwd["logp"])

    logp = fwd["logp"].detach().clone().requires_grad_(True)
    objective = []
    for b in range(mask.shape[0]):
        row = mask[b] > 0
        if not row.any():
            continue
        s = torch.exp((logp[b][row] - batch["behaviour_logp"][b][row]).mean())
        a = adv[b, 0]
        clipped = s.clamp(1 - cfg.gspo_clip_low, 1 + cfg.gspo_clip_high)
        objective.append(torch.minimum(s * a, clipped * a))
    loss = -torch.stack(objective).mean()
    (expected,) = torch.autograd.grad(loss, logp)
    assert total.item() == pytest.approx(loss.item(), rel=1e-9)
    assert torch.allclose(grad, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_cispo_gives_every_token_a_gradient_of_its_clipped_weight(seed):
    """CISPO: d loss / d log pi_t = -sg(min(r_t, cap)) A_t / tokens, on every
    response token, including those whose ratio is past the clip (where PPO's is 0)."""
    batch, fwd = random_batch(seed)
    cfg = config(policy_loss="cispo")
    mask = batch["response_mask"]
    total, stats = starpo_loss(cfg, batch, fwd, Denominators.of(mask))
    (grad,) = torch.autograd.grad(total, fwd["logp"])
    n = float(mask.sum())
    ratio = (fwd["logp"].detach() - batch["behaviour_logp"]).exp()
    expected = -ratio.clamp(max=cfg.cispo_weight_cap) * batch["advantages"] / n * mask
    assert torch.allclose(grad, expected, rtol=1e-9, atol=1e-15)
    past = (ratio > cfg.cispo_weight_cap) & (mask > 0)
    assert stats["clip_frac"].item() == pytest.approx(float(past.sum()) / n)
    assert bool(((grad != 0) == (mask > 0) & (batch["advantages"] != 0)).all())


@pytest.mark.parametrize(
    ("mode", "level", "seed"), list(itertools.product(("tis", "mis"), LEVELS, SEEDS))
)
def test_correction_weights_and_their_stats_equal_the_definition(mode, level, seed):
    batch, _ = random_batch(seed)
    cfg = config(rollout_correction=mode, rollout_correction_level=level)
    mask = batch["response_mask"]
    weights, stats = correction_weights(
        batch["proximal_logp"], batch["behaviour_logp"], mask, mode=mode, level=level, cap=1.5
    )
    expected = weights_by_definition(cfg, batch)
    for (b, t), w in expected.items():
        assert weights[b, t].item() == pytest.approx(w, rel=1e-6), (b, t)
    assert float(weights[mask == 0].abs().sum()) == 0.0
    corrected = [w for w in expected.values()]
    raw = []
    for b, t in cells(mask):
        if level == "token":
            raw.append(
                math.exp(float(batch["proximal_logp"][b, t] - batch["behaviour_logp"][b, t]))
            )
        else:
            raw.append(
                math.exp(
                    float(
                        ((batch["proximal_logp"][b] - batch["behaviour_logp"][b]) * mask[b]).sum()
                    )
                )
            )
    changed = sum(1 for r, w in zip(raw, corrected, strict=True) if abs(r - w) > 1e-12)
    assert stats["is_corrected_frac"].item() == pytest.approx(changed / len(raw))
    assert stats["is_weight_mean"].item() == pytest.approx(sum(raw) / len(raw), rel=1e-6)
    assert stats["is_weight_max"].item() == pytest.approx(max(raw), rel=1e-6)


@pytest.mark.parametrize(("kind", "correction", "level"), [
    (k, c, lv) for k, c, lv in itertools.product(KINDS, CORRECTIONS, LEVELS)
    if not (c == "none" and lv == "sequence")
])  # fmt: skip
def test_micro_batches_on_two_learners_add_up_to_the_minibatch(kind, correction, level):
    """Rows cut into micro-batches on two "learners", with the minibatch's
    denominators and the world factor: the parts' losses and gradients add up to
    world x the whole minibatch's, and the logged terms (shares x world, averaged
    over the learners) are the whole minibatch's (maxima: the larger learner's)."""
    for agg in ("token-mean", "seq-mean-token-mean"):
        cfg = config(
            policy_loss=kind,
            rollout_correction=correction,
            rollout_correction_level=level,
            loss_agg_used=agg,
        )
        batch, fwd = random_batch(7, rows=6)
        mask = batch["response_mask"]
        whole, whole_logs = starpo_loss(cfg, batch, fwd, Denominators.of(mask))
        (whole_grad,) = torch.autograd.grad(whole, fwd["logp"])
        world = 2
        denoms = Denominators(mask.sum().float(), (mask.sum(1) > 0).sum().float(), world)
        grad = torch.zeros_like(whole_grad)
        totals, per_learner = [], []
        for micro_batches in ([[0, 1], [2]], [[3], [4, 5]]):
            parts = []
            for rows in micro_batches:
                take = {k: v[rows] for k, v in batch.items()}
                logp = fwd["logp"].detach()[rows].clone().requires_grad_(True)
                total, logs = starpo_loss(
                    cfg, take, {"logp": logp, "entropy": fwd["entropy"][rows]}, denoms
                )
                (g,) = torch.autograd.grad(total, logp)
                grad[rows] += g
                totals.append(total.item())
                parts.append(logs)
            per_learner.append(minibatch_logs(parts, world))
        assert sum(totals) == pytest.approx(world * whole.item(), rel=1e-9)
        assert torch.allclose(grad, world * whole_grad, rtol=1e-9, atol=1e-14)
        for key, value in whole_logs.items():
            if key in ("ratio_max", "is_weight_max"):
                got = max(logs[key].item() for logs in per_learner)
            else:
                got = sum(logs[key].item() for logs in per_learner) / world
            # logged in float32 (minibatch_logs), so to float32 precision
            assert got == pytest.approx(value.item(), rel=1e-5, abs=1e-7), (key, agg)


def test_mismatch_figures_equal_the_definition():
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(4, 7, generator=g) > 0.3).float()
    behaviour = -torch.rand(4, 7, generator=g) * 2
    learner = behaviour + torch.randn(4, 7, generator=g) * 0.1
    lag = torch.tensor([[0] * 7, [1] * 7, [0] * 7, [2] * 7])
    stats = mismatch_stats(mismatch_sums(learner, behaviour, mask, lag))
    same, every = [], []
    for b, t in cells(mask):
        d = float(learner[b, t] - behaviour[b, t])
        k3 = math.exp(d) - 1 - d  # KL(engine || learner) from the engine's samples
        every.append((k3, int(lag[b, t])))
        if lag[b, t] == 0:
            same.append((k3, abs(d)))
    assert stats["rollout_mismatch_kl"] == pytest.approx(
        sum(k for k, _ in same) / len(same), rel=1e-5
    )
    assert stats["rollout_mismatch_max_abs"] == pytest.approx(max(d for _, d in same), rel=1e-6)
    assert stats["rollout_mismatch_tokens"] == len(same)
    assert stats["off_policy_kl"] == pytest.approx(sum(k for k, _ in every) / len(every), rel=1e-5)
    assert stats["token_lag_mean"] == pytest.approx(sum(x for _, x in every) / len(every))
    assert stats["token_lag_max"] == 2
    # Nothing sampled with the learner's weights: no same-weights figure, rather than 0.
    none_same = mismatch_stats(mismatch_sums(learner, behaviour, mask, lag + 1))
    assert "rollout_mismatch_kl" not in none_same and none_same["token_lag_max"] == 3


def test_the_plain_ppo_path_is_unchanged_by_the_menu():
    """policy_loss ppo without correction takes the ratio against the behaviour
    log-probs, exactly as before the menu existed (no weights, no proximal column)."""
    batch, fwd = random_batch(3)
    batch.pop("proximal_logp")
    loss, _ = starpo_loss(config(), batch, fwd, Denominators.of(batch["response_mask"]))
    direct, _ = policy_loss(fwd["logp"], batch["behaviour_logp"], batch["advantages"],
                            batch["response_mask"])  # fmt: skip
    assert loss.item() == direct.item()


#: GSPO's sequence loss exactly: one advantage per row, the mean over each row's tokens.
GSPO_SEQUENCE = {"kind": "gspo", "dual_clip": None, "agg": "seq-mean-token-mean"}


def test_gspo_bounds_the_sequence_log_ratio_after_the_mean_not_each_token():
    """One token far past the bound among small negative ones: the row's mean
    log-ratio is small, so the row keeps its gradient, as in GSPO's own form (a
    per-token clamp before the mean pushed s out of the clip range and zeroed it)."""
    old = torch.zeros(1, 100, dtype=F64)
    logp = torch.full((1, 100), -0.25, dtype=F64)
    logp[0, 37] = 24.8  # mean log-ratio (24.8 - 99 * 0.25) / 100 = 0.0005
    logp.requires_grad_(True)
    mask = torch.ones(1, 100, dtype=F64)
    adv = -torch.ones(1, 100, dtype=F64)
    loss, _ = policy_loss(logp, old, adv, mask, clip_low=3e-4, clip_high=4e-4, **GSPO_SEQUENCE)
    loss.backward()
    s = math.exp(0.0005)
    assert float(loss.detach()) == pytest.approx(s, rel=1e-9)
    # d(-A s)/d log pi_t = s / 100 on every token, the outlier included
    assert torch.allclose(logp.grad, torch.full_like(logp, s / 100), rtol=1e-9)


def test_gspo_row_past_the_bound_gets_the_bounds_value_and_no_gradient():
    old = torch.zeros(2, 4, dtype=F64)
    logp = torch.tensor([[30.0, 30.0, 30.0, 30.0], [0.01, 0.02, -0.01, 0.0]], dtype=F64)
    logp.requires_grad_(True)
    mask, adv = torch.ones(2, 4, dtype=F64), -torch.ones(2, 4, dtype=F64)
    loss, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, **GSPO_SEQUENCE)
    loss.backward()
    assert math.isfinite(float(loss.detach()))
    assert float(loss.detach()) == pytest.approx((math.exp(20.0) + math.exp(0.005)) / 2, rel=1e-9)
    assert torch.all(logp.grad[0] == 0)
    assert torch.all(logp.grad[1] != 0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_token_of_probability_zero_keeps_every_loss_finite(kind):
    """log pi = -inf on one response token (the policy now rules the sampled token
    out): the loss and every gradient stay finite, the other tokens' gradients are
    those of the batch without that token's term, and CISPO's update is not lost."""
    batch, fwd = random_batch(3)
    mask = batch["response_mask"]
    b, t = next(
        (b, t) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t] > 0
    )
    logp = fwd["logp"].detach().clone()
    logp[b, t] = float("-inf")
    logp.requires_grad_(True)
    loss, stats = policy_loss(
        logp,
        batch["behaviour_logp"],
        batch["advantages"],
        mask,
        kind=kind,
        options={"cap": 5.0} if kind == "cispo" else None,
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=3.0,
    )
    loss.backward()
    assert math.isfinite(float(loss.detach())), kind
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[b, t] == 0
    assert logp.grad[mask > 0].abs().sum() > 0
    assert all(torch.isfinite(v) for v in stats.values())


def test_a_new_policy_loss_is_one_registered_function():
    """Adding a loss: one function registered with the knobs it reads. The config then
    accepts its name (and names it among the allowed values), and the learner's loss
    computes it with no other change: here plain REINFORCE with an importance weight,
    l = -A r, with an option of its own read from an existing knob."""
    from ragen_rllib.learner.policy_losses import (
        POLICY_LOSSES,
        LossTerms,
        register_policy_loss,
    )

    @register_policy_loss(
        "scaled_is_pg", "-A r, scaled", clip_knobs=None, option_knobs={"scale": "vf_clip"},
        uses_dual_clip=False,
    )  # fmt: skip
    def scaled_is_pg(x):
        none = torch.zeros_like(x.mask)
        return LossTerms(-x.options["scale"] * x.advantages * x.ratio, none, none)

    try:
        cfg = config(policy_loss="scaled_is_pg", vf_clip=0.5)
        batch, fwd = random_batch(1)
        loss, logs = starpo_loss(cfg, batch, fwd, Denominators.of(batch["response_mask"]))
        mask = batch["response_mask"]
        expected = sum(
            -0.5 * float(batch["advantages"][b, t])
            * math.exp(float(fwd["logp"].detach()[b, t] - batch["behaviour_logp"][b, t]))
            for b, t in cells(mask)
        ) / len(cells(mask))  # fmt: skip
        assert float(loss.detach()) == pytest.approx(expected, rel=1e-9)
        assert float(logs["clip_frac"]) == 0.0
        from conftest import tiny_config

        tiny_config(policy_loss="scaled_is_pg").validate()  # the registry's rows, live
    finally:
        del POLICY_LOSSES["scaled_is_pg"]
    with pytest.raises(ValueError, match=r"policy_loss.*\['ppo', 'gspo', 'cispo'\]"):
        from conftest import tiny_config

        tiny_config(policy_loss="scaled_is_pg").validate()


def test_a_policy_loss_is_given_exactly_its_options():
    batch, fwd = random_batch(2)
    args = (fwd["logp"], batch["behaviour_logp"], batch["advantages"], batch["response_mask"])
    with pytest.raises(ValueError, match=r"'cispo' takes the options \['cap'\]"):
        policy_loss(*args, kind="cispo")
    with pytest.raises(ValueError, match=r"'ppo' takes the options \[\]"):
        policy_loss(*args, kind="ppo", options={"cap": 2.0})
