"""Does the pretrained built-in model hold a policy? Its success against random agents.

For every env with an action vocabulary the built-in model was pretrained on
(``BUILTIN_MODEL_ENV_IDS``; the free-text envs' random agents are the demo's),
on the same fixed evaluation states (seeds 0..N-1, as the trainer's evaluation)
and with the same turn limit, this prints the success of

- the model at temperature 0.5 (the evaluation temperature) and 1.0 (the
  training temperature), through the trainer's own env runner;
- ``random 1-3``: uniformly random valid actions, 1 to 3 a turn, which is how
  the pretraining transcripts play;
- ``random 1-5``: 1 to ``max_actions_per_turn`` a turn, the random agent of
  ``python -m ragen_envs.demo``;

and the model's margin over the better random agent. A model without a policy
stays within a few points of the random agents (below them is possible:
sampling sharper than uniform can make a random policy worse).

    python bench/bench_no_policy.py                        # compact prompts, 256 states
    python bench/bench_no_policy.py --prompt-style full --states 128
    python bench/bench_no_policy.py --llm /path/to/model --envs ragen/Bandit-v0
    python bench/bench_no_policy.py --max-turns 10 --max-actions-per-turn 1 --context-window 0 \
        --coordinates   # the CPU examples' setting: one move a turn, the current observation
                        # only, with the coordinates line under the grid
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import gymnasium as gym
import numpy as np
import torch

import ragen_envs


def random_success(
    env_id: str, env_config: dict, states: int, max_turns: int, most: int | None
) -> float:
    """Success of uniformly random valid actions, 1..most a turn (None: the env's maximum)."""
    env = gym.make(env_id, **env_config).unwrapped
    rng = np.random.default_rng(0)
    wins = 0
    for seed in range(states):
        env.reset(seed=seed)
        info = {"success": False}
        top = env.parser.max_actions if most is None else min(most, env.parser.max_actions)
        for _ in range(max_turns):
            n = 1 if env.action_budget == 1 else int(rng.integers(1, top + 1))
            actions = f" {env.parser.separator} ".join(rng.choice(env.action_names, size=n))
            _, _, term, trunc, info = env.step(f"<think> x </think> <answer> {actions} </answer>")
            if term or trunc:
                break
        wins += bool(info["success"])
    return wins / states


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm", default="builtin")
    # The built-in model's envs: the registry also holds envs it was not pretrained on
    # (and free-text ones, which the random agents here cannot play).
    parser.add_argument(
        "--envs",
        nargs="*",
        default=[i for i in ragen_envs.BUILTIN_MODEL_ENV_IDS if gym.make(i).unwrapped.action_names],
        help="default: the pretrained envs with an action vocabulary (the random agents "
        "here draw action names)",
    )
    parser.add_argument("--states", type=int, default=256)
    parser.add_argument("--max-turns", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--prompt-style", choices=("compact", "full"), default="compact")
    parser.add_argument("--temperatures", type=float, nargs="*", default=[0.5, 1.0])
    parser.add_argument(
        "--max-actions-per-turn", type=int, default=None, help="the envs' limit (default: theirs)"
    )
    parser.add_argument(
        "--context-window", type=int, default=None, help="turns of history (default: all)"
    )
    parser.add_argument(
        "--coordinates", action="store_true", help="grid envs: the coordinates line under the grid"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner

    rows = []
    head = ["env", "random 1-3", "random 1-5"] + [f"model T={t}" for t in args.temperatures]
    print("| " + " | ".join(head + ["margin"]) + " |")
    print("|" + "---|" * (len(head) + 1))
    for env_id in args.envs:
        env_config = {"instructions": args.prompt_style}
        if args.max_actions_per_turn is not None:
            env_config["max_actions_per_turn"] = args.max_actions_per_turn
        if args.coordinates and gym.make(env_id).unwrapped.landmark_symbols:
            env_config["coordinates"] = True
        config = StarPOConfig.from_user_dict(
            {
                "env": env_id,
                "env_config": env_config,
                "llm": args.llm,
                "prompt_style": args.prompt_style,
                "context_window": args.context_window,
                "max_turns": args.max_turns,
                "max_new_tokens": args.max_new_tokens,
                "env_groups": 1,
                "group_size": 1,
                "minibatch_size": 1,
            }
        )
        runner = LLMEnvRunner(config=config, worker_index=0)
        start = time.perf_counter()
        row = {
            "env": env_id,
            "random_1_3": random_success(env_id, env_config, args.states, args.max_turns, 3),
            "random_1_5": random_success(env_id, env_config, args.states, args.max_turns, None),
        }
        for t in args.temperatures:
            metrics, _ = runner.evaluate(args.states, 0, t)
            row[f"model_T{t}"] = metrics["success_rate"]
            row[f"valid_T{t}"] = metrics.get("env/action_is_valid", float("nan"))
        best_random = max(row["random_1_3"], row["random_1_5"])
        row["margin"] = max(row[f"model_T{t}"] for t in args.temperatures) - best_random
        row["seconds"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        cells = [row["random_1_3"], row["random_1_5"]] + [
            row[f"model_T{t}"] for t in args.temperatures
        ]
        print(
            f"| {env_id} | " + " | ".join(f"{c:.3f}" for c in cells) + f" | {row['margin']:+.3f} |",
            flush=True,
        )
        runner.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
