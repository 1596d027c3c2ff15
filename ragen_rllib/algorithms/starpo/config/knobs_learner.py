"""The learner room's knobs (``learner/``): StarPO's loss (the policy loss and its clips,
the correction for the engine-to-learner gap, the tokens it trains, the entropy and KL
terms, the critic's loss) and the update (the optimizer, gradient clipping, minibatches
and micro-batches, ddp or fsdp, the non-finite guard)."""

from __future__ import annotations

from ragen_rllib.algorithms.starpo.config.knob import RLLIB_OWN, Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import (
    boolean,
    choice,
    integer,
    number,
    registry_choice,
)
from ragen_rllib.learner.kl_estimators import KL_ESTIMATORS
from ragen_rllib.learner.loss_terms import LOSS_AGGS
from ragen_rllib.learner.policy_losses import POLICY_LOSSES
from ragen_rllib.maths.off_policy import CORRECTIONS, LEVELS

NONNEG = number(0)
K = Knob

LOSS = knobs(
    "loss",
    K(
        "clip_low",
        0.2,
        number(0, 1, low_open=True, high_open=True),
        "PPO clip epsilon below 1 (paper 0.2)",
    ),
    K(
        "clip_high",
        0.28,
        number(0, 1, low_open=True, high_open=True),
        "PPO clip epsilon above 1, clip-higher (paper 0.28)",
    ),
    K(
        "dual_clip",
        3.0,
        number(1, low_open=True, none_ok=True),
        "dual-clip c for negative advantages (paper 3; null: off)",
    ),
    K(
        "policy_loss",
        "ppo",
        registry_choice(POLICY_LOSSES),
        "the policy loss, a row of learner/policy_losses.py: "
        + "; ".join(f"{row.name}: {row.summary}" for row in POLICY_LOSSES.values())
        + " (docs/algorithms.md)",
        cross=True,
    ),
    K("gspo_clip_low", 3e-4, number(0, 1, low_open=True, high_open=True), "GSPO's clip below 1"),
    K("gspo_clip_high", 4e-4, number(0, 1, low_open=True, high_open=True), "GSPO's clip above 1"),
    K(
        "cispo_weight_cap",
        5.0,
        number(1, low_open=True),
        "CISPO: the importance weight's cap (the weight is cut, never the gradient)",
    ),
    K(
        "rollout_correction",
        "none",
        choice(CORRECTIONS),
        "none; tis or mis: clip against the learner's own log-probs of the batch (one "
        "more forward) and weight by the truncated (tis) or masked (mis) "
        "engine-to-learner importance weight",
    ),
    K(
        "rollout_correction_level",
        "token",
        choice(LEVELS),
        "the importance weight per token, or per sequence (the product over its tokens)",
    ),
    K(
        "rollout_correction_cap",
        2.0,
        number(1, low_open=True),
        "tis: weights above it are cut to it; mis: weights outside [1/cap, cap] are 0",
    ),
    K(
        "log_rollout_mismatch",
        False,
        boolean(),
        "measure the engine-to-learner gap on the whole batch (one more forward without "
        "gradients; without it, on the first minibatch, for free)",
    ),
    K(
        "loss_agg",
        None,
        choice(LOSS_AGGS, none_ok=True, null="the estimator's own"),
        "token-mean (paper), seq-mean-token-sum, seq-mean-token-mean, "
        "seq-mean-token-sum-norm (null: dr_grpo's last, else token-mean)",
    ),
    K(
        "loss_tokens",
        "all",
        choice(("all", "answer")),
        "the generated tokens the loss trains: all; answer (the reasoning, up to and "
        "including </think>, leaves the loss; an answer without </think> stays whole)",
        cross=True,
    ),
    K("entropy_coeff", 0.001, NONNEG, "entropy bonus (paper 0.001)"),
    K("kl_coeff", 0.0, NONNEG, "KL to the frozen initial model (StarPO-S 0; vanilla StarPO 0.001)"),
    K(
        "kl_estimator",
        "k3_st",
        registry_choice(KL_ESTIMATORS),
        "the KL term per token, a row of learner/kl_estimators.py: "
        + "; ".join(f"{row.name}: {row.summary}" for row in KL_ESTIMATORS.values()),
    ),
    K(
        "vf_clip",
        0.5,
        number(0, low_open=True, none_ok=True),
        "value clipping range (paper 0.5; null: off)",
    ),
    K("vf_loss_coeff", 1.0, NONNEG, "weight of the critic loss"),
)

LEARNER = knobs(
    "learner",
    K("lr", 1e-6, number(0, low_open=True), "actor learning rate (paper 1e-6)", rllib=True),
    K("critic_lr", 1e-5, number(0, low_open=True), "critic learning rate (paper 1e-5)"),
    K("weight_decay", 0.01, NONNEG, "AdamW weight decay (paper 0.01)"),
    K(
        "grad_clip",
        1.0,
        number(0, low_open=True, none_ok=True),
        "gradient clipping bound (paper 1.0; null: off)",
        rllib=True,
    ),
    K(
        "grad_clip_by",
        "global_norm",
        choice(("value", "norm", "global_norm")),
        "clip by value, per-tensor norm or global norm",
        rllib=True,
    ),
    K(
        "minibatch_size",
        32,
        integer(1),
        "trajectories per gradient step (paper 32)",
        rllib=True,
        cross=True,
    ),
    K("num_epochs", 1, integer(1), "passes over a batch per update (paper 1)", rllib=True),
    K("shuffle_batch_per_epoch", RLLIB_OWN, boolean(), "shuffle the batch every epoch", rllib=True),
    K(
        "max_tokens_per_microbatch",
        None,
        integer(1, none_ok=True, null="the whole minibatch in one pass"),
        "tokens per forward/backward pass at most: padded rows, or with share_prefixes the "
        "tokens encoded (gradients accumulate; the update is the same)",
    ),
    K(
        "learner_strategy",
        "ddp",
        choice(("ddp", "fsdp")),
        "with num_learners >= 2: ddp (replicas) or fsdp (FSDP2 shards)",
        cross=True,
    ),
    K(
        "max_nonfinite_updates",
        3,
        integer(1),
        "non-finite updates are skipped and counted; this many in a row stop the run",
    ),
    K(
        "framework_str",
        "torch",
        choice(("torch",)),
        "StarPO runs on torch only",
        rllib=True,
        yaml="framework",
    ),
)

ALL = LOSS + LEARNER
