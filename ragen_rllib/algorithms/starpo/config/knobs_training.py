"""The knobs of the advantages, the rollout filter, the loss and the learner."""

from __future__ import annotations

from ragen_rllib.algorithms.starpo.config.knob import RLLIB_OWN, Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import (
    boolean,
    choice,
    custom,
    integer,
    number,
    registry_choice,
)
from ragen_rllib.learner.kl_estimators import KL_ESTIMATORS
from ragen_rllib.learner.loss_terms import LOSS_AGGS
from ragen_rllib.learner.policy_losses import POLICY_LOSSES
from ragen_rllib.maths.advantages import REWARD_NORM_METHODS
from ragen_rllib.maths.estimators import ESTIMATORS
from ragen_rllib.maths.filters import FILTER_DIRECTIONS, FILTER_METRICS, FILTER_STRATEGIES
from ragen_rllib.maths.off_policy import CORRECTIONS, LEVELS

K = Knob
UNIT = number(0, 1)
NONNEG = number(0)

ADVANTAGES = knobs(
    "advantages and rewards",
    K(
        "advantage_estimator",
        "gae",
        registry_choice(ESTIMATORS),
        "the advantage estimator, a row of maths/estimators.py: "
        + "; ".join(
            f"{row.name}: {row.summary}{' (critic)' if row.needs_critic else ''}"
            for row in ESTIMATORS.values()
        )
        + " (docs/algorithms.md)",
        cross=True,
    ),
    K(
        "reward_level",
        "trajectory",
        choice(("trajectory", "turn")),
        "reward on the last token (trajectory) or on each turn's (turn)",
    ),
    K("gamma", 1.0, UNIT, "discount (paper 1.0)", rllib=True),
    K("lambda_", 1.0, UNIT, "GAE lambda (paper 1.0)", yaml="lambda"),
    K("gamma_turn", 0.95, UNIT, "bi-level GAE: discount between turns"),
    K("lambda_turn", 1.0, UNIT, "bi-level GAE: lambda between turns"),
    K("gamma_token", 1.0, UNIT, "bi-level GAE: discount between a turn's tokens"),
    K("lambda_token", 1.0, UNIT, "bi-level GAE: lambda between a turn's tokens"),
    K(
        "reward_norm_grouping",
        "state",
        choice(("state", "state_seat", "batch", "env")),
        "group-baseline estimators: compare a reward with its state's rollouts (state_seat: "
        "those at its seat of a two-player game), the batch or its env",
        cross=True,
    ),
    K(
        "reward_norm_method",
        None,
        choice(REWARD_NORM_METHODS, none_ok=True, null="the estimator's own"),
        "mean_std, mean, identity or asym_clip (null: mean_std for grpo and gigpo, mean otherwise)",
        cross=True,
    ),
    K("gigpo_gamma", 0.95, UNIT, "GiGPO: discount of a turn's return in its step group"),
    K("gigpo_step_weight", 1.0, NONNEG, "GiGPO: weight of the step-level advantage"),
    K(
        "rae_decay",
        0.95,
        number(0, 1, high_open=True),
        "RAE: how much of its running baseline (per env and seat) a trajectory's reward "
        "leaves (b = decay * b + (1 - decay) * R)",
    ),
    K(
        "overlong",
        "none",
        choice(("none", "mask", "penalty")),
        "answers near max_new_tokens: none; mask (answers cut there leave the loss); "
        "penalty (DAPO's soft linear penalty over the last overlong_buffer tokens)",
        cross=True,
    ),
    K(
        "overlong_buffer",
        16,
        integer(1),
        "overlong penalty: tokens before max_new_tokens over which it grows",
        cross=True,
    ),
    K("overlong_penalty", 1.0, NONNEG, "overlong penalty: its size at max_new_tokens"),
    K(
        "loss_tokens",
        "all",
        choice(("all", "answer")),
        "the generated tokens the loss trains: all; answer (the reasoning, up to and "
        "including </think>, leaves the loss; an answer without </think> stays whole)",
        cross=True,
    ),
    K(
        "whiten_advantages",
        True,
        boolean(),
        "whiten GAE advantages over the batch's response tokens (the paper's code)",
    ),
)

