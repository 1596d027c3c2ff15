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

Pretraining (``pretrained=True``, the ``builtin`` model; ``builtin-raw`` skips
it): next-token training on transcripts of random play over every registered
env id, rendered exactly as rollouts render them (both prompt styles of
:mod:`ragen_rllib.context`, both instruction styles of the envs), with the loss
on every token: instructions, observations, rewards and answers. So the model
learns to read the states, what each action does to them and the answer
format (a few filler words, ``</think>``, ``<answer>``, one to three valid
action names joined by ``||`` (exactly one arm name, copied from the prompt,
for the bandits), ``</answer>``, then ``<|im_end|>``). It learns no policy:
the actions are drawn uniformly from the valid ones and never depend on the
state, so the pretrained model succeeds about as often as a random agent
(``bench/bench_no_policy.py`` measures it) and reinforcement learning has to
find the policy. The default build ships with the package
(:mod:`ragen_rllib.builtin_build`); :func:`format_valid_rate` measures the
share of well-formed, valid answers.
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
from ragen_envs.base import INSTRUCTION_STYLES

from .context import (
    FORMAT_HINT,
    PROMPT_STYLES,
    SYSTEM_PROMPT,
    ChatFormat,
    first_user_text,
    render_turn,
    system_prompt_for,
    with_instructions,
)

logger = logging.getLogger(__name__)

#: Bump when the build changes in a way the parameters below do not capture.
BUILD_VERSION = 4
BUILTIN_NAMES = {"builtin": True, "builtin-raw": False}  # name -> pretrained

PAD, IM_START, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
SEPARATOR = "||"
#: Words the think text of the pretraining transcripts is drawn from.
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
    pretrain_steps: int = 1000
    pretrain_batch: int = 18  # transcripts per step, the envs in turn (2 of each of the 9)
    # Single-turn snapshots per step (the envs in turn): the prompt a context window of 0
    # renders for a state reached by random play, and one answer. Short and cheap; most
    # of the practice at reading the grid happens here.
    pretrain_snapshots: int = 36
    pretrain_chunk_tokens: int = 2400  # padded tokens per forward pass (sorted by length)
    pretrain_lr: float = 3e-3
    pretrain_max_turns: int = 6  # answers per transcript at most
    compact_share: float = 0.7  # share of compact prompts, and of compact instructions
    observation_weight: float = 4.0  # loss weight of the user messages after an answer
    coordinates_share: float = 0.5  # grid envs: share of episodes with the coordinates line

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


def _random_answer(rng: np.random.Generator, env: Any, arm: str | None = None) -> str:
    """A pretraining answer after the ``<think>`` prefill: a few filler words, then
    uniformly random valid actions (one to three; one arm for the bandits, ``arm``
    when given). Nothing in it depends on the state."""
    think = " ".join(rng.choice(FILLER_WORDS, size=int(rng.integers(1, 5))))
    names = env.action_names
    if env.action_budget == 1:  # the bandits: one arm
        actions = arm if arm is not None else names[int(rng.integers(len(names)))]
    else:
        count = int(rng.integers(1, 4))
        actions = f" {SEPARATOR} ".join(names[int(i)] for i in rng.integers(len(names), size=count))
    return f" {think} </think> <answer> {actions} </answer>"


