"""Can the run's model make its Kuhn Poker action depend on its card, and how fast?

A supervised probe, used only to choose the learning rate and to read what limits
the Kuhn Poker runs; its labels are never training data. It loads the model a run
trains (the tuned example's ``llm`` after its format warm-up, built and cached as
the run would) and the run's own first-turn prompts against a fixed opponent
(either seat, before or after the opponent's move; a self-play example is refused:
without an opponent its second seat would be shown a first prompt before any
move), each followed by a fixed think text and ``<answer>``. It scores every
allowed action by the log-probability of its answer text and reports, over
``--eval-states`` drawn first turns:

- ``rule``: the mean probability (renormalised over the allowed actions) of the
  card rule: with K bet or call, with J check or fold, with Q check or call. The
  rule scores exactly the game's value against the Nash strategy;
- ``gap``: P(bet or call | K) - P(bet or call | J), how much the card moves the
  action at all (0 for a card-blind model).

Then it trains on the rule's answers (loss on the answer tokens, AdamW, batch
``--batch``, constant lr) and prints both figures every ``--eval-every`` steps: the
number of clean supervised steps the action needs to follow the card at the run's
learning rate. A reinforcement signal is noisier than these labels, so it needs
at least that many updates. There are only nine distinct first-turn prompts (three
cards; the first seat, the second after a check, the second after a bet), so
training and evaluation draw the same nine: the probe asks whether the action can
follow the card at a given rate, not whether anything generalises.

    python bench/probe_kuhn_card.py tuned_examples/kuhn_poker_smollm2_cpu.yaml --lr 1e-5 1e-4 \
        --steps 20 --eval-every 10 --eval-states 60

Measured (SmolLM2-135M-Instruct after the example's format warm-up, seed 0; 60
drawn first turns; batch 16; 2 threads, about 22 s a step: the prompts hold the
rules): at the start ``rule`` 0.482, ``gap`` 0.013 (card-blind). At lr 1e-5 after
10 steps: 0.504, -0.010 (nothing moved). At lr 1e-4 after 10 steps: 0.588, 0.211;
after 20: 0.999, 0.998 (the action follows the card).
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import numpy as np
import torch

RULE = {  # card -> (action without a bet to face, action facing a bet)
    0: ("check", "fold"),
    1: ("check", "call"),
    2: ("bet", "call"),
}


def first_turns(config, tokenizer, count: int, seed0: int):
    """``count`` (prompt ids, card, allowed actions, rule action) of the run's first
    turns, on seeds from ``seed0``, and the run's prefill. The prompts are the
    runner's own (``first_prompt_ids``); the labels come from the same seeds'
    states."""
    from ragen_rllib.env_choice.env_loading import make_eval_env
    from ragen_rllib.env_choice.env_mix import format_of, mix_entries
    from ragen_rllib.env_runner.context_budget import first_prompt_ids

    if config.self_play_used:
        raise SystemExit(
            "probe_kuhn_card.py reads a fixed-opponent example (self_play: false); "
            "the self-play examples' model is the same, give kuhn_poker_smollm2_cpu.yaml"
        )
    entry = mix_entries(config)[0]
    seeds = range(seed0, seed0 + count)
    prompts = first_prompt_ids(entry, config, tokenizer, seeds)
    env = make_eval_env(entry)
    rows = []
    for seed, prompt in zip(seeds, prompts, strict=True):
        env.reset(seed=seed)
        inner = env.unwrapped
        card = inner.game.cards[inner.seat]
        allowed = tuple(inner.action_names)
        rows.append((prompt, card, allowed, RULE[card][1 if "call" in allowed else 0]))
    env.close()
    return rows, format_of(entry, config).prefill


def answer_ids(tokenizer, action: str, think: str, prefill: str = "<think>") -> list[int]:
    """The answer's ids after the run's ``prefill``, ending in EOS, as rollouts sample it."""
    text = f"<think> {think} </think> <answer> {action} </answer>"
    if not text.startswith(prefill):
        raise SystemExit(f"the probe writes '<think>' answers; the run's prefill is {prefill!r}")
    ids = tokenizer.encode(text[len(prefill) :], add_special_tokens=False)
    return list(ids) + [tokenizer.eos_token_id]


def batch_logprob(model, pairs, pad: int) -> torch.Tensor:
    """Sum of the answer tokens' log-probabilities of each (prompt, answer) pair, scored
    as the learner scores responses (``response_logprobs``: the vocabulary projection
    only at the answer's positions; the prompts are long)."""
    from ragen_rllib.rl_module.scoring import response_logprobs

    width = max(len(p) + len(a) for p, a in pairs)
    ids = torch.full((len(pairs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    answer = torch.zeros((len(pairs), width), dtype=torch.long)
    for r, (p, a) in enumerate(pairs):
        ids[r, : len(p) + len(a)] = torch.tensor(p + a)
        mask[r, : len(p) + len(a)] = 1
        answer[r, len(p) : len(p) + len(a)] = 1
    batch = {"input_ids": ids, "attention_mask": mask, "response_mask": answer}
    return response_logprobs(model, batch, temperature=1.0)["logp"].sum(-1)


@torch.no_grad()
def evaluate(model, tokenizer, rows, think: str, prefill: str, pad: int) -> dict[str, float]:
    rule_p, aggressive = [], {0: [], 2: []}
    for prompt, card, allowed, rule in rows:
        pairs = [(prompt, answer_ids(tokenizer, a, think, prefill)) for a in allowed]
        probs = torch.softmax(batch_logprob(model, pairs, pad), 0)
        p = dict(zip(allowed, probs.tolist(), strict=True))
        rule_p.append(p[rule])
        if card in aggressive:
            aggressive[card].append(p.get("bet", 0.0) + p.get("call", 0.0))
    if not (aggressive[0] and aggressive[2]):
        raise SystemExit("--eval-states drew no J or no K: draw more")
    return {
        "rule": round(float(np.mean(rule_p)), 3),
        "gap": round(float(np.mean(aggressive[2]) - np.mean(aggressive[0])), 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", help="a Kuhn Poker tuned example (its model and prompts)")
    parser.add_argument("--lr", type=float, nargs="+", default=[1e-5])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-states", type=int, default=96)
    parser.add_argument("--think", default="I look at my card", help="the think text")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--config", default=None, help="JSON object merged into the config")
    parser.add_argument("--json", default=None, help="also write the curves here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragen_rllib.cli.experiments import build_config, load_experiments
    from ragen_rllib.warmup.format_warmup import model_path

    _, exp = next(iter(load_experiments(args.file).items()))
    config, _ = build_config(exp, json.loads(args.config) if args.config else {})
    path = model_path(config)  # the warmed model, built once and cached
    tokenizer = AutoTokenizer.from_pretrained(path)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    shown, prefill = first_turns(config, tokenizer, args.eval_states, 3_000_000)
    train, _ = first_turns(config, tokenizer, args.steps * args.batch, 4_000_000)
    print(f"model {path}; {len(shown)} first turns measured, think {args.think!r}")
    curves = {}
    for lr in args.lr:
        torch.manual_seed(0)
        model = copy.deepcopy(base)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        curve = [{"step": 0, **evaluate(model.eval(), tokenizer, shown, args.think, prefill, pad)}]
        print(f"lr {lr:g} step 0: {curve[-1]}", flush=True)
        start = time.perf_counter()
        for step in range(1, args.steps + 1):
            model.train()
            rows = train[(step - 1) * args.batch : step * args.batch]
            pairs = [
                (p, answer_ids(tokenizer, rule, args.think, prefill)) for p, _, _, rule in rows
            ]
            loss = -batch_logprob(model, pairs, pad).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step % args.eval_every == 0 or step == args.steps:
                figures = evaluate(model.eval(), tokenizer, shown, args.think, prefill, pad)
                curve.append({"step": step, "loss": round(loss.item(), 3), **figures})
                print(
                    f"lr {lr:g} step {step}: {curve[-1]} ({time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
        curves[f"{lr:g}"] = curve
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": path, "think": args.think, "curves": curves}, f, indent=1)


if __name__ == "__main__":
    main()
