"""The project's built-in small model: a word-level tokenizer and a tiny Qwen2 causal LM.

No model hub is reachable here, so the default ``model: builtin`` is built on
the spot and cached as a standard Hugging Face directory (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json with a ChatML chat
template, generation_config.json) that ``AutoTokenizer`` /
``AutoModelForCausalLM.from_pretrained`` (and vLLM) load like any checkpoint.
The learner, the env runners and the rollout engines only ever see that path
(:func:`resolve_model`).

Tokenizer: one token per word (run of letters/digits), per non-alphanumeric
character (grid symbols, punctuation), per newline, plus ``||`` and the four
tags ``<think> </think> <answer> </answer>``; other whitespace is dropped and
decoding joins tokens with single spaces, which the answer parser tolerates.
The vocabulary comes from the environments' own texts (instructions and
observations of every registered id over many seeds), the prompt framing of
:mod:`ragen_rllib.context`, and the numbers that rendered rewards and budgets
use, so rendered prompts contain no ``<unk>``.

Warm start (``warm_start=True``, the ``builtin`` model; ``builtin-raw`` skips
it): a few hundred AdamW steps of supervised training on prompts rendered
exactly as the rollout renders them (first turns, and later turns after a
first answer, across all registered envs), with loss only on the answers
(the tokens inside ``<answer>...</answer>`` weighted up). Every batch holds
the same number of sequences of every env, so each step asks for the arm
names of all four bandits at once and the model learns to read them from the
prompt (with one env per batch it only learnt how often each name occurs).
What it learns is the answer FORMAT: a few filler words, ``</think>``,
``<answer>``, one to three valid action names of that env (exactly one arm
name, copied from the prompt, for the bandits) joined by ``||``,
``</answer>``, then stopping with ``<|im_end|>``. What it does not learn is
which action is good: the target actions are drawn uniformly at random and
never depend on the state, so the warm-started policy succeeds about as often
as a random agent and reinforcement learning has to find the policy.
:func:`format_valid_rate` measures the share of well-formed, valid answers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import string
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

import ragen_envs

from .context import FORMAT_HINT, SYSTEM_PROMPT, ChatFormat, first_user_text, render_turn

logger = logging.getLogger(__name__)

#: Bump when the build changes in a way the parameters below do not capture.
BUILD_VERSION = 2
BUILTIN_NAMES = {"builtin": True, "builtin-raw": False}  # name -> warm start

PAD, IM_START, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
SEPARATOR = "||"
#: Words the warm start's think text is drawn from.
FILLER_WORDS = ("let", "me", "think", "I", "will", "go", "try", "this", "move", "next", "then")
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
_ROLES = ("system", "user", "assistant")
_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")


@dataclass(frozen=True)
class BuiltinSpec:
    """Every build parameter besides the seed; all of them go into the cache key."""

    hidden_size: int = 128
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32  # vLLM's CPU attention rejects 16
    intermediate_size: int = 384
    max_position_embeddings: int = 4096
    corpus_seeds: int = 50  # env seeds whose texts make up the vocabulary
    warm_start_steps: int = 400  # 240 fails to learn the arm names; 300 has a small margin
    warm_start_batch: int = 18  # sequences per step, the envs in turn (2 of each of the 9)
    warm_start_chunk: int = 6  # sequences per forward pass, sorted by length
    warm_start_lr: float = 3e-3
    warm_start_max_turns: int = 3  # answers per training sequence at most
    warm_start_multi_turn: float = 0.25  # share of training sequences with more than one answer
    warm_start_action_weight: float = 3.0  # loss weight of the tokens inside <answer>...</answer>

    def __post_init__(self) -> None:
        if self.head_dim < 32:
            raise ValueError(f"head_dim must be >= 32 (vLLM CPU attention), got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )


# ----- tokenizer ------------------------------------------------------------------
def _set_qwen2_pipeline(backend: Tokenizer) -> None:
    """Qwen2's normaliser, pre-tokeniser and decoder: the ones ``AutoTokenizer`` rebuilds."""
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()