class _Corpus:
    """Transcripts of random play, rendered exactly as rollouts render them.

    Each transcript draws its prompt style (``compact`` with probability
    ``spec.compact_share``, else ``full``) and, independently, the env's
    instruction style the same way, so the model reads all four combinations.
    On the grid envs a share ``spec.coordinates_share`` of the episodes also
    shows the env's ``coordinates`` line under each grid. Every turn's answer is
    :func:`_random_answer`: its actions are uniform over the valid ones and never
    depend on the state, so the corpus holds no policy.
    """

    def __init__(self, tokenizer: Any, spec: BuiltinSpec):
        self.spec = spec
        self.tokenizer = tokenizer
        self.env_ids = sorted(ragen_envs.ENV_IDS)
        self.envs = {
            (env_id, style, coords): gym.make(
                env_id, instructions=style, coordinates=coords
            ).unwrapped
            for env_id in self.env_ids
            for style in INSTRUCTION_STYLES
            for coords in (False, True)
            if not coords or gym.make(env_id).unwrapped.landmark_symbols
        }
        self.formats = {
            style: ChatFormat(tokenizer, system_prompt=system_prompt_for(style), prefill="<think>")
            for style in PROMPT_STYLES
        }
        # Bandit arms are pulled in turn, by name, so that every name is pulled equally
        # often in every stretch of the corpus: uniform draws leave a chance excess of
        # one name in the last batches, which the model keeps as a preference.
        self._pulls = dict.fromkeys(self.env_ids, 0)

    def next_arm(self, env_id: str) -> str | None:
        """The arm the next transcript of a bandit ``env_id`` pulls (None: not a bandit)."""
        env = self.envs[(env_id, "compact", False)]
        if env.action_budget != 1:
            return None
        names = sorted(arm.name for arm in env.arms)
        self._pulls[env_id] += 1
        return names[(self._pulls[env_id] - 1) % len(names)]

    def _style(self, rng: np.random.Generator) -> str:
        return "compact" if rng.random() < self.spec.compact_share else "full"

    def _env(self, rng: np.random.Generator, env_id: str) -> tuple[Any, str]:
        """(env, prompt style): the instruction and prompt styles and the coordinates
        line drawn for one episode."""
        prompt_style, instructions = self._style(rng), self._style(rng)
        coords = rng.random() < self.spec.coordinates_share
        env = self.envs.get((env_id, instructions, coords)) or self.envs[
            (env_id, instructions, False)
        ]
        return env, prompt_style

    def transcript(
        self, rng: np.random.Generator, env_id: str, arm: str | None = None
    ) -> tuple[list[int], list[int]]:
        """(token ids, kinds): kind 0 = prompt and framing, 1 = answer, 2 = observation text.

        The episode runs until the env ends it or ``spec.pretrain_max_turns`` answers.
        ``arm``: the arm a bandit transcript pulls (default: a uniform draw).
        """
        env, prompt_style = self._env(rng, env_id)
        fmt = self.formats[prompt_style]
        obs, info = env.reset(seed=int(rng.integers(2**31)))
        ids = fmt.prompt_ids(first_user_text(env, obs, info["actions_left"], prompt_style))
        kinds = [0] * len(ids)
        for turn in range(1, self.spec.pretrain_max_turns + 1):
            answer = _random_answer(rng, env, arm)
            answer_ids = self.tokenizer.encode(answer, add_special_tokens=False)
            answer_ids.append(fmt.eos_token_id)
            ids, kinds = ids + answer_ids, kinds + [1] * len(answer_ids)
            obs, reward, terminated, truncated, info = env.step("<think>" + answer)
            if terminated or truncated or turn == self.spec.pretrain_max_turns:
                closing = fmt.closing_ids(ended_with_eos=True)
                return ids + closing, kinds + [0] * len(closing)
            user = render_turn(turn + 1, obs, info["actions_left"], reward, prompt_style)
            more = fmt.continuation_ids(user, ended_with_eos=True)
            ids, kinds = ids + more, kinds + [2] * len(more)
        raise AssertionError("unreachable")

    def snapshot(
        self, rng: np.random.Generator, env_id: str, arm: str | None = None
    ) -> tuple[list[int], list[int]]:
        """(token ids, kinds) of one turn as a context window of 0 renders it: random play
        for 0 to ``spec.pretrain_max_turns - 1`` turns (while the episode lasts), then the
        instructions with that turn's observation, and one answer."""
        env, prompt_style = self._env(rng, env_id)
        fmt = self.formats[prompt_style]
        obs, info = env.reset(seed=int(rng.integers(2**31)))
        turn, reward = 1, None
        for _ in range(int(rng.integers(self.spec.pretrain_max_turns))):
            answer = _random_answer(rng, env)
            nxt, nxt_reward, terminated, truncated, nxt_info = env.step("<think>" + answer)
            if terminated or truncated:
                break
            obs, reward, info, turn = nxt, nxt_reward, nxt_info, turn + 1
        text = render_turn(turn, obs, info["actions_left"], reward, prompt_style)
        ids = fmt.prompt_ids(with_instructions(env, text, prompt_style))
        answer_ids = self.tokenizer.encode(
            _random_answer(rng, env, arm), add_special_tokens=False
        ) + [fmt.eos_token_id]
        closing = fmt.closing_ids(ended_with_eos=True)
        kinds = [0] * len(ids) + [1] * len(answer_ids) + [0] * len(closing)
        return ids + answer_ids + closing, kinds


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


def _env_schedule(rng: np.random.Generator, num_envs: int) -> Iterator[int]:
    """Env indices round robin, in a fresh random order every round."""
    while True:
        yield from (int(i) for i in rng.permutation(num_envs))


