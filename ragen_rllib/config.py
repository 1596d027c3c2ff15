"""StarPOConfig: every knob of StarPO / StarPO-S, documented and checked before Ray starts.

An RLlib ``AlgorithmConfig``: the fluent ``.environment()``, ``.training()``
and ``.env_runners()`` calls work, and the flat dict of an experiment YAML
file is read with :meth:`StarPOConfig.from_user_dict`, which rejects unknown
keys. :meth:`StarPOConfig.check` raises ``ValueError`` naming the bad key, its
value and what is allowed; the ``rllib`` command calls it before ``ray.init``.

Defaults follow the paper's StarPO-S setup (DESIGN.md section 3) except where
a comment says otherwise.
"""

from __future__ import annotations

import os
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

ADVANTAGE_ESTIMATORS = ("gae", "grpo", "bilevel_gae")
REWARD_LEVELS = ("trajectory", "turn")
LOSS_AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
GRPO_NORMS = ("mean_std", "mean", "identity")
FILTER_MODES = ("top_std", "bottom_std")
ENGINES = ("hf",)
DTYPES = ("float32", "bfloat16")
ROLLOUT_DEVICES = ("auto", "cpu", "cuda")

# Our knobs and their defaults, one documented line each. They become attributes of
# StarPOConfig, so RLlib's to_dict()/update_from_dict() carry them through Tune.
STARPO_DEFAULTS: dict[str, Any] = {
    # --- model and rollout ---------------------------------------------------------
    "llm": "builtin",  # "builtin" (warm-started), "builtin-raw", a local HF dir or a hub id
    "model_dtype": "float32",  # engine weights and learner compute dtype ("bfloat16" on GPUs)
    "engine": "hf",  # rollout engine: "hf" (transformers; the CPU default)
    "rollout_device": "auto",  # where the engine runs: "auto" (cuda if visible), "cpu", "cuda"
    "env_groups": 8,  # P: initial states per iteration (paper 8)
    "group_size": 16,  # N: rollouts per initial state (paper 16)
    "max_turns": 5,  # K: turns per trajectory at most (paper 5)
    "max_new_tokens": 100,  # tokens generated per turn at most
    "max_context_tokens": 4096,  # a trajectory that would outgrow this ends ("context_overflow")
    "temperature": 1.0,  # sampling temperature for training rollouts (paper 1.0)
    "top_p": 1.0,  # nucleus sampling mass
    "prefill": "<think>",  # text placed at the start of every answer (not generated, no loss)
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
    "advantage_estimator": "gae",  # "gae" (PPO critic), "grpo", "bilevel_gae" (TRICO)
    "reward_level": "trajectory",  # reward on the last token ("trajectory") or per turn ("turn")
    "lambda_": 1.0,  # GAE lambda (paper 1.0); gamma is AlgorithmConfig.gamma (paper 1.0)
    "gamma_turn": 0.95,  # bi-level GAE: discount between turns
    "lambda_turn": 1.0,  # bi-level GAE: lambda between turns
    "gamma_token": 1.0,  # bi-level GAE: discount between tokens of a turn
    "lambda_token": 1.0,  # bi-level GAE: lambda between tokens of a turn
    "grpo_norm": "mean_std",  # GRPO score normalisation within a group
    "whiten_advantages": False,  # whiten GAE advantages over the batch's tokens
    "filter_keep_ratio": 0.25,  # StarPO-S: keep this share of groups, by reward std (1.0: off)
    "filter_mode": "top_std",  # how groups are ranked for filtering
    # --- loss ------------------------------------------------------------------------
    "clip_low": 0.2,  # PPO clip epsilon below 1 (paper 0.2)
    "clip_high": 0.28,  # PPO clip epsilon above 1, "clip-higher" (paper 0.28)
    "dual_clip": 3.0,  # dual-clip c for negative advantages (paper 3); None: off
    "loss_agg": "token-mean",  # how token losses are averaged (paper token-mean)
    "entropy_coeff": 0.001,  # entropy bonus (paper 0.001)
    "kl_coeff": 0.0,  # KL to the frozen initial model (StarPO-S 0; vanilla StarPO 0.001)
    "kl_estimator": "k3",  # "k1", "k2", "k3" or "abs"
    "vf_clip": 0.5,  # value clipping range (paper 0.5); None: off
    "vf_loss_coeff": 1.0,  # weight of the critic loss
    "critic_lr": 1e-5,  # critic learning rate (paper 1e-5); the actor's is `lr`
    "weight_decay": 0.01,  # AdamW weight decay (paper 0.01)
    "online_k": 1,  # updates per rollout batch: 1 is fully fresh (paper's Online-k)
    # Updates whose loss or gradient norm is not finite are skipped (and counted);
    # this many skipped in a row stop the run with an error.
    "max_nonfinite_updates": 3,
    # --- evaluation ----------------------------------------------------------------
    "eval_num_states": 256,  # fixed initial states for evaluation (paper 256)
    "eval_seed": 0,  # first seed of the evaluation states (training seeds are drawn >= 2**20)
    "eval_temperature": 0.5,  # sampling temperature at evaluation (paper 0.5)
    "eval_interval": 0,  # evaluate every n iterations (0: only through `rllib evaluate`)
}

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
)
_CHOICES = {
    "advantage_estimator": ADVANTAGE_ESTIMATORS,
    "reward_level": REWARD_LEVELS,
    "loss_agg": LOSS_AGGS,
    "grpo_norm": GRPO_NORMS,
    "filter_mode": FILTER_MODES,
    "engine": ENGINES,
    "model_dtype": DTYPES,
    "rollout_device": ROLLOUT_DEVICES,
    "kl_estimator": ("k1", "k2", "k3", "abs"),
}


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
        }

    @classmethod
    def from_user_dict(cls, config: dict[str, Any]) -> StarPOConfig:
        """A config from a flat dict (YAML ``config:`` section); unknown keys are an error."""
        if not isinstance(config, dict):
            raise ValueError(f"config must be a mapping, got {type(config).__name__}")
        out = cls()
        allowed = set(out.to_dict()) | {"lambda_"}
        unknown = sorted(k for k in config if cls._translate_special_keys(k, False) not in allowed)
        if unknown:
            ours = ", ".join(sorted(STARPO_DEFAULTS))
            raise ValueError(
                f"unknown config key(s) {unknown}. StarPO keys: {ours}; plus RLlib's "
                "AlgorithmConfig keys (lr, gamma, seed, minibatch_size, num_epochs, env, "
                "env_config, num_env_runners, num_learners, ...)"
            )
        config = dict(config)
        if "lambda" in config:
            config["lambda_"] = config.pop("lambda")
        out.update_from_dict(config)
        return out

    def check(self) -> None:
        """Raise ValueError (or FileNotFoundError for a model path) on any bad value."""
        from .env_loading import check_env

        def bad(key: str, allowed: str) -> ValueError:
            return ValueError(f"config {key}={getattr(self, key)!r} is invalid: {allowed}")

        check_env(self)
        if not isinstance(self.env_config, dict):
            raise bad("env_config", "must be a mapping of env constructor kwargs")
        for key in _POSITIVE_INTS:
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(key, "must be an integer >= 1")
        for key, choices in _CHOICES.items():
            if getattr(self, key) not in choices:
                raise bad(key, f"allowed values are {list(choices)}")
        for key in ("lr", "critic_lr"):
            value = getattr(self, key)
            if not isinstance(value, int | float) or not value > 0:
                raise bad(key, "must be a number > 0")
        for key in ("clip_low", "clip_high"):
            if not 0 < getattr(self, key) < 1:
                raise bad(key, "must be in (0, 1)")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise bad("dual_clip", "must be None or > 1")
        if self.vf_clip is not None and not self.vf_clip > 0:
            raise bad("vf_clip", "must be None or > 0")
        for key in ("entropy_coeff", "kl_coeff", "weight_decay", "vf_loss_coeff"):
            if not getattr(self, key) >= 0:
                raise bad(key, "must be >= 0")
        for key in ("gamma", "lambda_", "gamma_turn", "lambda_turn", "gamma_token", "lambda_token"):
            if not 0 <= getattr(self, key) <= 1:
                raise bad(key, "must be in [0, 1]")
        if not 0 < self.filter_keep_ratio <= 1:
            raise bad("filter_keep_ratio", "must be in (0, 1]; 1.0 turns filtering off")
        if not 0 < self.top_p <= 1:
            raise bad("top_p", "must be in (0, 1]")
        for key in ("temperature", "eval_temperature"):
            if not getattr(self, key) >= 0:
                raise bad(key, "must be >= 0")
        if self.advantage_estimator == "grpo" and self.group_size < 2:
            raise bad(
                "group_size",
                "GRPO normalises rewards within a group, so group_size must be >= 2 "
                "(or use advantage_estimator='gae')",
            )
        if self.filter_keep_ratio < 1 and self.group_size < 2:
            raise bad("group_size", "reward-std filtering needs group_size >= 2")
        from .core.filters import num_groups_to_keep

        runners = max(1, self.num_env_runners)
        kept = num_groups_to_keep(self.env_groups * runners, self.filter_keep_ratio)
        if self.minibatch_size > kept * self.group_size:
            raise bad(
                "minibatch_size",
                f"must be <= the trajectories left after filtering ({kept} groups x "
                f"{self.group_size} = {kept * self.group_size}); lower it or raise "
                "env_groups / filter_keep_ratio",
            )
        if not (0 <= self.eval_seed and self.eval_seed + self.eval_num_states <= 1 << 20):
            raise bad("eval_seed", "eval_seed + eval_num_states must lie in [0, 2**20)")
        model_path = self.llm_module_config()["model_path"]  # a missing local path raises
        if not os.path.isdir(model_path):
            # A hub id: fetch its config now (cached by transformers), so that an
            # unreachable hub or a wrong id fails here and not inside a Ray actor.
            from transformers import AutoConfig

            try:
                AutoConfig.from_pretrained(model_path)
            except (OSError, ValueError) as err:
                raise FileNotFoundError(
                    f"config llm={self.llm!r} is neither a local model directory nor a hub "
                    f"model that can be loaded here: {err}"
                ) from err

    def validate(self) -> None:
        super().validate()
        self.check()
