"""How well the built-in model knows its environments, before any reinforcement learning.

:func:`format_valid_rate` is the warm-start gate (the share of sampled first
answers written in the env's answer language); :func:`next_observation_accuracy`
measures how often it predicts what an action does to the grid. The shipped
build records both (:mod:`ragen_rllib.builtin.build`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import ragen_envs
from ragen_rllib.builtin.spec import BuiltinSpec
from ragen_rllib.builtin.transcripts import TranscriptCorpus
from ragen_rllib.chat.prompts import (
    ChatFormat,
    render_turn,
    system_prompt_for,
    with_instructions,
)


@torch.no_grad()
def format_valid_by_env(
    path: str,
    n: int = 64,
    temperature: float = 1.0,
    *,
    seed: int = 0,
    max_new_tokens: int = 96,
    prompt_style: str = "full",
) -> dict[str, tuple[int, int, int]]:
    """{env id: (well-formed answers, accepted answers, answers)} over ``n`` sampled
    first-turn answers.

    Prompts cycle over the env ids the model was pretrained on, each from its
    own state (reset seed ``100000 + seed * n + i``, so every sampling seed
    draws new states as well as new answers), rendered in ``prompt_style`` with
    the env's instructions in the same style; each answer is ``"<think>"`` plus
    the generated text up to ``<|im_end|>``, which must have been generated
    within ``max_new_tokens``.
    An answer is well formed when it is written in the env's answer language
    (``env.well_formed``: the tags, and known action names on the grids and
    bandits, an expression, placements or a command on the free-text envs) and
    accepted when the env, stepped with it, also finds it valid in the state
    (``format_ok`` and ``action_is_valid``). The two differ only on the free-text
    envs, where acceptance needs the state read (the given numbers, the free and
    legal cells).
    """
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    fmt = ChatFormat(tokenizer, system_prompt=system_prompt_for(prompt_style), prefill="<think>")
    envs = {
        env_id: gym.make(env_id, instructions=prompt_style).unwrapped
        for env_id in ragen_envs.BUILTIN_MODEL_ENV_IDS
    }
    env_ids = [list(envs)[i % len(envs)] for i in range(n)]
    prompts = []
    for i, env_id in enumerate(env_ids):
        env = envs[env_id]
        obs, info = env.reset(seed=100_000 + seed * n + i)
        first = render_turn(1, obs, info["actions_left"], None, prompt_style)
        prompts.append(fmt.prompt_ids(with_instructions(env, first, prompt_style)))
    width = max(map(len, prompts))  # left padding, so every answer starts at column `width`
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        do_sample=True,
        temperature=temperature,
        top_p=1.0,
        top_k=0,
        max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    counts = {env_id: [0, 0, 0] for env_id in envs}
    for row, env_id in enumerate(env_ids):
        counts[env_id][2] += 1
        answer = out[row, width:].tolist()
        if tokenizer.eos_token_id not in answer:
            continue  # never stopped
        answer = answer[: answer.index(tokenizer.eos_token_id)]
        env = envs[env_id]
        env.reset(seed=100_000 + seed * n + row)
        text = "<think>" + tokenizer.decode(answer, skip_special_tokens=False)
        counts[env_id][0] += env.well_formed(text)
        info = env.step(text)[4]
        counts[env_id][1] += bool(info["format_ok"] and info["action_is_valid"])
    return {env_id: (w, a, total) for env_id, (w, a, total) in counts.items() if total}


#: The warm-start gate's draws: this many first-turn prompts (12 per env) under each
#: sampling seed, and the seeds of each prompt style. Every seed draws its own states
#: and answers, so each env gets 120 independent answers: with 6 states per env and
#: the same seeds in both styles (the first version 5 records), the two styles gave
#: nearly the same answers, and 60 answers counted for about 30.
GATE_PROMPTS = 192
GATE_SEEDS = {"compact": range(0, 5), "full": range(5, 10)}


def gate_draws(path: str) -> dict[str, list[dict[str, tuple[int, int, int]]]]:
    """{prompt style: [:func:`format_valid_by_env` of each of its GATE_SEEDS]} at
    temperature 1.0 over GATE_PROMPTS prompts: what the build record's checks and
    the tests of the shipped model count."""
    return {
        style: [
            format_valid_by_env(path, n=GATE_PROMPTS, temperature=1.0, seed=s, prompt_style=style)
            for s in seeds
        ]
        for style, seeds in GATE_SEEDS.items()
    }


def format_valid_rate(path: str, n: int = 64, temperature: float = 1.0, **kwargs: Any) -> float:
    """Share of ``n`` sampled first-turn answers that are well formed (the warm-start
    gate; :func:`format_valid_by_env` summed over the envs, same keyword arguments)."""
    counts = format_valid_by_env(path, n, temperature, **kwargs).values()
    return sum(well_formed for well_formed, _, _ in counts) / n


@torch.no_grad()
def next_observation_accuracy(model: Any, tokenizer: Any, n: int = 90, seed: int = 12345) -> float:
    """Share of later-turn observations predicted exactly, token by token (teacher forcing).

    Transcripts of random play from every env (compact prompts, the envs in
    turn, seeds the pretraining draws with negligible chance); an observation
    counts when the argmax at every one of its tokens is the true next token.
    """
    corpus = TranscriptCorpus(tokenizer, BuiltinSpec(compact_share=1.0))
    rng = np.random.default_rng(seed)
    hits = total = 0
    for i in range(n):
        ids, kinds = corpus.transcript(rng, corpus.env_ids[i % len(corpus.env_ids)])
        pred = model(input_ids=torch.tensor([ids])).logits[0, :-1].argmax(-1).tolist()
        # Runs of kind 2 (a user message after an answer); the grid is its bulk.
        run: list[int] = []
        for pos in range(1, len(ids) + 1):
            if pos < len(ids) and kinds[pos] == 2:
                run.append(pos)
            elif run:
                hits += all(pred[p - 1] == ids[p] for p in run)
                total += 1
                run = []
    return hits / max(1, total)