FILTER = knobs(
    "rollout filter (StarPO-S)",
    K(
        "filter_keep_ratio",
        0.25,
        number(0, 1, low_open=True, why="; 1.0 turns filtering off"),
        "top_k's share of groups kept by reward spread (StarPO-S 0.25; 1.0: off)",
        cross=True,
    ),
    K(
        "filter_strategy",
        "top_k",
        choice(FILTER_STRATEGIES),
        "top_k (a share), top_k_abs (a count), top_p (a share of the total score), "
        "min_p (at least that times the best)",
        cross=True,
    ),
    K(
        "filter_value",
        None,
        number(
            none_ok=True,
            why=" (top_k, top_p: in (0, 1]; top_k_abs: an integer >= 1; min_p: in [0, 1])",
        ),
        "the strategy's value (null: top_k takes filter_keep_ratio)",
        cross=True,
    ),
    K(
        "filter_direction",
        "largest",
        choice(FILTER_DIRECTIONS),
        "keep the groups of largest spread (smallest: an ablation)",
    ),
    K(
        "filter_include_zero",
        True,
        boolean(),
        "groups whose rewards are all equal may be kept",
        cross=True,
    ),
    K(
        "filter_metric",
        "reward_std",
        choice(FILTER_METRICS),
        "a group's score: the in-group reward std or variance",
    ),
    K(
        "dynamic_sampling_groups",
        None,
        integer(1, none_ok=True, null="off"),
        "DAPO's dynamic sampling: sample more batches until this many groups with "
        "spread (dynamic_sampling_spread) are kept (groups without spread leave the batch)",
        cross=True,
    ),
    K(
        "dynamic_sampling_spread",
        "success",
        choice(("success", "reward")),
        "dynamic sampling: a group has spread when its trajectories' success differs "
        "(DAPO's rule: its success rate is strictly between 0 and 1), or with reward when "
        "its finite total rewards differ by more than dynamic_sampling_reward_tol; a group "
        "with a non-finite reward never counts as having spread",
    ),
    K(
        "dynamic_sampling_reward_tol",
        1.0e-6,
        number(0),
        "dynamic sampling with spread reward: the largest max-min of a group's total "
        "rewards still read as no spread (float noise, a small length penalty)",
    ),
    K(
        "dynamic_sampling_max_calls",
        2,
        integer(1),
        "dynamic sampling: extra sampling calls per iteration at most",
    ),
    K(
        "filter_scope",
        "env",
        choice(("env", "all")),
        "with env_mix: rank groups within each env, or over the whole batch",
        cross=True,
    ),
)

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
        "skip_zero_advantage_updates",
        False,
        boolean(),
        "critic-free: a batch whose every advantage is 0 takes no optimizer step",
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
        "online_k",
        1,
        integer(1),
        "updates per rollout batch (1: every batch fresh; the paper's Online-k)",
        cross=True,
    ),
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
        "gradient_checkpointing",
        False,
        boolean(),
        "recompute activations in the backward pass (less memory, ~1/3 more compute)",
    ),
    K(
        "pack_sequences",
        True,
        boolean(),
        "lay a micro-batch's rows end to end in one sequence (no compute on padding)",
    ),
    K(
        "share_prefixes",
        True,
        boolean(),
        "with pack_sequences: encode each token prefix a pass's rows share once (system "
        "message, a group's first prompt, earlier turns); max_tokens_per_microbatch then "
        "counts the tokens encoded",
    ),
    K(
        "max_nonfinite_updates",
        3,
        integer(1),
        "non-finite updates are skipped and counted; this many in a row stop the run",
    ),
    K(
        "lora_rank",
        0,
        integer(0),
        "LoRA adapters' rank on actor and critic (0: off; the paper's LoRA runs 64)",
        cross=True,
    ),
    K("lora_alpha", 64.0, number(0, low_open=True), "the update is scaled by alpha / rank"),
    K("lora_dropout", 0.0, number(0, 1, high_open=True), "dropout on the adapters' input"),
    K(
        "lora_target_modules",
        "all-linear",
        custom(
            lambda v: (
                v == "all-linear"
                or (isinstance(v, list) and bool(v) and all(isinstance(m, str) and m for m in v))
            ),
            "must be 'all-linear' or a non-empty list of module names, e.g. [q_proj, v_proj]",
        ),
        "all-linear (every linear layer but the LM head) or module names",
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

ALL = ADVANTAGES + FILTER + LOSS + LEARNER
