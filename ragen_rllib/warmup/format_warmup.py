"""A format warm-up: a few supervised steps that teach a model the answer format, not a policy.

A small real model (SmolLM2-135M-Instruct, say) rarely writes
``<think> ... </think> <answer> ... </answer>`` when sampled: every answer of a
group then takes the format penalty, the group's rewards are equal and
group-relative estimators see no signal. ``format_warmup_steps: n`` trains the
model first, for ``n`` steps of ``format_warmup_batch`` examples, on the run's
own first prompts (each env of the mixture, its env_config and its prompt
wording, on seeds that neither training nor evaluation draws) followed by a
well-formed answer with uniformly random valid actions
(:func:`~ragen_rllib.builtin.transcripts.random_answer`, the built-in model's
pretraining answers). Its think text is a few filler words, or with
``format_warmup_think: state`` the env's true sentences about the state
(``state_notes()``: where the goal lies, what is next to the player), so that the
model learns to read the state in its reasoning. The loss covers the answer's
tokens only. The actions never depend on the state, so the warm-up shows the
format (and how to read the state) and holds no policy; it still changes the
task (the model starts from other weights), and results name it.

The warmed model is saved once into the model cache, in a folder whose name
digests everything the warm-up read (the base model's files, the envs and their
options, the prompt wording, the steps, batch, learning rate and seed), and is
then what the learner and every rollout actor load, as they would the base
model. :func:`model_path` is the one place that says which folder a run trains.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict
from typing import Any

import numpy as np

from ragen_rllib.builtin.transcripts import random_answer
from ragen_rllib.chat.prompts import ChatFormat, render_turn, with_instructions
from ragen_rllib.console import no_progress_bars
from ragen_rllib.env_choice.env_loading import make_eval_env
from ragen_rllib.env_choice.env_mix import format_of, mix_entries
from ragen_rllib.models.cache_folder import default_cache_dir, publish_folder
from ragen_rllib.models.resolve import resolve_model
from ragen_rllib.models.runtime import keep_freed_memory

logger = logging.getLogger(__name__)

#: Bump when the warm-up trains differently for the same settings (2: an answer names
#: at most max_actions_per_turn actions).
WARMUP_VERSION = 2
#: Warm-up states come from seeds at and above this one: training draws its seeds
#: from 2**20 on (maths.seeding) below this, evaluation from eval_seed (0) on.
WARMUP_SEED_BASE = 2**40
RECORD_FILE = "format_warmup.json"


def model_path(config: Any) -> str:
    """The model folder (or hub id) the run trains: ``llm`` resolved, then warmed up when
    ``format_warmup_steps`` > 0 (built on first use, cached)."""
    base = resolve_model(config.llm)
    if not config.format_warmup_steps:
        return base
    return warmed_model(base, config)


def _answer_after_prefill(answer: str, prefill: str) -> str:
    """A :func:`random_answer` (the text after a ``<think>`` prefill) as the text after
    the run's own ``prefill``."""
    full = "<think>" + answer
    if not full.startswith(prefill):
        raise ValueError(
            f"config format_warmup_steps needs a prefill that starts the answer format "
            f"('<think>' or ''), got prefill={prefill!r}"
        )
    return full[len(prefill) :]


def warmup_examples(config: Any, tokenizer: Any, count: int, seed: int):
    """``count`` (prompt ids, answer ids) pairs: first prompts of the run's envs (in
    turn over the mixture's entries) with a random well-formed answer ending in EOS."""
    rng = np.random.default_rng(seed)
    entries = mix_entries(config)
    envs = [make_eval_env(entry) for entry in entries]
    chats = {}
    examples = []
    for i in range(count):
        k = i % len(entries)
        env, fmt = envs[k].unwrapped, format_of(entries[k], config)
        if fmt not in chats:
            chats[fmt] = ChatFormat(tokenizer, fmt.system, fmt.prefill)
        obs, info = envs[k].reset(seed=WARMUP_SEED_BASE + seed * 1_000_003 + i)
        actions_left = info.get("actions_left")
        first = with_instructions(env, render_turn(1, obs, actions_left, None, fmt), fmt)
        think = env.state_notes() if config.format_warmup_think == "state" else None
        answer = _answer_after_prefill(random_answer(rng, env, think=think), fmt.prefill)
        answer_ids = list(tokenizer.encode(answer, add_special_tokens=False))
        examples.append((chats[fmt].prompt_ids(first), answer_ids + [tokenizer.eos_token_id]))
    for env in envs:
        env.close()
    return examples


