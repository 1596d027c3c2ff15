"""Batched multi-turn rollout against naive loops, side by side in one process.

The batched path is what training uses: ``LLMEnvRunner.sample_groups`` plays all
P x N trajectories in lockstep, one engine batch per turn, with the keys and
values of each trajectory kept between turns. It is timed against two loops
that play one env at a time and encode the whole history again at every turn:

- ``naive``: the straightforward agent loop. Each turn the conversation so far is
  tokenized from its messages and passed to Hugging Face ``generate`` (sampling
  at the same temperature, the scores kept for the log-probabilities the
  learner needs);
- ``engine_batch_1``: a stricter control that isolates batching and caching. This
  project's engine runs at batch size 1, with its prefix cache disabled, so
  every turn re-encodes the history.

All three use the same model, env, sampling settings and torch threads. The
figure is trajectories per second.

    python bench/bench_rollout.py                      # FrozenLake, P=8 x N=16, 5 turns
    python bench/bench_rollout.py --naive-trajectories 32

The naive loops are timed on a subset (``--naive-trajectories``, spread over the
groups) because they are slow; trajectories per second does not depend on how
many are played.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass


@dataclass
class NaiveEpisode:
    num_turns: int
    response_tokens: int
    success: bool


def naive_episode(runner, seed: int, params, sample_seed: int) -> NaiveEpisode:
    """One episode played the straightforward way: every turn the whole conversation
    is tokenized again and handed to ``generate``, which encodes it from scratch."""
    import torch

    from ragen_rllib.chat.prompts import render_turn, with_instructions
    from ragen_rllib.env_choice.env_loading import actions_left_of, make_env

    cfg, chat, tok = runner.config, runner.chat, runner.tokenizer
    model = runner.engine.model
    env = make_env(cfg)
    obs, info = env.reset(seed=seed)
    first = with_instructions(
        env.unwrapped, render_turn(1, obs, actions_left_of(info), None, cfg.prompt_style),
        cfg.prompt_style,
    )  # fmt: skip
    history: list[tuple[list[int], bool, str]] = []
    generated, success = 0, False
    for turn in range(1, cfg.max_turns + 1):
        ids = chat.conversation_ids(first, history)
        torch.manual_seed(sample_seed * 1000 + turn)
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
            do_sample=True,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=0,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=tok.eos_token_id,
            pad_token_id=runner.engine.pad_token_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        answer = out.sequences[0, len(ids) :].tolist()
        # The learner needs each sampled token's log-probability under softmax(logits / T).
        scores = torch.stack(out.scores)[:, 0]  # [new tokens, V], temperature applied
        logp = torch.log_softmax(scores.float(), -1).gather(-1, torch.tensor(answer)[:, None])
        assert logp.shape[0] == len(answer)
        generated += len(answer)
        eos = bool(answer) and answer[-1] == tok.eos_token_id
        text = chat.prefill + tok.decode(answer, skip_special_tokens=True)
        obs, reward, term, trunc, info = env.step(text)
        success = bool(info.get("success", reward > 0))
        if term or trunc:
            break
        user = render_turn(turn + 1, obs, actions_left_of(info), reward, cfg.prompt_style)
        history.append((answer, eos, user))
    return NaiveEpisode(turn, generated, success)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="ragen/FrozenLake-v0")
    parser.add_argument("--llm", default="builtin")
    parser.add_argument("--groups", type=int, default=8, help="P")
    parser.add_argument("--group-size", type=int, default=16, help="N")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--naive-trajectories", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="batched runs (best is kept)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.engines.base import SamplingParams
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
    naive = [
        naive_episode(runner, seed, params, sample_seed + i) for i, seed in enumerate(flat_seeds)
    ]
    naive_s = time.perf_counter() - start

    cached_generate = runner.engine.generate

    def generate_without_cache(prompts, params, seed, cache_keys=None):
        return cached_generate(prompts, params, seed)

    runner.engine.generate = generate_without_cache
    start = time.perf_counter()
    single = []
    for i, seed in enumerate(flat_seeds):  # batch size 1, history re-encoded per turn
        single += runner.run_episodes([seed], [0], params, sample_seed=sample_seed + i)
    single_s = time.perf_counter() - start
    runner.engine.generate = cached_generate

    def summary(batch, seconds):
        return {
            "trajectories": len(batch),
            "seconds": round(seconds, 2),
            "trajectories_per_s": round(len(batch) / seconds, 2),
            "turns_mean": round(sum(t.num_turns for t in batch) / len(batch), 2),
            "turns_per_s": round(sum(t.num_turns for t in batch) / seconds, 1),
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
        "engine_batch_1": summary(single, single_s),
    }
    figures["speedup_trajectories_per_s"] = {
        baseline: round(
            figures["batched"]["trajectories_per_s"] / figures[baseline]["trajectories_per_s"], 1
        )
        for baseline in ("naive", "engine_batch_1")
    }
    # Episodes end at different turns, so the per-turn ratio is printed beside it.
    figures["speedup_turns_per_s"] = {
        baseline: round(figures["batched"]["turns_per_s"] / figures[baseline]["turns_per_s"], 1)
        for baseline in ("naive", "engine_batch_1")
    }
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
