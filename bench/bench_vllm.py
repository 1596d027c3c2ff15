"""Rollout engines side by side: HF vs vLLM, vLLM with prefix caching on and off.

Every engine plays the same batch through ``LLMEnvRunner.sample_groups`` (P x N
trajectories in lockstep, one engine call per turn, the same seeds and sampling
settings), in one process, in interleaved rounds; the best round of each is kept.
Needs vLLM (the README's vLLM install), and runs where the engine would: the CPU
build here, the GPU one on a GPU machine.

    python bench/bench_vllm.py                                   # FrozenLake, P=8 x N=16, 5 turns
    python bench/bench_vllm.py --engines hf,vllm,vllm-compiled   # vLLM with torch.compile too

Engines: ``hf`` (this project's transformers engine, prefix-cached by trajectory),
``vllm`` (prefix caching on), ``vllm-no-prefix-cache``, ``vllm-compiled`` (prefix
caching on, no ``enforce_eager``). The figures are trajectories/s, generated
tokens/s, and the share of prompt tokens served from a cache.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="ragen/FrozenLake-v0")
    parser.add_argument("--llm", default="builtin")
    parser.add_argument("--groups", type=int, default=8, help="P")
    parser.add_argument("--group-size", type=int, default=16, help="N")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kv-cache-gb", type=float, default=1.0)
    parser.add_argument("--engines", default="hf,vllm,vllm-no-prefix-cache")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    engines = args.engines.split(",")
    unknown = set(engines) - {"hf", "vllm", "vllm-no-prefix-cache", "vllm-compiled"}
    if unknown:
        parser.error(f"unknown engines {sorted(unknown)}")

    # vLLM keeps torch at the OMP_NUM_THREADS it finds (else it drops to 1 thread).
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM logs to stdout
    import torch

    torch.set_num_threads(args.threads)
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.engines.vllm_engine import VLLMEngine
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
    from ragen_rllib.maths.seeding import training_group_seeds

    config = StarPOConfig.from_user_dict(
        {
            "env": args.env,
            "llm": args.llm,
            "env_groups": args.groups,
            "group_size": args.group_size,
            "max_turns": args.turns,
            "max_new_tokens": args.max_new_tokens,
            "minibatch_size": 1,
            "filter_keep_ratio": 1.0,
        }
    )
    runner = LLMEnvRunner(config=config, worker_index=0)  # its engine is the HF one
    built = {"hf": runner.engine}
    start_s = {"hf": 0.0}
    for name in engines:
        if name == "hf":
            continue
        start = time.perf_counter()
        built[name] = VLLMEngine(
            runner._model_path,
            eos_token_id=runner.tokenizer.eos_token_id,
            dtype=config.model_dtype_used,
            max_model_len=config.max_context_tokens,
            kv_cache_gb=args.kv_cache_gb,
            enforce_eager=name != "vllm-compiled",
            enable_prefix_caching=name != "vllm-no-prefix-cache",
            max_num_seqs=config.rollout_batch_size,
        )
        start_s[name] = time.perf_counter() - start

    submitted = dict.fromkeys(built, 0)  # prompt tokens handed to each engine

    def counting(name, generate):
        def wrapped(prompts, *a, **kw):
            submitted[name] += sum(len(p) for p in prompts)
            return generate(prompts, *a, **kw)

        return wrapped

    for name, engine in built.items():
        engine.generate = counting(name, engine.generate)

    seeds, sample_seed = training_group_seeds(0, 0, args.groups)
    groups = list(range(args.groups))
    best: dict[str, dict] = {}
    for round_ in range(args.rounds + 1):  # round 0 warms every engine up
        for name in engines:
            runner.engine = built[name]
            reused, fed = runner.engine.prompt_tokens_reused, submitted[name]
            start = time.perf_counter()
            trajs = runner.sample_groups(seeds, groups, sample_seed)
            seconds = time.perf_counter() - start
            if round_ == 0:
                continue
            row = {
                "seconds": round(seconds, 2),
                "trajectories_per_s": round(len(trajs) / seconds, 2),
                "generated_tokens_per_s": round(sum(t.response_tokens for t in trajs) / seconds),
                "turns_mean": round(sum(t.num_turns for t in trajs) / len(trajs), 2),
                "prompt_tokens": submitted[name] - fed,
                "prompt_tokens_from_cache": runner.engine.prompt_tokens_reused - reused,
                "engine_start_s": round(start_s[name], 1),
            }
            if name not in best or seconds < best[name]["seconds"]:
                best[name] = row
    figures = {
        "env": args.env,
        "P": args.groups,
        "N": args.group_size,
        "max_turns": args.turns,
        "threads": args.threads,
        "engines": best,
    }
    if "hf" in best:
        for row in best.values():
            row["speed_vs_hf"] = round(best["hf"]["seconds"] / row["seconds"], 2)
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
