"""StarPO's loss for one micro-batch: its share of the minibatch's loss on all learners.

The loss of a minibatch is the policy loss (``policy_loss``, a row of
:mod:`~ragen_rllib.learner.policy_losses`: PPO's clipped surrogate with asymmetric
and dual clip, GSPO or CISPO; ``loss_agg``; with
``rollout_correction``, its ratio taken against the proximal log-probs and each
token weighted by the truncated or masked importance weight of
:mod:`ragen_rllib.maths.off_policy`), minus ``entropy_coeff`` times the
token-mean entropy, plus ``kl_coeff`` times the token-mean KL to the reference model
(``kl_estimator``, a row of :mod:`~ragen_rllib.learner.kl_estimators`), plus
``vf_loss_coeff`` times the clipped value loss (with a critic).

A minibatch may be split into micro-batches (memory) and between learners
(DDP/FSDP). Every term is therefore divided by the minibatch's counts of
response tokens (or sequences, for the seq-mean aggregations) summed over all
learners (:class:`Denominators`), not by the micro-batch's own: the micro-batch
losses then add up to the minibatch's loss on one learner, and the learners'
shares add up to the whole minibatch's. DDP averages the learners' gradients,
so the total that is back-propagated is multiplied by the number of learners.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ragen_rllib.distributed.collectives import (
    learner_count,
    maximum_over_learners,
    summed_over_learners,
)
from ragen_rllib.learner.kl_estimators import kl_penalty
from ragen_rllib.learner.loss_terms import aggregate_loss, value_loss
from ragen_rllib.learner.policy_losses import policy_loss, policy_loss_row
from ragen_rllib.maths import off_policy
from ragen_rllib.records.metrics import learner_metric


@dataclass(frozen=True)
class Denominators:
    """The minibatch's response tokens and sequences (rows with a response token),
    summed over all learners, and the number of learners."""

    tokens: torch.Tensor
    sequences: torch.Tensor
    world: int = 1

    @classmethod
    def of(cls, response_mask: torch.Tensor, over_learners: bool = False) -> Denominators:
        """The counts of a minibatch's ``response_mask``  # [B, T]; with
        ``over_learners``, summed over every learner's part of the minibatch (a
        collective: every learner calls it)."""
        mask = response_mask > 0
        counts = torch.stack([mask.sum(), mask.any(dim=1).sum()]).double()
        world = 1
        if over_learners:
            counts = summed_over_learners(counts, counts.device)
            world = learner_count()
        return cls(counts[0].clamp_min(1).float(), counts[1].clamp_min(1).float(), world)


def starpo_loss(
    config: Any,
    batch: dict[str, torch.Tensor],
    fwd_out: dict[str, torch.Tensor],
    denoms: Denominators,
    reference_logp: Callable[[], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(the loss to back-propagate, this micro-batch's logged terms).

    ``batch``: ``response_mask``, ``behaviour_logp``, ``advantages``, with
    ``rollout_correction`` ``proximal_logp`` and, with a critic, ``old_values`` and
    ``value_targets``  # [B, T]. ``fwd_out``: ``logp``, ``entropy`` and, with a
    critic, ``values``  # [B, T]. ``reference_logp``: the
    reference model's log-probs of the batch, called only when ``kl_coeff > 0``.

    Every logged term but the maxima is this micro-batch's share of the
    minibatch's value over all learners (loss terms by construction; averages
    such as ``clip_frac`` are weighted by response tokens), so summing over the
    micro-batches and the learners gives the minibatch's value.
    """
    mask = batch["response_mask"].float()  # [B, T], 1 on generated tokens
    tokens = denoms.tokens
    seq_agg = config.loss_agg_used != "token-mean"
    logp_new = fwd_out["logp"]  # [B, T]
    old_logp, weights, correction = batch["behaviour_logp"], None, {}
    if config.rollout_correction != "none":  # decoupled PPO: clip against the proximal
        old_logp = batch["proximal_logp"]
        weights, correction = off_policy.correction_weights(
            batch["proximal_logp"],
            batch["behaviour_logp"],
            mask,
            mode=config.rollout_correction,
            level=config.rollout_correction_level,
            cap=config.rollout_correction_cap,
        )
    row = policy_loss_row(config.policy_loss)  # the row names the knobs it reads
    clip_low, clip_high = (getattr(config, k) for k in row.clip_knobs or ("clip_low", "clip_high"))
    options = {name: getattr(config, key) for name, key in row.option_knobs.items()}
    pg_loss, stats = policy_loss(
        logp_new,
        old_logp,
        batch["advantages"],
        mask,
        kind=config.policy_loss,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=config.dual_clip,
        agg=config.loss_agg_used,
        denom=denoms.sequences if seq_agg else tokens,
        norm_tokens=config.loss_norm_tokens,
        weights=weights,
        options=options,
    )
    stats.update(correction)
    entropy = aggregate_loss(fwd_out["entropy"], mask, "token-mean", denom=tokens)
    total = pg_loss - config.entropy_coeff * entropy
    micro_tokens = mask.sum()
    share = micro_tokens / tokens  # this micro-batch's share of the minibatch's tokens
    logs = {"policy_loss": pg_loss, "entropy": entropy, "response_tokens": micro_tokens}
    for key, value in stats.items():  # micro-batch averages over its tokens
        shared = learner_metric(key).over_microbatches == "share"
        logs[key] = value * share if shared else value
    if config.kl_coeff > 0:
        assert reference_logp is not None, "kl_coeff > 0 needs the reference log-probs"
        kl_tok = kl_penalty(logp_new, reference_logp(), kind=config.kl_estimator)
        kl = aggregate_loss(kl_tok, mask, "token-mean", denom=tokens)
        total = total + config.kl_coeff * kl
        logs["kl_to_reference"] = kl
    if "values" in fwd_out:
        vf_loss = value_loss(
            fwd_out["values"],
            batch["old_values"],
            batch["value_targets"],
            mask,
            clip=config.vf_clip,
            denom=tokens,
        )
        total = total + config.vf_loss_coeff * vf_loss
        logs["value_loss"] = vf_loss
        logs["value_mean"] = (fwd_out["values"].detach() * mask).sum() / tokens
    return total * denoms.world, {k: v.detach() for k, v in logs.items()}