_PIPELINE = Tokenizer(models.BPE())
_set_qwen2_pipeline(_PIPELINE)


def _pieces(text: str) -> list[str]:
    """``text`` cut into pre-tokens, in byte-level spelling (" Up" -> "ĠUp")."""
    normalized = _PIPELINE.normalizer.normalize_str(text)
    return [piece for piece, _ in _PIPELINE.pre_tokenizer.pre_tokenize_str(normalized)]


def _make_envs() -> dict[str, Any]:
    return {env_id: gym.make(env_id).unwrapped for env_id in ragen_envs.ENV_IDS}


def _corpus(num_seeds: int) -> tuple[list[str], set[str]]:
    """(texts whose words become tokens, the characters that grid rows are drawn with)."""
    texts = [SYSTEM_PROMPT, FORMAT_HINT, *_ROLES, *FILLER_WORDS, SEPARATOR]
    symbols: set[str] = set()
    observations: list[str] = []  # lines with a space are text, the others grid rows
    rng = np.random.default_rng(0)
    for env in _make_envs().values():
        symbols.update(env.obs_charset)
        for seed in range(num_seeds):
            obs, info = env.reset(seed=seed)
            texts += [env.instructions(), render_turn(1, "", info["actions_left"], None)]
            texts += env.action_names
            observations.append(obs)
            for turn in range(2, 5):  # later states show other symbols
                answer = _random_answer(rng, env)
                obs, reward, terminated, truncated, info = env.step("<think>" + answer)
                texts.append(render_turn(turn, "", info["actions_left"], reward))
                observations.append(obs)
                if terminated or truncated:
                    break
    texts += [line for obs in observations for line in obs.split("\n") if " " in line]
    symbols.update(
        c for obs in observations for line in obs.split("\n") if " " not in line for c in line
    )
    return texts, symbols - set(string.whitespace)


@lru_cache(maxsize=4)
def build_vocab(num_seeds: int = 50) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(vocabulary in id order, BPE merges) so that every word of the corpus is one token.

    Words are the pre-tokens with a letter in the environments' instructions and
    the prompt framing (with and without a leading space), plus ``||`` and every
    observation symbol. The vocabulary holds the special tokens, the 256 byte
    symbols (so any text encodes, without an unknown token) and every prefix of
    every word; the merges join any two tokens whose concatenation is in the
    vocabulary. Then byte-pair merging can always grow a word's first token, so
    each word ends as one token, while symbols that start no word (grid cells,
    digits, most punctuation) are never merged with their neighbours.
    """
    texts, symbols = _corpus(num_seeds)
    words = {SEPARATOR, "Ġ" + SEPARATOR}
    for text in texts:
        for tag in TAGS:
            text = text.replace(tag, " ")
        for piece in _pieces(text):
            bare = piece.removeprefix("Ġ")
            if bare.isalpha() and bare.isascii():  # both spellings: "Up" and " Up"
                words.update((bare, "Ġ" + bare))
            elif re.search(r"[A-Za-z]", piece):
                words.add(piece)
    words.update(p for symbol in symbols for p in _pieces(symbol))
    prefixes = {w[:i] for w in words for i in range(2, len(w) + 1)}
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = (PAD, IM_START, EOS, *TAGS, *alphabet, *sorted(prefixes, key=lambda t: (len(t), t)))
    known = set(vocab)
    merges = tuple(
        (token[:i], token[i:])
        for token in vocab[len(vocab) - len(prefixes) :]
        for i in range(1, len(token))
        if token[:i] in known and token[i:] in known
    )
    return vocab, merges


def build_tokenizer(vocab: tuple[str, ...], merges: tuple[tuple[str, str], ...]) -> Any:
    """A Qwen2-style byte-level BPE tokenizer over ``vocab`` with a ChatML chat template."""
    backend = Tokenizer(
        models.BPE(
            vocab={token: i for i, token in enumerate(vocab)},
            merges=list(merges),
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    _set_qwen2_pipeline(backend)
    backend.add_special_tokens([AddedToken(t, special=True) for t in (PAD, IM_START, EOS)])
    # Not special: the tags must survive decode(skip_special_tokens=True).
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=BuiltinSpec.max_position_embeddings,
    )


# ----- model ----------------------------------------------------------------------
def build_model(tokenizer: Any, spec: BuiltinSpec, seed: int) -> Any:
    """A freshly initialised Qwen2 causal LM (deterministic for ``seed``)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        max_window_layers=spec.num_hidden_layers,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def _random_answer(rng: np.random.Generator, env: Any) -> str:
    """Filler thoughts and uniformly random valid actions, after the ``<think>`` prefill."""
    think = " ".join(rng.choice(FILLER_WORDS, size=int(rng.integers(1, 5))))
    names = env.action_names
    count = 1 if env.action_budget == 1 else int(rng.integers(1, 4))  # bandits: one arm
    actions = f" {SEPARATOR} ".join(names[int(i)] for i in rng.integers(len(names), size=count))
    return f" {think} </think> <answer> {actions} </answer>"


