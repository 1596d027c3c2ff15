"""The built-in model's tokenizer: one token per word of the environments' texts.

One token per word (run of letters/digits), per non-alphanumeric character (grid
symbols, punctuation), per newline, plus ``||`` and the four tags ``<think>
</think> <answer> </answer>``; other whitespace is dropped and decoding joins
tokens with single spaces, which the answer parser tolerates. The vocabulary
comes from the environments' own texts (instructions and observations of every
registered id over many seeds), the prompt framing of
:mod:`ragen_rllib.chat.prompts`, and the numbers that rendered rewards and
budgets use, so rendered prompts contain no unknown token. It is a Qwen2-style
byte-level BPE tokenizer with a ChatML chat template, saved in the standard
Hugging Face format.
"""

from __future__ import annotations

import re
import string
from functools import lru_cache
from typing import Any

import gymnasium as gym
import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

import ragen_envs
from ragen_rllib.builtin.spec import BuiltinSpec
from ragen_rllib.builtin.transcripts import FILLER_WORDS, SEPARATOR, random_answer
from ragen_rllib.chat.prompts import FORMAT_HINT, SYSTEM_PROMPT, render_turn

PAD, IM_START, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
_ROLES = ("system", "user", "assistant")


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
    return {env_id: gym.make(env_id).unwrapped for env_id in ragen_envs.BUILTIN_MODEL_ENV_IDS}


def _compact_instructions(env_id: str, seed: int) -> str:
    env = gym.make(env_id, instructions="compact").unwrapped
    env.reset(seed=seed)
    return env.instructions()


def _corpus(num_seeds: int) -> tuple[list[str], set[str]]:
    """(texts whose words become tokens, the characters that grid rows are drawn with)."""
    texts = [SYSTEM_PROMPT, FORMAT_HINT, *_ROLES, *FILLER_WORDS, SEPARATOR]
    symbols: set[str] = set()
    observations: list[str] = []  # lines with a space are text, the others grid rows
    rng = np.random.default_rng(0)
    for env_id, env in _make_envs().items():
        symbols.update(env.obs_charset)
        texts.append(_compact_instructions(env_id, 0))  # words some envs use only here
        for seed in range(num_seeds):
            obs, info = env.reset(seed=seed)
            texts += [env.instructions(), render_turn(1, "", info["actions_left"], None)]
            texts += env.action_names
            # Data-driven text (questions, passages) is left to the byte-level pieces.
            seen = observations if not env.open_vocabulary else []
            seen.append(obs)
            for turn in range(2, 5):  # later states show other symbols
                answer = random_answer(rng, env)
                obs, reward, terminated, truncated, info = env.step("<think>" + answer)
                texts.append(render_turn(turn, "", info["actions_left"], reward))
                texts += [] if env.open_vocabulary else [answer]
                seen.append(obs)
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