def pretrain(
    model: Any, tokenizer: Any, spec: BuiltinSpec, seed: int, *, steps: int | None = None
) -> list[float]:
    """Next-token pretraining on random-play transcripts (see :class:`_Corpus`).

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
    corpus = _Corpus(tokenizer, spec)
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
    schedule = _env_schedule(rng, len(corpus.env_ids))
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
                step, steps, loss, time.perf_counter() - start,
            )
    model.eval()
    return losses


# ----- evaluation -----------------------------------------------------------------
@torch.no_grad()
def format_valid_rate(
    path: str,
    n: int = 64,
    temperature: float = 1.0,
    *,
    seed: int = 0,
    max_new_tokens: int = 48,
    prompt_style: str = "full",
) -> float:
    """Share of ``n`` sampled first-turn answers that parse as valid (format and actions).

    Prompts cycle over every registered env id (reset seeds 100000+i), rendered
    in ``prompt_style`` with the env's instructions in the same style; each
    answer is ``"<think>"`` plus the generated text up to ``<|im_end|>``, which
    must have been generated within ``max_new_tokens``.
    """
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    fmt = ChatFormat(tokenizer, system_prompt=system_prompt_for(prompt_style), prefill="<think>")
    envs = {
        env_id: gym.make(env_id, instructions=prompt_style).unwrapped
        for env_id in ragen_envs.ENV_IDS
    }
    env_ids = [list(envs)[i % len(envs)] for i in range(n)]
    prompts = []
    for i, env_id in enumerate(env_ids):
        env = envs[env_id]
        obs, info = env.reset(seed=100_000 + i)
        text = first_user_text(env, obs, info["actions_left"], prompt_style)
        prompts.append(fmt.prompt_ids(text))
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
    pretrained: bool = True,
    seed: int = 0,
    cache_dir: str | None = None,
    spec: BuiltinSpec | None = None,
) -> str:
    """Where :func:`get_builtin_model` keeps this build (it may not exist yet)."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"builtin model name must match {_NAME_RE.pattern}, got {name!r}")
    digest = build_key(pretrained, seed, spec or BuiltinSpec())
    return os.path.join(cache_dir or default_cache_dir(), f"{name}-{digest}")


def build_key(pretrained: bool, seed: int, spec: BuiltinSpec) -> str:
    """Digest of every build parameter, the vocabulary and :data:`BUILD_VERSION`."""
    key = {
        "build_version": BUILD_VERSION,
        "pretrained": bool(pretrained),
        "seed": int(seed),
        "spec": asdict(spec),
        "vocab": build_vocab(spec.corpus_seeds),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def get_builtin_model(
    name: str = "builtin",
    *,
    pretrained: bool = True,
    seed: int = 0,
    cache_dir: str | None = None,
    spec: BuiltinSpec | None = None,
) -> str:
    """Path of the built-in model's Hugging Face directory, building it on first use.

    The default pretrained build (``builtin``, seed 0, default spec) ships with
    the package (``ragen_rllib/builtin/``, see :mod:`ragen_rllib.builtin_build`)
    and is returned as it is when its recorded key matches this code. Any other
    build goes to the cache; its folder name hashes every build parameter, the
    vocabulary and :data:`BUILD_VERSION`. A build happens in a temporary folder that is then
    renamed into place, so concurrent builders never see half a model.
    """
    spec = spec or BuiltinSpec()
    if name == "builtin" and pretrained:
        from .builtin_build import packaged_model

        shipped = packaged_model(build_key(True, seed, spec))
        if shipped is not None:
            return shipped
    final = builtin_model_dir(
        name, pretrained=pretrained, seed=seed, cache_dir=cache_dir, spec=spec
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
            f"{spec.pretrain_steps} pretraining steps, minutes on a CPU"
            if pretrained
            else "seconds",
        )
        tokenizer = build_tokenizer(*build_vocab(spec.corpus_seeds))
        model = build_model(tokenizer, spec, seed)
        if pretrained:
            pretrain(model, tokenizer, spec, seed)
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
    without pretraining; an existing local directory is returned (``~``
    expanded); anything that looks like a local path but does not exist raises
    FileNotFoundError; anything else is taken for a hub id and returned unchanged.
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ValueError(
            f"model must be 'builtin', 'builtin-raw', a path or a hub id, got {name_or_path!r}"
        )
    if name_or_path in BUILTIN_NAMES:
        return get_builtin_model(
            name_or_path, pretrained=BUILTIN_NAMES[name_or_path], cache_dir=cache_dir
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