def _training_sequence(
    rng: np.random.Generator, env: Any, fmt: ChatFormat, spec: BuiltinSpec
) -> tuple[list[int], list[int], list[float]]:
    """One rendered trajectory: (input ids, labels with -100 outside the answers, loss weights).

    The weight is ``spec.warm_start_action_weight`` on the answer body (the
    action names and separators between ``<answer>`` and ``</answer>``), 1 on
    the other answer tokens and 0 outside the answers.

    A share ``spec.warm_start_multi_turn`` goes on after the first answer, for
    up to ``spec.warm_start_max_turns`` answers, so later-turn contexts are seen too.
    """
    obs, info = env.reset(seed=int(rng.integers(2**31)))
    ids = fmt.prompt_ids(first_user_text(env, obs, info["actions_left"]))
    labels = [-100] * len(ids)
    weights = [0.0] * len(ids)
    tokenizer = fmt.tokenizer
    open_id, close_id = tokenizer.convert_tokens_to_ids(["<answer>", "</answer>"])
    multi = rng.random() < spec.warm_start_multi_turn
    turns = int(rng.integers(2, spec.warm_start_max_turns + 1)) if multi else 1
    for turn in range(1, turns + 1):
        answer = _random_answer(rng, env)
        answer_ids = tokenizer.encode(answer, add_special_tokens=False) + [fmt.eos_token_id]
        start, end = answer_ids.index(open_id) + 1, answer_ids.index(close_id)
        body = [1.0] * start + [spec.warm_start_action_weight] * (end - start)
        ids, labels = ids + answer_ids, labels + answer_ids
        weights += body + [1.0] * (len(answer_ids) - end)
        obs, reward, terminated, truncated, info = env.step("<think>" + answer)
        if terminated or truncated or turn == turns:
            break
        user = render_turn(turn + 1, obs, info["actions_left"], reward)
        more = fmt.continuation_ids(user, ended_with_eos=True)
        ids, labels, weights = ids + more, labels + [-100] * len(more), weights + [0.0] * len(more)
    return ids, labels, weights


def _batch(
    examples: list[tuple[list[int], list[int], list[float]]], pad_id: int
) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id)  # [B, T]
    labels = torch.full((len(examples), width), -100)  # [B, T]
    weights = torch.zeros((len(examples), width))  # [B, T]
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)  # [B, T]
    for row, (ids, labs, wts) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(labs)] = torch.tensor(labs)
        weights[row, : len(wts)] = torch.tensor(wts)
        attention_mask[row, : len(ids)] = 1
    return {
        "input_ids": input_ids,
        "labels": labels,
        "weights": weights,
        "attention_mask": attention_mask,
    }