def minibatch_logs(parts: list[dict[str, torch.Tensor]], world: int) -> dict[str, torch.Tensor]:
    """One learner's logged values for a minibatch from its micro-batches' terms, each
    reduced as its declaration says (:mod:`ragen_rllib.records.metrics`).

    Shares are summed over the micro-batches and multiplied by the number of
    learners: RLlib averages what the learners log, and the average of ``world``
    times each learner's share is the sum of the shares, the whole minibatch's value.
    ``response_tokens`` becomes the minibatch's total the same way. Maxima and minima
    are taken over the micro-batches that hold a response token (an empty one
    contributes nothing; a learner with none logs nothing for them), and RLlib
    reduces them over learners as maxima and minima."""
    out: dict[str, torch.Tensor] = {}
    for key in sorted({k for p in parts for k in p}):
        reduce = learner_metric(key).over_microbatches
        if reduce in ("max", "min"):
            held = [p[key].float() for p in parts if key in p and float(p["response_tokens"]) > 0]
            if held:
                out[key] = torch.stack(held).amax() if reduce == "max" else torch.stack(held).amin()
            continue
        values = torch.stack([p[key].float() for p in parts if key in p])
        out[key] = values.sum() * world
    return out


def gap_over_learners(sums: dict[str, torch.Tensor], device) -> dict[str, float]:
    """The gap's figures from this learner's :func:`~ragen_rllib.maths.off_policy.mismatch_sums`,
    reduced over all learners (a collective: every learner calls it)."""
    reduced = {}
    for key, value in sums.items():
        reduce = maximum_over_learners if key in off_policy.MAXIMA else summed_over_learners
        reduced[key] = reduce(value.detach().double().cpu().reshape(1), device)[0]
    return off_policy.mismatch_stats(reduced)
