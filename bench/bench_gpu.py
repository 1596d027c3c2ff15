"""Throughput and memory of a few training iterations on one device, against the planner.

Trains the Sokoban setup (``tuned_examples/sokoban_starpo.yaml``'s config) in
one process, colocated (learner and engine on the same device, the engine
sleeping during each update), for ``--iterations`` after one warm-up, and prints:

- rollout tokens/s (generated tokens over the sampling time) and learner
  tokens/s (trajectory tokens over the update time);
- the learner's model FLOPs utilisation: 6 x trainable parameters x tokens/s
  (x 4/3 with gradient checkpointing, which runs the forward twice) over the
  device's peak (``--peak-tflops``; known for H100/H200/A100 bf16);
- the peak device memory (CUDA's peak allocated and reserved; on CPU the
  process's peak resident memory) beside the memory planner's estimate for the
  same config, and their ratio;
- the weight push (learner to engine, wake included) and the engine's release.

    python bench/bench_gpu.py                   # a GPU, the 0.5B shape (random weights), bf16
    python bench/bench_gpu.py --model builtin --device cpu --iterations 2 --tiny   # the CPU path

``--model qwen05b`` builds a Qwen2.5-0.5B-shaped model with random weights from
its config (no download); any local model folder or hub id works too.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
#: Dense bf16 peak TFLOP/s by device name (what the vendor's data sheet gives).
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def build_qwen05b(path: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ragen_rllib.models.resolve import resolve_model
    from ragen_rllib.planning.shapes import KNOWN_CONFIGS

    builtin = resolve_model("builtin")
    config = AutoConfig.from_pretrained(builtin)
    tokenizer = AutoTokenizer.from_pretrained(builtin)
    for key, value in KNOWN_CONFIGS["qwen/qwen2.5-0.5b"].items():
        setattr(config, key, value)
    # The built-in tokenizer's ids stay valid: its vocabulary is smaller than the shape's.
    config.head_dim = config.hidden_size // config.num_attention_heads
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    config.max_position_embeddings = 32768
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def experiment_config(args) -> dict:
    exp = yaml.safe_load((HERE.parent / "tuned_examples" / "sokoban_starpo.yaml").read_text())
    exp = next(iter(exp.values()))
    cfg = {**exp["config"], "env": exp["env"]}
    cfg.update(
        {
            "llm": args.model_path,
            "num_env_runners": 0,
            "num_learners": 0,
            # The learner in this process, on the GPU when there is one; the engine
            # beside it (colocated), sleeping during each update.
            "num_gpus_per_learner": 1 if args.device == "cuda" else 0,
            "rollout_device": args.device,
            "model_dtype": args.dtype,
            "eval_interval": 0,
            "prompt_style": "compact",
        }
    )
    if args.tiny:  # the CPU smoke size
        cfg.update({"env_groups": 4, "group_size": 2, "max_turns": 2, "max_new_tokens": 16})
        cfg.update({"minibatch_size": 2, "max_context_tokens": 1024})
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen05b", help="qwen05b, builtin, a folder or hub id")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--tiny", action="store_true", help="a small batch (CPU smoke check)")
    args = parser.parse_args(argv)

    import ray
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no GPU visible; use --device cpu for the CPU path", file=sys.stderr)
        return 2
    if args.model == "qwen05b":
        args.model_path = tempfile.mkdtemp(prefix="qwen05b-")
        build_qwen05b(args.model_path)
    elif args.model == "builtin":
        from ragen_rllib.models.resolve import resolve_model

        args.model_path = resolve_model("builtin")
    else:
        args.model_path = args.model
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.planning.memory import GIB
    from ragen_rllib.planning.placement import Hardware, plan
    from ragen_rllib.planning.shapes import load_shape

    user = experiment_config(args)
    config = StarPOConfig.from_user_dict(user)
    gpu = args.device == "cuda"
    ray.init(
        address="local", num_cpus=2, num_gpus=int(gpu), include_dashboard=False, log_to_driver=False
    )
    # The planner for this device: the learner and the engine beside it.
    shape = load_shape(args.model_path)
    if gpu:
        total = torch.cuda.get_device_properties(0).total_memory
        hardware = Hardware(1, 1, total, "this GPU")
    else:
        hardware = Hardware(1, 0, None, "this CPU")
    laid = plan(config, shape, hardware)
    estimate = max(d.peak() for d in laid.devices)

    algo = config.build_algo()
    rows = []
    try:
        algo.train()  # warm-up: compilation, caches, the first allocations
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        for _ in range(args.iterations):
            r = algo.train()
            timing, rollout = r["timing"], r["rollout"]
            n = rollout["num_trajectories"]
            rows.append(
                {
                    "rollout_s": timing["sample_wait_s"],
                    "update_s": timing["update_s"],
                    "sync_s": timing["sync_s"],
                    "release_s": r["timers"].get("engine_release", 0.0),
                    "generated": n * rollout["num_turns_mean"] * rollout["response_length_mean"],
                    "trained": n * rollout["trajectory_tokens_mean"],
                }
            )
    finally:
        algo.stop()
    mean = {k: sum(row[k] for row in rows) / len(rows) for k in rows[0]}
    trainable = shape.lora_params(config.lora_rank) if config.lora_rank else shape.params()
    learner_tps = mean["trained"] / mean["update_s"]
    factor = 8 if config.gradient_checkpointing else 6
    out = {
        "model": args.model,
        "parameters_m": round(shape.params() / 1e6, 1),
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "dtype": args.dtype,
        "iterations": args.iterations,
        "rollout_tokens_per_s": round(mean["generated"] / max(mean["rollout_s"], 1e-9), 1),
        "learner_tokens_per_s": round(learner_tps, 1),
        "weight_push_s": round(mean["sync_s"], 4),
        "engine_release_s": round(mean["release_s"], 4),
        "planned_peak_gib": round(estimate / GIB, 2),
    }
    peak = args.peak_tflops
    if peak is None and gpu:
        name = torch.cuda.get_device_name(0)
        peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    if peak:
        out["mfu"] = round(factor * trainable * learner_tps / (peak * 1e12), 4)
    if gpu:
        out["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
        out["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / GIB, 2)
        out["measured_over_planned"] = round(out["peak_reserved_gib"] / out["planned_peak_gib"], 3)
    else:
        out["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
