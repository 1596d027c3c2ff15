"""The models room's knobs (``models/``): the model a run trains (``llm``), the precision
it computes in (``models/runtime.py``) and its LoRA adapters (``models/lora.py``)."""

from __future__ import annotations

from ragen_rllib.algorithms.starpo.config.knob import Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import choice, custom, integer, number

DTYPES = ("float32", "bfloat16")
#: model_dtype's choices: a dtype, or "auto" (bfloat16 where the learner's device
#: computes it natively and, on a CPU, the model is wide: config.model_dtype_used)
MODEL_DTYPES = ("auto", *DTYPES)
K = Knob

MODEL = knobs(
    "model",
    K(
        "llm",
        "builtin",
        custom(  # a string here; whether it loads is check_model's (config/checks.py)
            lambda v: isinstance(v, str) and bool(v.strip()),
            "must be 'builtin', 'builtin-raw', a named model such as 'smollm2-135m-instruct', "
            "a .gguf file, a local model directory or a Hugging Face hub id such as "
            "'Qwen/Qwen2.5-0.5B-Instruct' (a string)",
        ),
        "the model: builtin (pretrained, shipped), builtin-raw, smollm2-135m-instruct, a "
        ".gguf file, a local HF folder or a hub id",
        cross=True,
    ),
    K(
        "model_dtype",
        "auto",
        choice(MODEL_DTYPES),
        "bfloat16: the learner computes in bfloat16 over float32 master weights; engines and "
        "frozen copies hold bfloat16. auto: bfloat16 on a GPU with it natively, and on a CPU "
        "with AVX512-BF16 or AMX for a model at least 512 wide (hidden_size); else float32",
    ),
)

LORA = knobs(
    "LoRA",
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
)

ALL = MODEL + LORA