def _settings(config: Any) -> dict[str, Any]:
    return {
        "version": WARMUP_VERSION,
        "steps": config.format_warmup_steps,
        "batch": config.format_warmup_batch,
        "lr": config.format_warmup_lr,
        "think": config.format_warmup_think,
        "seed": config.seed or 0,
        # What each env's examples are made of (not its share of the groups).
        "entries": [
            {"env": e.env, "env_config": e.env_config, "format": asdict(format_of(e, config))}
            for e in mix_entries(config)
        ],
    }


def _base_digest(base: str) -> str:
    """Digest of a model folder's files (names, sizes and the config's and tokenizer's
    bytes: the weights' size and mtime stand for their bytes), or of a hub id."""
    if not os.path.isdir(base):
        return hashlib.sha256(base.encode()).hexdigest()
    digest = hashlib.sha256()
    for name in sorted(os.listdir(base)):
        path = os.path.join(base, name)
        if not os.path.isfile(path):
            continue
        stat = os.stat(path)
        digest.update(f"{name}:{stat.st_size}:{int(stat.st_mtime)}".encode())
        if name.endswith((".json", ".jinja")):
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def warmed_path(config: Any, base: str | None = None) -> str:
    """Where the run's warmed model is (or will be) cached: a folder named by a digest
    of the base model's files and the warm-up's settings."""
    base = resolve_model(config.llm) if base is None else base
    settings = _settings(config)
    key = json.dumps({"base": _base_digest(base), **settings}, sort_keys=True, default=str)
    name = f"warmup-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    return os.path.join(default_cache_dir(), "warmup", name)


def warmed_model(base: str, config: Any) -> str:
    """The folder of ``base`` after the run's format warm-up, trained on first use
    (in a temporary folder renamed into place)."""
    settings = _settings(config)
    final = warmed_path(config, base)
    if os.path.isfile(os.path.join(final, RECORD_FILE)):
        return final
    _show_progress()

    def fill(tmp: str) -> dict[str, Any]:
        with no_progress_bars():
            record = train_format_warmup(base, config, tmp)
        return {**record, "settings": settings, "base": base}

    return publish_folder(final, RECORD_FILE, fill)


def _show_progress() -> None:
    """The warm-up takes minutes, usually in a Tune trial's process, where no handler
    prints the project's INFO messages (the ``rllib`` command sets one up in its own
    process only): give this module's logger one, so the console says what runs."""
    if logger.hasHandlers() and logger.getEffectiveLevel() <= logging.INFO:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("ragen_rllib: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def warmup_device(config: Any) -> str:
    """Where the warm-up trains: the GPU when the learner runs in this process on one
    (``num_learners: 0`` with ``num_gpus_per_learner`` set, as on a single-GPU
    machine) and this process sees it; else the CPU. A driver that only starts
    remote learners keeps off their GPUs."""
    import torch

    local_gpu_learner = not config.num_learners and config.num_gpus_per_learner
    return "cuda" if local_gpu_learner and torch.cuda.is_available() else "cpu"


def train_format_warmup(base: str, config: Any, out: str) -> dict[str, Any]:
    """Train ``base`` for the run's warm-up steps and save it (with its tokenizer) to
    ``out``; returns the loss curve and timings."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    keep_freed_memory()  # its large tensors are reused, not page-faulted anew
    device = warmup_device(config)
    tokenizer = AutoTokenizer.from_pretrained(base)
    with no_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(device)
    model.train()
    torch.manual_seed(config.seed or 0)
    steps, batch = config.format_warmup_steps, config.format_warmup_batch
    examples = warmup_examples(config, tokenizer, steps * batch, config.seed or 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.format_warmup_lr)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    losses = []
    start = time.perf_counter()
    logger.info(
        "format warm-up of %s: %d steps of %d examples on the %s, once (minutes on a CPU; "
        "then cached)",
        base,
        steps,
        batch,
        "GPU" if device == "cuda" else "CPU",
    )
    for step in range(steps):
        rows = examples[step * batch : (step + 1) * batch]
        width = max(len(p) + len(a) for p, a in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (prompt, answer) in enumerate(rows):
            seq = prompt + answer
            ids[r, : len(seq)] = torch.tensor(seq)
            labels[r, len(prompt) : len(seq)] = torch.tensor(answer)
            mask[r, : len(seq)] = 1
        ids, labels, mask = ids.to(device), labels.to(device), mask.to(device)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (step + 1) % 5 == 0 or step + 1 == steps:
            logger.info("format warm-up step %d/%d: loss %.3f", step + 1, steps, losses[-1])
    logger.info("format warm-up done in %.0f s", time.perf_counter() - start)
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if device == "cuda":  # the learner's GPU gets the memory back
        del model, optimizer
        loss = ids = labels = mask = None  # the last step's graph holds the weights too
        torch.cuda.empty_cache()
    return {
        "loss": [round(x, 4) for x in losses],
        "seconds": round(time.perf_counter() - start, 1),
        "device": device,  # where it trained (not part of the cache's key)
    }