def _answer_loss(
    model: Any,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    attention_mask: torch.Tensor,
) -> torch.Tensor:
    """Weighted SUM of the next-token cross-entropies over the answer tokens.

    The LM head runs only where a label is predicted: most positions are
    prompt, and with a vocabulary of ~1200 the head is a large part of the cost.
    """
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    targets = labels[:, 1:]  # [B, T-1]: position t predicts token t+1
    keep = targets != -100
    logits = model.lm_head(hidden[:, :-1][keep])  # [N, V]
    losses = torch.nn.functional.cross_entropy(logits, targets[keep], reduction="none")  # [N]
    return (losses * weights[:, 1:][keep]).sum()


def _env_schedule(rng: np.random.Generator, num_envs: int) -> Iterator[int]:
    """Env indices round robin, in a fresh random order every round."""
    while True:
        yield from (int(i) for i in rng.permutation(num_envs))


def train_warm_start(model: Any, tokenizer: Any, spec: BuiltinSpec, seed: int) -> None:
    """Supervised training on the answer format with random valid actions (see module doc).

    Every batch mixes the envs evenly (round robin), so each step's gradient
    covers every env: with one env per batch, the four bandits' arm names
    took turns in the output bias and the model never learnt to read the arm
    names from the prompt. A batch is run in chunks of similar length (little
    padding), and the loss is the weighted mean over the whole batch.
    """
    rng = np.random.default_rng(seed)
    envs = _make_envs()
    fmt = ChatFormat(tokenizer, prefill="<think>")
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.warm_start_lr, weight_decay=0.01)
    warmup = max(1, spec.warm_start_steps // 10)

    def lr_factor(step: int) -> float:  # linear warm-up, then cosine down to 10%
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, spec.warm_start_steps - warmup)
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    env_list = [envs[env_id] for env_id in sorted(envs)]
    schedule = _env_schedule(rng, len(env_list))
    for step in range(spec.warm_start_steps):
        examples = [
            _training_sequence(rng, env_list[next(schedule)], fmt, spec)
            for _ in range(spec.warm_start_batch)
        ]
        examples.sort(key=lambda example: len(example[0]))  # stable: deterministic
        total = sum(sum(weights) for _, _, weights in examples)
        optimizer.zero_grad(set_to_none=True)
        loss = 0.0
        for start in range(0, len(examples), spec.warm_start_chunk):
            chunk = _batch(examples[start : start + spec.warm_start_chunk], tokenizer.pad_token_id)
            chunk_loss = _answer_loss(model, **chunk) / total
            chunk_loss.backward()
            loss += chunk_loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % 50 == 0 or step == spec.warm_start_steps - 1:
            logger.info("builtin model warm start: step %d loss %.4f", step, loss)
    model.eval()


# ----- evaluation -----------------------------------------------------------------
@torch.no_grad()
def format_valid_rate(
    path: str,
    n: int = 64,
    temperature: float = 1.0,
    *,
    seed: int = 0,
    max_new_tokens: int = 48,
) -> float:
    """Share of ``n`` sampled first-turn answers that parse as valid (format and actions).

    Prompts cycle over every registered env id (reset seeds 100000+i); each
    answer is ``"<think>"`` plus the generated text up to ``<|im_end|>``, which
    must have been generated within ``max_new_tokens``.
    """
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    fmt = ChatFormat(tokenizer, prefill="<think>")
    envs = _make_envs()
    env_ids = [list(envs)[i % len(envs)] for i in range(n)]
    prompts = []
    for i, env_id in enumerate(env_ids):
        obs, info = envs[env_id].reset(seed=100_000 + i)
        prompts.append(fmt.prompt_ids(first_user_text(envs[env_id], obs, info["actions_left"])))
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
    valid = 0
    for row, env_id in enumerate(env_ids):
        answer = out[row, width:].tolist()
        if tokenizer.eos_token_id not in answer:
            continue  # never stopped
        answer = answer[: answer.index(tokenizer.eos_token_id)]
        env = envs[env_id]
        text = "<think>" + tokenizer.decode(answer, skip_special_tokens=False)
        valid += ragen_envs.parse_answer(text, env.action_names, env.parser).is_valid
    return valid / n


