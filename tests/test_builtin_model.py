"""The built-in model: tokenizer, chat format, cached build, resolve_model, warm start."""

from __future__ import annotations

import os

import gymnasium as gym
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import ragen_envs
from ragen_rllib.builtin_model import (
    BuiltinSpec,
    build_tokenizer,
    build_vocab,
    builtin_model_dir,
    format_valid_rate,
    get_builtin_model,
    resolve_model,
)
from ragen_rllib.context import SYSTEM_PROMPT, ChatFormat, first_user_text, render_turn

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
# A short warm start: enough to check determinism, not to learn anything.
TINY_WARM = BuiltinSpec(warm_start_steps=3, warm_start_batch=4, warm_start_chunk=2)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(*build_vocab())


@pytest.fixture(scope="module")
def raw_model(tmp_path_factory):
    return get_builtin_model(
        "builtin-raw", warm_start=False, cache_dir=str(tmp_path_factory.mktemp("cache"))
    )


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory):
    """The default build: reused from the user's cache when there, else built once here."""
    cached = builtin_model_dir("builtin")
    if os.path.isdir(cached):
        return cached
    return get_builtin_model("builtin", cache_dir=str(tmp_path_factory.mktemp("warm")))


def ids_of(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


# ----- tokenizer ------------------------------------------------------------------
def test_tags_separator_and_action_names_are_single_tokens(tokenizer):
    for text in ("<think>", "</think>", "<answer>", "</answer>", "||", " ||", "\n"):
        assert len(ids_of(tokenizer, text)) == 1, text
    for env_id in ragen_envs.ENV_IDS:
        env = gym.make(env_id).unwrapped
        env.reset(seed=0)
        for name in env.action_names:
            assert len(ids_of(tokenizer, name)) == 1, name
            assert len(ids_of(tokenizer, " " + name)) == 1, name


@pytest.mark.parametrize("env_id", ragen_envs.ENV_IDS)
def test_prompts_encode_losslessly_and_grids_cell_by_cell(tokenizer, env_id):
    env = gym.make(env_id).unwrapped
    fmt = ChatFormat(tokenizer)
    unknown = {tokenizer.unk_token_id, tokenizer.pad_token_id}
    for seed in range(5):
        obs, info = env.reset(seed=seed)
        user = first_user_text(env, obs, info["actions_left"])
        prompt = fmt.prompt_ids(user)
        rendered = fmt._render([user], generation_prompt=True) + "<think>"
        assert tokenizer.decode(prompt) == rendered
        assert not unknown & set(prompt)
        assert max(prompt) < len(tokenizer)
        # Every word of the instructions, in both styles, is one token.
        compact = gym.make(env_id, instructions="compact").unwrapped
        compact.reset(seed=seed)
        for text in (env.instructions(), compact.instructions()):
            for word in text.replace("\n", " ").split():
                word = word.strip(".,:()'")
                if word.isalpha():
                    assert len(ids_of(tokenizer, " " + word)) == 1, word
        obs, reward, *_, info = env.step("<think> x </think> <answer> Left </answer>")
        more = fmt.continuation_ids(render_turn(2, obs, info["actions_left"], reward), True)
        assert not unknown & set(more)
        assert "Reward: " in tokenizer.decode(more)
        for row in obs.split("\n"):
            if " " not in row:  # a grid row: one token per cell
                assert len(ids_of(tokenizer, row)) == len(row), row


def test_rewards_and_budgets_encode_without_unknown(tokenizer):
    for reward in (-1.5, -0.1, 0.0, 0.1, 1.0, 9.7, 10.0, 10.9, -10.0):
        text = render_turn(3, "#_P", 7, reward)
        ids = ids_of(tokenizer, text)
        assert tokenizer.decode(ids) == text
        assert tokenizer.unk_token_id not in ids


def test_decoded_answer_parses_to_its_actions(tokenizer):
    env = gym.make("ragen/FrozenLake-v0").unwrapped
    ids = ids_of(tokenizer, "<think> go </think> <answer> Up || Left </answer>")
    parsed = ragen_envs.parse_answer(tokenizer.decode(ids), env.action_names, env.parser)
    assert parsed.is_valid and parsed.actions == ("Up", "Left")
    # What the rollout sees: prefill + generated ids, eos stripped.
    ids = ids_of(tokenizer, " try </think> <answer> Down </answer>") + [tokenizer.eos_token_id]
    text = "<think>" + tokenizer.decode(ids[:-1])
    assert ragen_envs.parse_answer(text, env.action_names, env.parser).actions == ("Down",)
    bandit = gym.make("ragen/BanditHeldOut-v0").unwrapped
    bandit.reset(seed=0)
    ids = ids_of(tokenizer, "<think> me </think> <answer> Trader </answer>")
    text = tokenizer.decode(ids, skip_special_tokens=True)  # tags are not special
    assert ragen_envs.parse_answer(text, bandit.action_names, bandit.parser).actions == ("Trader",)


def test_chat_format_pieces(tokenizer):
    fmt = ChatFormat(tokenizer, prefill="<think>")
    assert fmt.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert fmt.assistant_suffix == "<|im_end|>\n" and fmt.after_eos == "\n"
    prompt = tokenizer.decode(fmt.prompt_ids("Turn 1:\nState:\n#P"))
    assert prompt == (
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
        "<|im_start|>user\nTurn 1:\nState:\n#P<|im_end|>\n<|im_start|>assistant\n<think>"
    )
    more = tokenizer.decode(fmt.continuation_ids("Reward: 1.00", ended_with_eos=True))
    assert more == "\n<|im_start|>user\nReward: 1.00<|im_end|>\n<|im_start|>assistant\n<think>"
    cut = tokenizer.decode(fmt.continuation_ids("Reward: 1.00", ended_with_eos=False))
    assert cut.startswith("<|im_end|>\n<|im_start|>user\n")
    assert fmt.closing_ids(ended_with_eos=True) == ids_of(tokenizer, "\n")


# ----- the saved model ------------------------------------------------------------
def test_raw_build_loads_with_auto_classes(raw_model, tokenizer):
    assert all(os.path.isfile(os.path.join(raw_model, f)) for f in FILES)
    loaded = AutoTokenizer.from_pretrained(raw_model)
    assert loaded.eos_token == "<|im_end|>" and loaded.pad_token == "<|endoftext|>"
    assert loaded.chat_template and len(loaded) == len(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(raw_model)
    config = model.config
    assert config.model_type == "qwen2" and config.tie_word_embeddings
    assert config.head_dim >= 32
    assert config.hidden_size == config.num_attention_heads * config.head_dim
    assert config.vocab_size == len(loaded) and config.max_position_embeddings >= 4096
    assert model.generation_config.eos_token_id == loaded.eos_token_id
    # The loaded tokenizer (rebuilt by transformers from the files) encodes as the built one.
    env = gym.make("ragen/SokobanNewVocab-v0").unwrapped
    obs, info = env.reset(seed=3)
    user = first_user_text(env, obs, info["actions_left"])
    ids = ChatFormat(loaded).prompt_ids(user)
    assert ids == ChatFormat(tokenizer).prompt_ids(user)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(loaded))


def test_build_is_deterministic_and_cached(raw_model, tmp_path):
    again = get_builtin_model("builtin-raw", warm_start=False, cache_dir=str(tmp_path))
    assert os.path.basename(again) == os.path.basename(raw_model)
    for name in FILES:
        with open(os.path.join(raw_model, name), "rb") as a:
            with open(os.path.join(again, name), "rb") as b:
                assert a.read() == b.read(), name
    stamp = os.stat(os.path.join(again, "model.safetensors")).st_mtime_ns
    assert get_builtin_model("builtin-raw", warm_start=False, cache_dir=str(tmp_path)) == again
    assert os.stat(os.path.join(again, "model.safetensors")).st_mtime_ns == stamp
    assert [p for p in os.listdir(tmp_path) if p.startswith(".tmp")] == []
    # Other parameters, other folders.
    other_seed = builtin_model_dir("builtin-raw", warm_start=False, seed=1, cache_dir=str(tmp_path))
    assert other_seed != again
    assert builtin_model_dir("builtin-raw", warm_start=True, cache_dir=str(tmp_path)) != again


def test_warm_start_is_deterministic(tmp_path):
    paths = [
        get_builtin_model("tiny", seed=7, cache_dir=str(tmp_path / d), spec=TINY_WARM)
        for d in ("a", "b")
    ]
    raw = get_builtin_model("tiny", warm_start=False, seed=7, cache_dir=str(tmp_path / "c"))
    blobs = [open(os.path.join(p, "model.safetensors"), "rb").read() for p in (*paths, raw)]
    assert blobs[0] == blobs[1]
    assert blobs[0] != blobs[2]  # the warm start did change the weights


def test_spec_rejects_small_head_dim():
    with pytest.raises(ValueError, match="head_dim"):
        BuiltinSpec(head_dim=16)
    with pytest.raises(ValueError, match="name"):
        builtin_model_dir("../evil")


# ----- resolve_model --------------------------------------------------------------
def test_resolve_model(raw_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cache = os.path.dirname(raw_model)
    assert resolve_model("builtin-raw", cache_dir=cache) == raw_model
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolve_model(raw_model) == raw_model
    (tmp_path / "models").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"")
    for missing in (
        "/nonexistent/model-dir",
        "./not-here",
        "../not-here",
        "~/surely-not-a-model-dir-123",
        "models/missing",  # its parent exists
        "a/b/c",  # no hub id has two slashes
        "weights.bin",  # a file, not a directory
    ):
        with pytest.raises(FileNotFoundError, match=missing.replace(".", r"\.")):
            resolve_model(missing)
    with pytest.raises(ValueError):
        resolve_model("")


# ----- warm start -----------------------------------------------------------------
@pytest.mark.slow
def test_warm_started_model_answers_in_format(warm_model, raw_model):
    assert resolve_model("builtin", cache_dir=os.path.dirname(warm_model)) == warm_model
    # Sampled answers of every env (10 prompts each), under five sampling seeds.
    rates = [format_valid_rate(warm_model, n=90, temperature=1.0, seed=s) for s in range(5)]
    assert min(rates) >= 0.85, rates
    assert format_valid_rate(raw_model, n=18, temperature=1.0) < 0.2
