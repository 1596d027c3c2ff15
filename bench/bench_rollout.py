"""Batched multi-turn rollout against a naive loop, side by side in one process.

The batched path is what training uses: ``LLMEnvRunner.sample_groups`` plays all
P x N trajectories in lockstep, one engine batch per turn. The naive loop plays
one env at a time through the same engine and re-encodes the whole history at
every turn (what a straightforward agent loop does). Both use the same model,
env, sampling settings and torch threads; the figure is trajectories per second.

    python bench/bench_rollout.py                      # FrozenLake, P=8 x N=16, 5 turns
    python bench/bench_rollout.py --naive-trajectories 32

The naive loop is timed on a subset (``--naive-trajectories``) because it is slow;
trajectories per second does not depend on how many are played.
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--naive-trajectories", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="batched runs (best is kept)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from ragen_rllib.config import StarPOConfig
    from ragen_rllib.engine import SamplingParams
    from ragen_rllib.env_runner import LLMEnvRunner, training_group_seeds

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
    runner = LLMEnvRunner(config=config, worker_index=0)
    seeds, sample_seed = training_group_seeds(0, 0, args.groups)
    groups = list(range(args.groups))
    runner.sample_groups(seeds[:1], groups[:1], sample_seed)  # warm-up

    batched = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        trajs = runner.sample_groups(seeds, groups, sample_seed)
        batched.append((time.perf_counter() - start, trajs))
    batched_s, trajs = min(batched, key=lambda x: x[0])

    params = SamplingParams(config.temperature, config.top_p, config.max_new_tokens)
    flat = [s for s in seeds for _ in range(args.group_size)]
    step = max(1, len(flat) // args.naive_trajectories)  # spread over the groups
    flat_seeds = flat[::step][: args.naive_trajectories]
    start = time.perf_counter()
    naive = []
    for i, seed in enumerate(flat_seeds):  # one env at a time, history re-encoded per turn
        naive += runner.run_episodes([seed], [0], params, sample_seed=sample_seed + i)
    naive_s = time.perf_counter() - start

    def summary(batch, seconds):
        return {
            "trajectories": len(batch),
            "seconds": round(seconds, 2),
            "trajectories_per_s": round(len(batch) / seconds, 2),
            "turns_mean": round(sum(t.num_turns for t in batch) / len(batch), 2),
            "generated_tokens_per_s": round(sum(t.response_tokens for t in batch) / seconds, 1),
        }

    figures = {
        "env": args.env,
        "P": args.groups,
        "N": args.group_size,
        "max_turns": args.turns,
        "threads": args.threads,
        "batched": summary(trajs, batched_s),
        "naive": summary(naive, naive_s),
    }
    figures["speedup_trajectories_per_s"] = round(
        figures["batched"]["trajectories_per_s"] / figures["naive"]["trajectories_per_s"], 1
    )
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
