"""StarPO's config: RLlib's AlgorithmConfig with every knob, the settings derived from
them, and ``validate()``, which checks every value before a run starts.

The knobs, defaults and rules are declared in :mod:`.knobs`; this class sets the
defaults, hands an experiment file to :mod:`.yaml_front` and runs :mod:`.checks`.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from ragen_rllib.algorithms.starpo.config import checks
from ragen_rllib.algorithms.starpo.config.knobs import RLLIB_DEFAULTS, STARPO_DEFAULTS
from ragen_rllib.algorithms.starpo.config.yaml_front import config_from_user_dict
from ragen_rllib.distributed.learner_group import build_learner_group
from ragen_rllib.env_choice.env_loading import self_play_on
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
from ragen_rllib.env_runner.self_play.seats import (
    DEFAULT_POLICY_ID,
    OpponentSetup,
    read_setup,
    uses_opponents,
)
from ragen_rllib.learner.connectors import build_learner_pipeline
from ragen_rllib.learner.starpo_learner import StarPOTorchLearner
from ragen_rllib.maths.estimators import ESTIMATORS, AdvantageSettings, Estimator
from ragen_rllib.models.resolve import resolve_model
from ragen_rllib.models.runtime import BF16_MIN_HIDDEN, native_bfloat16
from ragen_rllib.planning.shapes import model_width
from ragen_rllib.rl_module.llm_rl_module import LLMRLModule
from ragen_rllib.rl_module.packing import unsupported
from ragen_rllib.warmup.format_warmup import model_path


class StarPOConfigBase(AlgorithmConfig):
    """StarPO's config without its algorithm class (``starpo.StarPOConfig`` adds it):
    RLlib's settings plus every knob of :data:`~.knobs.KNOBS`, each with its
    declared default. The fluent ``.environment()``, ``.training()`` and
    ``.env_runners()`` calls work; an experiment file's flat ``config:`` mapping is
    read with :meth:`from_user_dict`; :meth:`validate` checks every value."""

    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class)
        for key, value in {**STARPO_DEFAULTS, **RLLIB_DEFAULTS}.items():
            setattr(self, key, copy.deepcopy(value))
        self.env_runner_cls = LLMEnvRunner
        #: self_play's opponents, read from RLlib's multi-agent settings by validate()
        #: (which then leaves RLlib one policy, the learner's: env_runner/self_play/seats.py)
        self.opponent_setup: OpponentSetup | None = None
        # No sync of the runners' states after every iteration (as RLlib's IMPALA):
        # the runners hold no connector state and the driver keeps the counters, and
        # the sync is a blocking call on every runner, which queues behind the
        # runner's sample and weight load when sampling is asynchronous (measured:
        # bench/bench_async.py --device-time; the weights go by _push_weights).
        self._dont_auto_sync_env_runner_states = True

    def training(self, **kwargs: Any) -> StarPOConfigBase:
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

    @classmethod
    def from_user_dict(cls, config: dict[str, Any]) -> StarPOConfigBase:
        """A config from a flat dict (YAML ``config:`` section); an unknown key is an
        error naming close matches (see :func:`.yaml_front.config_from_user_dict`)."""
        return config_from_user_dict(cls, config)

    # ----- RLlib extension points -------------------------------------------------
    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=LLMRLModule, model_config=self.llm_module_config())

    def get_default_learner_class(self):
        return StarPOTorchLearner

    def build_learner_group(self, **kwargs):
        """RLlib's, with a LearnerGroup that gathers FSDP learners' state from all of them."""
        return build_learner_group(self, **kwargs)

    def build_learner_connector(self, input_observation_space, input_action_space, device=None):
        return build_learner_pipeline(self, device)

    # ----- derived settings ---------------------------------------------------------
    @property
    def estimator(self) -> Estimator:
        """The advantage estimator's registry row."""
        return ESTIMATORS[self.advantage_estimator]

    @property
    def uses_critic(self) -> bool:
        return self.estimator.needs_critic

    @property
    def reward_norm_method_used(self) -> str | None:
        """``reward_norm_method``, or the estimator's own when that is null."""
        if self.reward_norm_method is not None:
            return self.reward_norm_method
        return self.estimator.default_reward_norm

    @property
    def model_dtype_used(self) -> str:
        """``model_dtype``, with "auto" resolved for the learner's device: on a GPU,
        bfloat16 where it computes bfloat16 natively (a GPU learner seen from a process
        without a GPU counts as one that does); on a CPU, bfloat16 where it has native
        bfloat16 and the model is at least
        :data:`~ragen_rllib.models.runtime.BF16_MIN_HIDDEN` wide; else float32."""
        if self.model_dtype != "auto":
            return self.model_dtype
        return self._auto_dtype()[0]

    def _auto_dtype(self) -> tuple[str, str]:
        """What "auto" resolves to, and why (the header's note)."""
        if (self.num_gpus_per_learner or 0) > 0:
            native = native_bfloat16("cuda") if torch.cuda.is_available() else True
            if native:
                return "bfloat16", "the learner's GPU computes it natively"
            return "float32", "the learner's GPU has no native bfloat16"
        if not native_bfloat16("cpu"):
            return "float32", "this CPU has no native bfloat16 (AVX512-BF16 or AMX)"
        width = model_width(self.llm)
        if width is None:
            return "float32", "this model's config could not be read for its width"
        if width >= BF16_MIN_HIDDEN:
            return "bfloat16", (
                f"native on this CPU, and the model is {width} wide (bfloat16 pays on a CPU "
                f"from {BF16_MIN_HIDDEN})"
            )
        return "float32", (
            f"the model is {width} wide: on a CPU bfloat16 pays from {BF16_MIN_HIDDEN} "
            "(measured slower on narrower models)"
        )

    def dtype_note(self) -> str:
        """The model's dtype as the run's header shows it, with why when it was chosen."""
        if self.model_dtype != "auto":
            return self.model_dtype
        dtype, why = self._auto_dtype()
        return f"{dtype}: auto, {why}"

    @property
    def self_play_used(self) -> bool:
        """``self_play``, with null resolved from the env: on when ``env`` names a
        PettingZoo AEC env's factory (:func:`~ragen_rllib.env_choice.env_loading.self_play_on`)."""
        return self_play_on(self)

    def self_play_note(self) -> str | None:
        """Self-play as the run's header shows it, with why it is on; None when off."""
        if not self.self_play_used:
            return None
        if self.self_play is None:
            return f"on (env {self.env} is a two-player PettingZoo AEC env)"
        return "on (self_play: true)"

    def learner_passes(self) -> str:
        """How the learner runs a micro-batch's rows, as the run's header shows it: packed,
        with each prefix they share encoded once, or why not."""
        from transformers import AutoConfig

        bound = self.max_tokens_per_microbatch
        if not self.pack_sequences:
            return "rows padded, every row encoded in full (pack_sequences: false)"
        why = None
        try:
            why = unsupported(AutoConfig.from_pretrained(resolve_model(self.llm)))
        except (OSError, ValueError):
            pass  # a hub model not downloaded yet: the learner finds out
        if why is not None:
            return f"rows padded, every row encoded in full: the model cannot pack rows ({why})"
        if not self.share_prefixes:
            return "rows packed, every row encoded in full (share_prefixes: false)"
        per = f"<= {bound} encoded tokens a pass" if bound else "a minibatch a pass"
        return f"rows packed, each prefix they share encoded once; {per}"

    @property
    def engine_dtype_used(self) -> str:
        """``engine_dtype``, or the model's dtype (:attr:`model_dtype_used`) when null."""
        return self.engine_dtype or self.model_dtype_used

    @property
    def loss_agg_used(self) -> str:
        """``loss_agg``, or the estimator's own when that is null."""
        return self.loss_agg if self.loss_agg is not None else self.estimator.default_loss_agg

    @property
    def loss_norm_tokens(self) -> int:
        """seq-mean-token-sum-norm's constant: the most tokens one training sequence can
        generate (a turn's with a context window, a whole trajectory's without)."""
        turns = 1 if self.context_window is not None else self.max_turns
        return self.max_new_tokens * turns

    def advantage_settings(self) -> AdvantageSettings:
        """The knobs the advantage estimators read."""
        return AdvantageSettings(
            reward_norm=self.reward_norm_method_used,
            gamma=self.gamma,
            lam=self.lambda_,
            reward_level=self.reward_level,
            gamma_turn=self.gamma_turn,
            lambda_turn=self.lambda_turn,
            gamma_token=self.gamma_token,
            lambda_token=self.lambda_token,
            gigpo_gamma=self.gigpo_gamma,
            gigpo_step_weight=self.gigpo_step_weight,
            rae_decay=self.rae_decay,
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

    def llm_module_config(self) -> dict[str, Any]:
        return {
            "model_path": model_path(self),
            "dtype": self.model_dtype_used,
            "critic": self.uses_critic,
            "temperature": self.temperature,
            "gradient_checkpointing": self.gradient_checkpointing,
            "pack_sequences": self.pack_sequences,
            "share_prefixes": self.share_prefixes,
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

    # ----- checks -------------------------------------------------------------------
    def check(self) -> None:
        """Raise ValueError (or FileNotFoundError for a model path) on any bad value."""
        self.check_values()
        self.check_model()

    def check_values(self) -> None:
        """Every check but the model's (``llm``): cheap, and raises ValueError naming the key."""
        checks.check_values(self)

    @property
    def trajectories_per_group(self) -> int:
        """The trajectories a group brings to the update: group_size, or with opponent
        policies the trained policy's rollouts (the fewest of any group)."""
        if self.opponent_setup is None:
            return self.group_size
        return min(self.opponent_setup.trained_per_group(self.env_groups, self.group_size))

    def check_model(self) -> None:
        """Resolve ``llm``; a missing local path, or a hub id that cannot be loaded within
        seconds, raises FileNotFoundError."""
        checks.check_model(self)

    def validate(self) -> None:
        if self.in_evaluation:
            # RLlib's derived evaluation config (its own runner counts); StarPO
            # evaluates through its training runners (StarPO.evaluate_success).
            super().validate()
            return
        # Remote runners do all the sampling: no idle runner in the driver.
        self.create_local_env_runner = self.num_env_runners == 0
        if uses_opponents(self):
            # Opponents are snapshots the runners play; the learner has one module, the
            # trained policy's, under RLlib's default id (RLlib is left single-agent).
            self.opponent_setup = read_setup(self)
            self.multi_agent(
                policies={DEFAULT_POLICY_ID},
                policy_mapping_fn=AlgorithmConfig.DEFAULT_POLICY_MAPPING_FN,
                policies_to_train=None,
            )
        super().validate()
        self.check()
