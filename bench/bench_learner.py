"""Learner tokens/s on a multi-turn batch: padding, packing and shared prefixes, side by side.

One batch is sampled once; then the same learner update runs with each setting,
alternating, in one process, and the median of ``--repeats`` is kept:

- ``padded``: each minibatch in one forward/backward pass, every row padded to
  the minibatch's longest (the path before micro-batches);
- ``sorted``: micro-batches of at most ``--micro-tokens`` padded tokens, rows of
  similar length together, still padded;
- ``packed``: the same micro-batches with their rows laid end to end in one
  sequence (``pack_sequences``), so no compute goes to padding;
- ``shared``: what training runs: packed, with each token prefix the rows of a
  pass share encoded once (``share_prefixes``: the system message and
  instructions of every row, a group's first prompt, a trajectory's earlier
  turns), the micro-batches bounded by the tokens they encode;
- ``shared-rescore``: ``shared`` with ``log_rollout_mismatch`` on: the learner
  connector scores the batch once more without gradients before the update (as
  ``rollout_correction`` does), which prices that extra forward pass.

By default the batch is FrozenLake with the built-in model (P=8 x N=16, up to 5
turns, GRPO, minibatches of 32); ``--file`` takes an experiment's config instead
(its model, envs, batch and micro-batch bound; ``--config`` merges JSON into it).

    python bench/bench_learner.py
    python bench/bench_learner.py --file tuned_examples/frozenlake_noslip_smollm2_cpu.yaml \
        --settings packed shared --repeats 3

Tokens/s counts real (unpadded) row tokens; each setting also prints the
tokens its passes ran through the transformer (``encoded_tokens``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

#: name: (packing, shared prefixes, micro-batches bounded, rescoring)
SETTINGS = {
    "padded": (False, False, False, False),
    "sorted": (False, False, True, False),
    "packed": (True, False, True, False),
    "shared": (True, True, True, False),
    "shared-rescore": (True, True, True, True),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=None, help="an experiment YAML to take the config of")
    parser.add_argument("--config", default=None, help="JSON merged into --file's config")
    parser.add_argument("--env", default="ragen/FrozenLake-v0")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--minibatch-size", type=int, default=32)
    parser.add_argument(
        "--micro-tokens", type=int, default=None, help="default: --file's, else 4096"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
    from ragen_rllib.maths.batching import microbatches, prefix_tree

    if args.file:
        from ragen_rllib.cli.experiments import load_experiments

        _, exp = next(iter(load_experiments(args.file).items()))
        user = {**(exp.get("config") or {}), "env": exp.get("env", "ragen/SimpleSokoban-v0")}
        user.update(json.loads(args.config) if args.config else {})
    else:
        user = {
            "env": args.env,
            "env_groups": args.groups,
            "group_size": args.group_size,
            "max_turns": args.turns,
            "max_new_tokens": 32,
            "minibatch_size": args.minibatch_size,
            "filter_keep_ratio": 1.0,
            "advantage_estimator": "grpo",
            "max_tokens_per_microbatch": 4096,
            "seed": 0,
        }
    micro = args.micro_tokens or user.get("max_tokens_per_microbatch") or 4096

    def config(pack, share, bounded, rescore):
        return StarPOConfig.from_user_dict(
            {
                **user,
                "max_tokens_per_microbatch": micro if bounded else None,
                "pack_sequences": pack,
                "share_prefixes": share,
                "log_rollout_mismatch": rescore,
                "eval_interval": 0,
            }
        )

    runner = LLMEnvRunner(config=config(True, True, True, False), worker_index=0)
    trajs = runner.sample()
    spaces = runner.get_spaces()
    minibatch = user["minibatch_size"]
    learners = {}
    for name in args.settings:
        torch.manual_seed(0)
        learner = config(*SETTINGS[name]).build_learner(spaces=spaces)
        learner.build()
        learners[name] = learner
    # The rows each minibatch is cut into, as the learner cuts them.
    from ragen_rllib.learner.connectors import build_learner_pipeline

    module = next(iter(learners.values())).module["default_policy"]
    times: dict[str, list[float]] = {name: [] for name in learners}
    for _ in range(args.repeats):
        for name, learner in learners.items():
            start = time.perf_counter()
            learner.update(episodes=trajs, minibatch_size=minibatch, num_epochs=1)
            times[name].append(time.perf_counter() - start)

    def tokens(pack, share, bounded):
        """(real row tokens, tokens the passes run: padded, packed or the trees')"""
        real = ran = 0
        for start in range(0, len(trajs), minibatch):
            part = trajs[start : start + minibatch]
            cols = build_learner_pipeline(config(pack, share, bounded, False))(
                rl_module={"default_policy": module}, batch={}, episodes=part
            )["default_policy"]
            ids, mask = cols["input_ids"], cols["attention_mask"]
            plan = microbatches(ids, mask, micro if bounded else None, share and pack)
            for rows in plan:
                lengths = mask[rows].sum(1)
                real += int(lengths.sum())
                if share and pack:
                    ran += prefix_tree(ids[rows].numpy(), lengths.numpy()).encoded
                elif pack:
                    ran += int(lengths.sum())
                else:
                    ran += len(rows) * int(lengths.max())
        return real, ran

    rows = {}
    for name in learners:
        pack, share, bounded, _ = SETTINGS[name]
        real, ran = tokens(pack, share, bounded)
        median = statistics.median(times[name])
        rows[name] = {
            "update_s": round(median, 2),
            "update_s_all": [round(t, 2) for t in times[name]],
            "tokens_per_s": round(real / median),
            "row_tokens": real,
            "encoded_tokens": ran,
        }
    first = args.settings[0]
    print(
        json.dumps(
            {
                "file": args.file,
                "env": user["env"],
                "trajectories": len(trajs),
                "turns_mean": round(sum(t.num_turns for t in trajs) / len(trajs), 2),
                "threads": args.threads,
                "micro_tokens": micro,
                "settings": rows,
                f"speedup_vs_{first}": {
                    name: round(rows[first]["update_s"] / rows[name]["update_s"], 2)
                    for name in learners
                },
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
