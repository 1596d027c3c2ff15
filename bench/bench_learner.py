"""Learner tokens/s on a multi-turn batch: packed rows vs padding, side by side.

One batch of FrozenLake trajectories (P=8 x N=16, up to 5 turns, built-in model)
is sampled once; then the same learner update (GRPO, minibatches of 32
trajectories) runs with each setting, alternating, in one process, and the best
of ``--repeats`` is kept:

- ``padded``: each minibatch in one forward/backward pass, every row padded to
  the minibatch's longest (the path before micro-batches);
- ``sorted``: micro-batches of at most ``--micro-tokens`` padded tokens, rows of
  similar length together, still padded;
- ``packed``: the same micro-batches with their rows laid end to end in one
  sequence (``pack_sequences``), so no compute goes to padding;
- ``default``: what training runs: packed, except that rows sharing their
  prompt (a group's first turn) encode it once when that saves more;
- ``default-rescore``: ``default`` with ``log_rollout_mismatch`` on: the learner
  connector scores the batch once more without gradients before the update (as
  ``rollout_correction`` does), which prices that extra forward pass.

The first three encode every row in full (shared prompts off), so they differ
only in how padding is handled.

    python bench/bench_learner.py
    python bench/bench_learner.py --micro-tokens 2048 --threads 2

Tokens/s counts real (unpadded) tokens; the padding share of each setting is
printed too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="ragen/FrozenLake-v0")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--minibatch-size", type=int, default=32)
    parser.add_argument("--micro-tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
    from ragen_rllib.maths.batching import microbatch_rows

    def config(micro, pack=True, rescore=False):
        return StarPOConfig.from_user_dict(
            {
                "env": args.env,
                "env_groups": args.groups,
                "group_size": args.group_size,
                "max_turns": args.turns,
                "max_new_tokens": 32,
                "minibatch_size": args.minibatch_size,
                "filter_keep_ratio": 1.0,
                "advantage_estimator": "grpo",
                "max_tokens_per_microbatch": micro,
                "pack_sequences": pack,
                "log_rollout_mismatch": rescore,
                "seed": 0,
            }
        )

    runner = LLMEnvRunner(config=config(None), worker_index=0)
    trajs = runner.sample()
    spaces = runner.get_spaces()
    lengths = [t.num_tokens for t in trajs]
    real = sum(lengths)

    def padded_tokens(micro, pack):
        total = 0
        for start in range(0, len(lengths), args.minibatch_size):
            part = lengths[start : start + args.minibatch_size]
            for rows in microbatch_rows(part, micro):
                longest = max(part[i] for i in rows)
                total += sum(part[i] for i in rows) if pack else len(rows) * longest
        return total

    from ragen_rllib.rl_module import scoring

    settings = {  # name: (micro-batch budget, packing, shared prompts, rescoring)
        "padded": (None, False, False, False),
        "sorted": (args.micro_tokens, False, False, False),
        "packed": (args.micro_tokens, True, False, False),
        "default": (args.micro_tokens, True, True, False),
        "default-rescore": (args.micro_tokens, True, True, True),
    }
    learners = {}
    for name, (micro, pack, _, rescore) in settings.items():
        torch.manual_seed(0)
        learner = config(micro, pack, rescore).build_learner(spaces=spaces)
        learner.build()
        learners[name] = learner
    shared_saving = scoring.MIN_SHARED_SAVING
    best: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, learner in learners.items():
            # Shared prompts off: a saving above 100% is never reached.
            scoring.MIN_SHARED_SAVING = shared_saving if settings[name][2] else 2.0
            start = time.perf_counter()
            learner.update(episodes=trajs, minibatch_size=args.minibatch_size, num_epochs=1)
            seconds = time.perf_counter() - start
            best[name] = min(best.get(name, seconds), seconds)
    scoring.MIN_SHARED_SAVING = shared_saving
    rows = {
        name: {
            "update_s": round(best[name], 2),
            "tokens_per_s": round(real / best[name]),
            # (The shared-prompt path pads each row's remainder; not counted here.)
            "padding_share": None if shared else round(1 - real / padded_tokens(micro, pack), 3),
        }
        for name, (micro, pack, shared, _) in settings.items()
    }
    print(
        json.dumps(
            {
                "env": args.env,
                "trajectories": len(trajs),
                "turns_mean": round(sum(t.num_turns for t in trajs) / len(trajs), 2),
                "real_tokens": real,
                "threads": args.threads,
                "micro_tokens": args.micro_tokens,
                "settings": rows,
                "speedup_vs_padded": {
                    name: round(best["padded"] / best[name], 2) for name in settings
                },
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
