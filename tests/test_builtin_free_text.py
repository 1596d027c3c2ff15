"""The built-in model's pretraining material for the free-text envs.

Countdown, Sudoku, the word problems and the search env answer with free text;
their random answers (``env.random_actions``) must be answers the env accepts,
their transcripts must stay short enough to pretrain on, and the vocabulary
must take their fixed wording but not the open-ended text of their data.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import walk_with

import ragen_envs
from ragen_rllib.builtin.spec import BuiltinSpec
from ragen_rllib.builtin.tokenizer import build_tokenizer, build_vocab
from ragen_rllib.builtin.transcripts import FILLER_WORDS, TranscriptCorpus, random_answer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(*build_vocab())


def test_every_env_is_in_the_pretraining_set():
    """Every env but the two-player games (not in the shipped model yet)."""
    assert set(ragen_envs.ENV_IDS) - set(ragen_envs.GAME_ENV_IDS) == set(
        ragen_envs.BUILTIN_MODEL_ENV_IDS
    )


@pytest.mark.parametrize("env_id", ragen_envs.ENV_IDS)
def test_pretraining_answers_are_accepted_on_every_turn(env_id):
    """The transcripts' answers (:func:`random_answer`: filler think words, then the
    random agent's actions, tested on their own in test_random_agents.py) are well
    formed and valid in every state a random walk meets."""
    env = gym.make(env_id).unwrapped
    rng = np.random.default_rng(1)
    assert walk_with(env, lambda e: "<think>" + random_answer(rng, e)) >= 8
    if not env.action_names:
        rng_a, rng_b = np.random.default_rng(6), np.random.default_rng(6)
        think = rng_b.choice(FILLER_WORDS, size=int(rng_b.integers(1, 5)))
        body = f" {env.parser.separator} ".join(env.random_actions(rng_b))
        assert random_answer(rng_a, env) == f" {' '.join(think)} </think> <answer> {body} </answer>"


def test_long_transcripts_stop_after_the_answer_past_the_token_cap(tokenizer):
    spec = BuiltinSpec(pretrain_max_tokens=900)
    corpus = TranscriptCorpus(tokenizer, spec)
    rng = np.random.default_rng(0)
    for _ in range(5):
        ids, kinds = corpus.transcript(rng, "ragen/Sudoku9x9-v0")
        answers = sum(1 for a, b in zip(kinds, kinds[1:], strict=False) if a != 1 and b == 1)
        assert 1 <= answers < spec.pretrain_max_turns
        # Every answer but the last started below the cap; the closing follows the last.
        last_answer_start = max(i for i in range(1, len(kinds)) if kinds[i] == 1 != kinds[i - 1])
        assert last_answer_start < spec.pretrain_max_tokens + 600
        assert tokenizer.decode(ids).rstrip().endswith("<|im_end|>")
    short, _ = corpus.transcript(rng, "ragen/Bandit-v0", arm=corpus.next_arm("ragen/Bandit-v0"))
    assert len(short) < spec.pretrain_max_tokens


def test_vocabulary_takes_fixed_wording_not_the_data(tokenizer):
    search = gym.make("ragen/SearchQA-v0").unwrapped
    words = {w for p in search.corpus.passages for w in p.title.split()}
    long_names = [w for w in words if len(w) >= 10 and w.isalpha()]
    assert long_names
    # Entity names (open-ended data) are spelt in pieces ...
    assert all(len(tokenizer.encode(" " + n, add_special_tokens=False)) > 1 for n in long_names)
    # ... while every word of the env's own instructions is one token.
    for style in ("full", "compact"):
        env = gym.make("ragen/SearchQA-v0", instructions=style).unwrapped
        env.reset(seed=0)
        for word in env.instructions().replace("\n", " ").split():
            word = word.strip(".,:()'")
            if word.isalpha():
                assert len(tokenizer.encode(" " + word, add_special_tokens=False)) == 1, word
    assert len(tokenizer) < 2500
