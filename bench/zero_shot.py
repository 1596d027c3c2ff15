"""Zero-shot: how a model plays the envs before any training, through the trainer's runner.

For each env, the share of answers in the required format and the success rate
on the fixed evaluation states (seeds 0..N-1, as the trainer's evaluation), at
each temperature asked for, with the run's prompt settings; and the rollout's
generated tokens per second. Nothing is trained.

    python bench/zero_shot.py --llm smollm2-135m-instruct                 # 4 envs, 256 states
    python bench/zero_shot.py --llm smollm2-135m-instruct --envs ragen/Bandit-v0 \\
        --states 64 --temperatures 1.0 --prompt '{"format_hint": "..."}'  # another wording
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

DEFAULT_ENVS = (
    "ragen/Bandit-v0",
    "ragen/FrozenLakeNoSlip-v0",
    "ragen/SimpleSokoban-v0",
    "ragen/Countdown-v0",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm", default="smollm2-135m-instruct")
    parser.add_argument("--envs", nargs="*", default=list(DEFAULT_ENVS))
    parser.add_argument("--states", type=int, default=256)
    parser.add_argument("--temperatures", type=float, nargs="*", default=[0.5])
    parser.add_argument("--max-turns", type=int, default=5, help="1 for the Bandit always")
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--prompt-style", default="full")
    parser.add_argument("--prompt", default=None, help="JSON: the `prompt` setting")
    parser.add_argument("--prefill", default="<think>")
    parser.add_argument("--env-config", default="{}", help="JSON: env kwargs for every env")
    parser.add_argument("--warmup-steps", type=int, default=0, help="format_warmup_steps")
    parser.add_argument("--warmup-lr", type=float, default=5e-5, help="format_warmup_lr")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--show", type=int, default=0, help="print this many answers per env")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner

    rows = []
    print("| env | T | format-valid (turns) | success | tokens/s | s |")
    print("|---|---|---|---|---|---|")
    for env_id in args.envs:
        config = StarPOConfig.from_user_dict(
            {
                "env": env_id,
                "env_config": json.loads(args.env_config),
                "llm": args.llm,
                "prompt_style": args.prompt_style,
                "prompt": json.loads(args.prompt) if args.prompt else None,
                "prefill": args.prefill,
                "max_turns": 1 if "Bandit" in env_id else args.max_turns,
                "max_new_tokens": args.max_new_tokens,
                "format_warmup_steps": args.warmup_steps,
                "format_warmup_lr": args.warmup_lr,
                "env_groups": 1,
                "group_size": 1,
                "minibatch_size": 1,
            }
        )
        runner = LLMEnvRunner(config=config, worker_index=0)
        for t in args.temperatures:
            start = time.perf_counter()
            metrics, trajs = runner.evaluate(args.states, 0, t)
            seconds = time.perf_counter() - start
            tokens = sum(tr.response_tokens for tr in trajs)
            row = {
                "env": env_id,
                "temperature": t,
                "states": args.states,
                "format_valid_rate": metrics.get("format_valid_rate", float("nan")),
                "success_rate": metrics["success_rate"],
                "generated_tokens": tokens,
                "tokens_per_s": tokens / seconds,
                "seconds": round(seconds, 1),
            }
            rows.append(row)
            print(
                f"| {env_id} | {t} | {row['format_valid_rate']:.3f} | "
                f"{row['success_rate']:.3f} | {row['tokens_per_s']:.0f} | {seconds:.0f} |",
                flush=True,
            )
            for tr in trajs[: args.show]:
                print(f"  success={tr.success} answers={[a[:160] for a in tr.answers]}")
        runner.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
