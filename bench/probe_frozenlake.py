"""What success can FrozenLake give, and can the built-in model read the grid at all?

Two measurements that bound what RL on the CPU example can reach:

1. **Scripted agents** through the text interface, on the trainer's limits
   (``--turns`` turns, the env's 10-action budget): random 1-3 moves a turn
   (what the built-in model's warm start imitates), random single moves, and an
   exact shortest-path planner that plays 1, 2 or 5 moves a turn and replans
   every turn. On the slippery lake even the planner is capped well below 100%.
2. **A supervised probe of the built-in model**: starting from the
   warm-started weights, train on first-turn prompts of the non-slippery lake
   with the planner's first move as the answer, and report how often the
   model's preferred action token (after ``<answer>``) is the planner's move on
   held-out states, next to the best fixed guess (the most common planner
   move). If supervision with the right answer cannot lift it above the
   fixed guess, RL with a 0/1 reward will not either within minutes.

    python bench/probe_frozenlake.py                 # about 3 minutes on 2 cores
    python bench/probe_frozenlake.py --steps 2000 --lr 3e-3
"""

from __future__ import annotations

import argparse
import collections
import time

import gymnasium as gym
import numpy as np

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_envs.frozenlake import shortest_path

MOVES = ("Up", "Down", "Left", "Right")


def scripted_success(env_id: str, agent: str, episodes: int, turns: int) -> float:
    env = gym.make(env_id).unwrapped
    rng = np.random.default_rng(0)
    wins = 0
    for seed in range(episodes):
        env.reset(seed=seed)
        for _ in range(turns):
            if agent == "random 1-3":
                moves = [MOVES[i] for i in rng.integers(4, size=int(rng.integers(1, 4)))]
            elif agent == "random 1":
                moves = [MOVES[int(rng.integers(4))]]
            else:  # "planner k"
                k = int(agent.split()[1])
                moves = (shortest_path(env.holes, env.player, env.goal) or ["Up"])[:k]
            answer = f"<think>x</think><answer>{' || '.join(moves)}</answer>"
            _, _, terminated, truncated, _ = env.step(answer)
            if terminated or truncated:
                break
        wins += env.player == env.goal
    return wins / episodes


def supervised_probe(steps: int, lr: float, batch: int, eval_states: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragen_rllib.builtin_model import _answer_loss, _batch, resolve_model
    from ragen_rllib.context import ChatFormat, first_user_text

    path = resolve_model("builtin")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    fmt = ChatFormat(tok)
    env = gym.make("ragen/FrozenLakeNoSlip-v0").unwrapped
    head = tok.encode(" go </think> <answer>", add_special_tokens=False)
    move_ids = [tok.encode(" " + m, add_special_tokens=False)[0] for m in MOVES]

    def state(seed: int) -> tuple[list[int], str]:
        obs, info = env.reset(seed=seed)
        prompt = fmt.prompt_ids(first_user_text(env, obs, info["actions_left"]))
        return prompt, shortest_path(env.holes, env.player, env.goal)[0]

    held_out = [state(10**6 + i) for i in range(eval_states)]
    counts = collections.Counter(move for _, move in held_out)
    best_guess, best_n = counts.most_common(1)[0]

    @torch.no_grad()
    def accuracy() -> float:
        model.eval()
        hits = 0
        for prompt, move in held_out:
            logits = model(torch.tensor([prompt + head])).logits[0, -1]  # [V]
            hits += MOVES[int(logits[move_ids].argmax())] == move
        model.train()
        return hits / len(held_out)

    print(f"held-out states: {len(held_out)}; planner's first moves {dict(counts)}")
    print(f"best fixed guess ({best_guess!r}): {best_n / len(held_out):.3f}")
    print(f"step 0: planner's move picked {accuracy():.3f}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        examples = []
        for _ in range(batch):
            prompt, move = state(int(rng.integers(10**6)))
            answer = tok.encode(f" go </think> <answer> {move} </answer>", add_special_tokens=False)
            answer.append(tok.eos_token_id)
            examples.append((prompt + answer, [-100] * len(prompt) + answer))
        loss = _answer_loss(model, **_batch(examples, tok.pad_token_id))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % max(1, steps // 6) == 0 or step == steps:
            print(
                f"step {step}: loss {loss.item():.3f}, planner's move picked {accuracy():.3f} "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000, help="episodes per scripted agent")
    parser.add_argument("--turns", type=int, default=5, help="turns per episode (max_turns)")
    parser.add_argument("--steps", type=int, default=600, help="supervised steps (0: skip)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--eval-states", type=int, default=200)
    args = parser.parse_args(argv)

    agents = ("random 1-3", "random 1", "planner 1", "planner 2", "planner 5")
    for env_id in ("ragen/FrozenLake-v0", "ragen/FrozenLakeNoSlip-v0"):
        figures = {a: scripted_success(env_id, a, args.episodes, args.turns) for a in agents}
        print(
            f"{env_id}, {args.turns} turns: "
            + ", ".join(f"{a} {v:.3f}" for a, v in figures.items())
        )
    if args.steps:
        supervised_probe(args.steps, args.lr, args.batch, args.eval_states)


if __name__ == "__main__":
    main()
