"""Pretraining the built-in model: next-token training on random-play transcripts.

The loss covers every token (instructions, observations, rewards, answers), so
the model learns to read the states, what each action does to them and the
answer format, but no policy (:mod:`ragen_rllib.builtin.transcripts`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ragen_rllib.builtin.spec import BuiltinSpec
from ragen_rllib.builtin.transcripts import TranscriptCorpus

logger = logging.getLogger(__name__)


def _chunks(
    examples: list[tuple[list[int], list[float]]], max_tokens: int
) -> Iterator[list[tuple[list[int], list[float]]]]:
    """Length-sorted ``examples`` cut into runs of at most ``max_tokens`` padded tokens
    (at least one example each)."""
    chunk: list[tuple[list[int], list[float]]] = []
    for example in examples:
        if chunk and (len(chunk) + 1) * len(example[0]) > max_tokens:
            yield chunk
            chunk = []
        chunk.append(example)
    if chunk:
        yield chunk


def _batch(examples: list[tuple[list[int], list[float]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id)  # [B, T]
    weights = torch.zeros((len(examples), width))  # [B, T]: loss weight of predicting token t
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)  # [B, T]
    for row, (ids, wts) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        weights[row, : len(ids)] = torch.tensor(wts)
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "weights": weights, "attention_mask": attention_mask}


def _lm_loss_sum(
    model: Any, input_ids: torch.Tensor, weights: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Weighted SUM of the next-token cross-entropies over every non-padding position."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # [B, T-1, V]
    keep = attention_mask[:, 1:].bool()  # [B, T-1]: position t predicts token t+1
    losses = torch.nn.functional.cross_entropy(
        logits[keep], input_ids[:, 1:][keep], reduction="none"
    )
    return (losses * weights[:, 1:][keep]).sum()


def _env_schedule(rng: np.random.Generator, repeats: list[int]) -> Iterator[int]:
    """Env indices round robin, env i ``repeats[i]`` times a round, in a fresh random
    order every round."""
    slots = np.repeat(np.arange(len(repeats)), repeats)
    while True:
        yield from (int(i) for i in rng.permutation(slots))


def pretrain(
    model: Any, tokenizer: Any, spec: BuiltinSpec, seed: int, *, steps: int | None = None
) -> list[float]:
    """Next-token pretraining on random-play transcripts (see :class:`TranscriptCorpus`).

    The loss covers every token (instructions, observations, rewards, answers),
    so the model learns to read the states, what each action does to them and
    the answer format, but no policy. The observations after an answer (what
    the actions did) weigh ``spec.observation_weight``: they are the few hard
    tokens among many easy ones. Every batch mixes the envs evenly (round
    robin): with one env per batch, the bandits' arm names took turns in the
    output bias and the model never learnt to read them from the prompt. A
    batch runs in chunks of similar length (little padding); the loss is the
    token mean over the whole batch. AdamW with linear warm-up and cosine decay
    to 10%. Returns the loss of every step.
    """
    steps = spec.pretrain_steps if steps is None else steps
    rng = np.random.default_rng(seed)
    corpus = TranscriptCorpus(tokenizer, spec)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.pretrain_lr, weight_decay=0.01)
    warmup = max(1, steps // 20)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    repeats = [
        spec.action_env_repeats if corpus.envs[(env_id, "compact", False)].action_names
        else spec.free_text_env_repeats
        for env_id in corpus.env_ids
    ]  # fmt: skip
    schedule = _env_schedule(rng, repeats)
    losses: list[float] = []
    start = time.perf_counter()
    for step in range(steps):
        examples = []
        makers = [corpus.transcript] * spec.pretrain_batch
        makers += [corpus.snapshot] * spec.pretrain_snapshots
        for make in makers:
            env_id = corpus.env_ids[next(schedule)]
            ids, kinds = make(rng, env_id, arm=corpus.next_arm(env_id))
            weights = [spec.observation_weight if kind == 2 else 1.0 for kind in kinds]
            examples.append((ids, weights))
        examples.sort(key=lambda example: len(example[0]))  # stable: deterministic
        total = sum(sum(weights[1:]) for _, weights in examples)
        optimizer.zero_grad(set_to_none=True)
        loss = 0.0
        for examples_chunk in _chunks(examples, spec.pretrain_chunk_tokens):
            chunk = _batch(examples_chunk, tokenizer.pad_token_id)
            chunk_loss = _lm_loss_sum(model, **chunk) / total
            chunk_loss.backward()
            loss += chunk_loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss)
        if step % 100 == 0 or step == steps - 1:
            logger.info(
                "builtin model pretraining: step %d/%d loss %.4f (%.0f s)",
                step,
                steps,
                loss,
                time.perf_counter() - start,
            )
    model.eval()
    return losses
