"""Peak memory of one learner update on a Qwen2.5-0.5B-shaped model (random init).

The model is built from a config (vocabulary 151,936, hidden 896, 24 layers, tied
embeddings; no download) and saved to a temporary directory. Each setting runs
in a fresh process, which prints its peak resident memory (ru_maxrss) or, on a
GPU, its peak CUDA memory:

    python bench/bench_learner_memory.py                 # every setting below, one after another
    python bench/bench_learner_memory.py --settings micro4,micro2

Settings (each one update: forward, loss, backward and AdamW step, through the
project's learner):
- ``micro4``: 4 trajectories of 1,536 tokens (1,000 prompt, 536 response), in
  micro-batches of one trajectory, gradient checkpointing on;
- ``micro2``: the same on 2 trajectories (2 micro-batches): the peak should not grow
  with the number of micro-batches;
- ``old4``: the path before micro-batches and response-only logits: all 4
  trajectories in one pass, the LM head over every position ([4, 1536, 151936]
  logits), no checkpointing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

QWEN_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
SETTINGS = {
    "micro4": {"trajectories": 4, "micro_tokens": 1536, "checkpointing": True, "old": False},
    "micro2": {"trajectories": 2, "micro_tokens": 1536, "checkpointing": True, "old": False},
    "old4": {"trajectories": 4, "micro_tokens": None, "checkpointing": False, "old": True},
}


def build_model(path: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ragen_rllib.models.resolve import resolve_model

    config = AutoConfig.from_pretrained(resolve_model("builtin"))  # a Qwen2 config
    for key, value in QWEN_05B.items():
        setattr(config, key, value)
    config.head_dim = config.hidden_size // config.num_attention_heads
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).float().save_pretrained(path)


def run_setting(model_path: str, name: str, prompt: int, response: int) -> dict:
    import torch

    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.env_runner.llm_env_runner import token_spaces
    from ragen_rllib.rl_module import llm_rl_module as rl_module
    from ragen_rllib.rl_module.logprobs import token_logprobs_and_entropy

    setting = SETTINGS[name]
    if setting["old"]:

        def full_logits(model, batch, temperature, autocast=None):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            logp, entropy = token_logprobs_and_entropy(
                logits.logits[:, :-1], batch["input_ids"][:, 1:], temperature
            )
            pad = logp.new_zeros((logp.shape[0], 1))
            return {"logp": torch.cat([pad, logp], 1), "entropy": torch.cat([pad, entropy], 1)}

        rl_module.response_logprobs = full_logits
    n = setting["trajectories"]
    cfg = StarPOConfig.from_user_dict(
        {
            "env": "ragen/Bandit-v0",
            "llm": model_path,
            "advantage_estimator": "grpo",
            "env_groups": 1,
            "group_size": n,
            "minibatch_size": n,
            "filter_keep_ratio": 1.0,
            "max_context_tokens": 4096,
            "max_tokens_per_microbatch": setting["micro_tokens"],
            "gradient_checkpointing": setting["checkpointing"],
        }
    )
    spaces = {"default_policy": token_spaces(QWEN_05B["vocab_size"], 4096)}
    learner = cfg.build_learner(spaces=spaces)
    learner.build()
    device = next(learner.module["default_policy"].parameters()).device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    length = prompt + response
    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(0, QWEN_05B["vocab_size"], (n, length), generator=g),
        "attention_mask": torch.ones((n, length), dtype=torch.long),
        "response_mask": torch.cat([torch.zeros((n, prompt)), torch.ones((n, response))], dim=1),
        "behaviour_logp": torch.full((n, length), -5.0),
        "advantages": torch.randn((n, length), generator=g),
    }
    batch = {k: v.to(device) for k, v in batch.items()}
    start = time.perf_counter()
    learner.optimizer_step({"default_policy": batch})
    seconds = time.perf_counter() - start
    out = {
        "setting": name,
        **setting,
        "tokens": n * length,
        "update_s": round(seconds, 1),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }
    if device.type == "cuda":
        out["peak_cuda_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="micro4,micro2,old4")
    parser.add_argument("--prompt", type=int, default=1000)
    parser.add_argument("--response", type=int, default=536)
    parser.add_argument("--model-dir", default=None, help="reuse a model built before")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_setting(args.model_dir, args.child, args.prompt, args.response)))
        return 0
    model_dir = args.model_dir or tempfile.mkdtemp(prefix="qwen05b-")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        build_model(model_dir)
    rows = []
    for name in args.settings.split(","):
        proc = subprocess.run(
            [sys.executable, __file__, "--child", name, "--model-dir", model_dir,
             "--prompt", str(args.prompt), "--response", str(args.response)],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode == 0:
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        else:  # e.g. killed for memory: say so, with the exit status
            tail = proc.stderr.strip().splitlines()[-1:] or [""]
            rows.append({"setting": name, "failed": proc.returncode, "last_error": tail[0]})
        print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