# ----- cache ----------------------------------------------------------------------
def default_cache_dir() -> str:
    return os.environ.get("RAGEN_RLLIB_CACHE") or os.path.expanduser("~/.cache/ragen_rllib")


def builtin_model_dir(
    name: str = "builtin",
    *,
    warm_start: bool = True,
    seed: int = 0,
    cache_dir: str | None = None,
    spec: BuiltinSpec | None = None,
) -> str:
    """Where :func:`get_builtin_model` keeps this build (it may not exist yet)."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"builtin model name must match {_NAME_RE.pattern}, got {name!r}")
    spec = spec or BuiltinSpec()
    key = {
        "build_version": BUILD_VERSION,
        "warm_start": bool(warm_start),
        "seed": int(seed),
        "spec": asdict(spec),
        "vocab": build_vocab(spec.corpus_seeds),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(cache_dir or default_cache_dir(), f"{name}-{digest}")


def get_builtin_model(
    name: str = "builtin",
    *,
    warm_start: bool = True,
    seed: int = 0,
    cache_dir: str | None = None,
    spec: BuiltinSpec | None = None,
) -> str:
    """Path of the built-in model's Hugging Face directory, building it on first use.

    The folder name hashes every build parameter, the vocabulary and
    :data:`BUILD_VERSION`. A build happens in a temporary folder that is then
    renamed into place, so concurrent builders never see half a model.
    """
    spec = spec or BuiltinSpec()
    final = builtin_model_dir(
        name, warm_start=warm_start, seed=seed, cache_dir=cache_dir, spec=spec
    )
    if os.path.isdir(final):
        return final
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(final)}-", dir=parent)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bitwise reproducible float sums
    try:
        start = time.perf_counter()
        logger.info(
            "building the built-in model %s (once; %s)",
            final,
            f"{spec.warm_start_steps} warm-start steps, a few minutes on a CPU"
            if warm_start
            else "seconds",
        )
        tokenizer = build_tokenizer(*build_vocab(spec.corpus_seeds))
        model = build_model(tokenizer, spec, seed)
        if warm_start:
            train_warm_start(model, tokenizer, spec, seed)
        model.generation_config = GenerationConfig(
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp, save_jinja_files=False)
        try:
            os.replace(tmp, final)
        except OSError:
            if not os.path.isdir(final):  # not a lost race with another builder
                raise
        logger.info("built %s in %.1f s", final, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def resolve_model(name_or_path: str, *, cache_dir: str | None = None) -> str:
    """What ``from_pretrained`` should load for a config's ``model`` value.

    ``"builtin"`` / ``"builtin-raw"`` build (or find) the built-in model with /
    without warm start; an existing local directory is returned (``~``
    expanded); anything that looks like a local path but does not exist raises
    FileNotFoundError; anything else is taken for a hub id and returned unchanged.
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ValueError(
            f"model must be 'builtin', 'builtin-raw', a path or a hub id, got {name_or_path!r}"
        )
    if name_or_path in BUILTIN_NAMES:
        return get_builtin_model(
            name_or_path, warm_start=BUILTIN_NAMES[name_or_path], cache_dir=cache_dir
        )
    path = os.path.expanduser(name_or_path)
    if os.path.isdir(path):
        return path
    parent = os.path.dirname(path)
    looks_like_path = (
        name_or_path.startswith(("/", "./", "../", "~"))
        or os.path.exists(path)
        or (parent != "" and os.path.isdir(parent))
        or name_or_path.count("/") > 1  # hub ids are "owner/name"
    )
    if looks_like_path:
        what = "is a file, not" if os.path.exists(path) else "does not exist; expected"
        raise FileNotFoundError(
            f"model path {name_or_path!r} {what} a Hugging Face model directory "
            f"(or use 'builtin', 'builtin-raw' or a hub id such as 'Qwen/Qwen2.5-0.5B-Instruct')"
        )
    return name_or_path
