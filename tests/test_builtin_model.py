"""The built-in model: tokenizer, chat format, cached build, resolve_model, shipped weights."""

from __future__ import annotations

import json
import os
import shutil
from importlib import metadata

import gymnasium as gym
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import ragen_envs
from ragen_rllib.builtin import build as builtin_build
from ragen_rllib.builtin.model import (
    INFO_FILE,
    PACKAGED_DIR,
    build_key,
    cached_model_dir,
    file_digests,
    get_builtin_model,
    packaged_model,
)
from ragen_rllib.builtin.quality import GATE_PROMPTS, format_valid_rate, gate_draws
from ragen_rllib.builtin.spec import BuiltinSpec
from ragen_rllib.builtin.tokenizer import build_tokenizer, build_vocab
from ragen_rllib.builtin.transcripts import FILLER_WORDS, TranscriptCorpus, random_answer
from ragen_rllib.chat.prompts import (
    SYSTEM_PROMPT,
    ChatFormat,
    render_turn,
    system_prompt_for,
    with_instructions,
)
from ragen_rllib.models.resolve import resolve_model


def first_user_text(env, obs, actions_left, style="full"):
    """The first user message, as the env runner renders it."""
    return with_instructions(env, render_turn(1, obs, actions_left, None, style), style)


FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
# A short pretraining: enough to check determinism, not to learn anything.
TINY = BuiltinSpec(
    pretrain_steps=3,
    pretrain_batch=4,
    pretrain_snapshots=4,
    pretrain_chunk_tokens=600,
    pretrain_max_turns=2,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(*build_vocab())


@pytest.fixture(scope="module")
def raw_model(tmp_path_factory):
    return get_builtin_model(
        "builtin-raw", pretrained=False, cache_dir=str(tmp_path_factory.mktemp("cache"))
    )


@pytest.fixture(scope="module")
def shipped_model():
    """The default ``builtin`` model: the weights that ship with the package."""
    return resolve_model("builtin")


def ids_of(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


# ----- tokenizer ------------------------------------------------------------------
def test_tags_separator_and_action_names_are_single_tokens(tokenizer):
    for text in ("<think>", "</think>", "<answer>", "</answer>", "||", " ||", "\n"):
        assert len(ids_of(tokenizer, text)) == 1, text
    for env_id in ragen_envs.BUILTIN_MODEL_ENV_IDS:
        env = gym.make(env_id).unwrapped
        env.reset(seed=0)
        for name in env.action_names:
            assert len(ids_of(tokenizer, name)) == 1, name
            assert len(ids_of(tokenizer, " " + name)) == 1, name


@pytest.mark.parametrize("env_id", ragen_envs.BUILTIN_MODEL_ENV_IDS)
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


def test_compact_prompt_style(tokenizer):
    env = gym.make("ragen/FrozenLakeNoSlip-v0", instructions="compact").unwrapped
    obs, info = env.reset(seed=0)
    fmt = ChatFormat(tokenizer, system_prompt=system_prompt_for("compact"), prefill="<think>")
    first = first_user_text(env, obs, info["actions_left"], "compact")
    assert first == env.instructions() + "\n" + obs  # no turn header, budget or format hint
    prompt = tokenizer.decode(fmt.prompt_ids(first))
    assert prompt == f"<|im_start|>user\n{first}<|im_end|>\n<|im_start|>assistant\n<think>"
    assert render_turn(2, obs, 7, 0.0, "compact") == "Reward: 0.00\n" + obs
    full = ChatFormat(tokenizer, prefill="<think>").prompt_ids(
        first_user_text(gym.make("ragen/FrozenLakeNoSlip-v0").unwrapped, obs, 10)
    )
    assert len(fmt.prompt_ids(first)) * 3 < len(full)  # about 50 tokens against 175
    with pytest.raises(ValueError, match="prompt_style"):
        render_turn(1, obs, 1, None, "short")


# ----- the pretraining corpus -------------------------------------------------------
def test_pretraining_answers_act_at_random_whatever_the_state():
    """random_answer draws one to three actions, each uniform over the four moves,
    and a few filler words: over many draws in two lake states, the moves come
    with frequency 1/4 in each state, and the two states' frequencies agree."""
    lake = gym.make("ragen/FrozenLakeNoSlip-v0").unwrapped
    rng = np.random.default_rng(7)  # one stream: the states' draws are independent
    draws, states, moves, counts = 3000, [], [], []
    for seed in (0, 1):
        obs, _ = lake.reset(seed=seed)
        states.append(obs)
        move_counts, count_counts = dict.fromkeys(lake.action_names, 0), {1: 0, 2: 0, 3: 0}
        for _ in range(draws):
            answer = random_answer(rng, lake)
            parsed = ragen_envs.parse_answer("<think>" + answer, lake.action_names, lake.parser)
            assert parsed.is_valid and parsed.num_dropped == 0, (answer, parsed)
            assert 1 <= len(parsed.think.split()) <= 4, answer
            assert set(parsed.think.split()) <= set(FILLER_WORDS), answer
            assert 1 <= len(parsed.actions) <= 3, answer
            count_counts[len(parsed.actions)] += 1
            for action in parsed.actions:
                move_counts[action] += 1
        moves.append(move_counts)
        counts.append(count_counts)
    assert states[0] != states[1]
    # Within 4 standard errors of a binomial share (p = 1/4 per move over n actions;
    # 1/3 per action count over the draws); the states' difference has sqrt(2) as much.
    freqs = []
    for move_counts in moves:
        n = sum(move_counts.values())
        se = np.sqrt(0.25 * 0.75 / n)
        freq = np.array([move_counts[a] / n for a in lake.action_names])
        assert np.all(np.abs(freq - 0.25) <= 4 * se), (freq, se)
        freqs.append((freq, se))
    (f0, se0), (f1, se1) = freqs
    assert np.all(np.abs(f0 - f1) <= 4 * np.hypot(se0, se1)), (f0, f1)
    for count_counts in counts:
        share = np.array([count_counts[k] / draws for k in (1, 2, 3)])
        assert np.all(share > 0), share  # each count, 1 to 3, occurs
        assert np.all(np.abs(share - 1 / 3) <= 4 * np.sqrt((1 / 3) * (2 / 3) / draws)), share


def test_corpus_pulls_bandit_arms_in_turn_and_snapshots_render_a_window_of_zero(tokenizer):
    corpus = TranscriptCorpus(tokenizer, BuiltinSpec())
    arms = [corpus.next_arm("ragen/Bandit-v0") for _ in range(6)]
    assert sorted(arms[:2]) == ["Dragon", "Phoenix"] and arms[:2] * 3 == arms
    assert corpus.next_arm("ragen/SimpleSokoban-v0") is None
    rng = np.random.default_rng(0)
    seen_coordinates = 0
    for env_id in ("ragen/FrozenLakeNoSlip-v0", "ragen/SimpleSokoban-v0", "ragen/Bandit-v0"):
        for _ in range(5):
            ids, kinds = corpus.snapshot(rng, env_id, arm=corpus.next_arm(env_id))
            assert len(ids) == len(kinds) and kinds.count(1) > 0 and 2 not in kinds
            text = tokenizer.decode(ids)
            assert text.count("<|im_start|>user") == text.count("<|im_start|>assistant") == 1
            answer = tokenizer.decode(ids[kinds.index(1) : len(kinds) - kinds[::-1].index(1)])
            assert "</think>" in answer and answer.endswith("</answer><|im_end|>"), answer
            seen_coordinates += ";" in text
    assert seen_coordinates > 0  # some grid episodes show the coordinates line


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
    again = get_builtin_model("builtin-raw", pretrained=False, cache_dir=str(tmp_path))
    assert os.path.basename(again) == os.path.basename(raw_model)
    for name in FILES:
        with open(os.path.join(raw_model, name), "rb") as a:
            with open(os.path.join(again, name), "rb") as b:
                assert a.read() == b.read(), name
    stamp = os.stat(os.path.join(again, "model.safetensors")).st_mtime_ns
    assert get_builtin_model("builtin-raw", pretrained=False, cache_dir=str(tmp_path)) == again
    assert os.stat(os.path.join(again, "model.safetensors")).st_mtime_ns == stamp
    assert [p for p in os.listdir(tmp_path) if p.startswith(".tmp")] == []
    # Other parameters, other folders.
    other_seed = cached_model_dir("builtin-raw", False, 1, BuiltinSpec(), str(tmp_path))
    assert other_seed != again
    assert cached_model_dir("builtin-raw", True, 0, BuiltinSpec(), str(tmp_path)) != again


def test_pretraining_is_deterministic(tmp_path):
    paths = [
        get_builtin_model("tiny", seed=7, cache_dir=str(tmp_path / d), spec=TINY)
        for d in ("a", "b")
    ]
    raw = get_builtin_model("tiny", pretrained=False, seed=7, cache_dir=str(tmp_path / "c"))
    blobs = [open(os.path.join(p, "model.safetensors"), "rb").read() for p in (*paths, raw)]
    assert blobs[0] == blobs[1]
    assert blobs[0] != blobs[2]  # the pretraining did change the weights


def test_spec_rejects_small_head_dim(tmp_path):
    with pytest.raises(ValueError, match="head_dim"):
        BuiltinSpec(head_dim=16)
    with pytest.raises(ValueError, match="name"):
        cached_model_dir("../evil", True, 0, BuiltinSpec(), str(tmp_path))


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


# ----- the shipped model -----------------------------------------------------------
def test_builtin_resolves_to_the_shipped_weights_without_a_build(shipped_model, tmp_path):
    assert shipped_model == PACKAGED_DIR
    # No build happens: the cache stays empty.
    assert resolve_model("builtin", cache_dir=str(tmp_path)) == PACKAGED_DIR
    assert os.listdir(tmp_path) == []
    with open(os.path.join(PACKAGED_DIR, INFO_FILE)) as f:
        info = json.load(f)
    assert info["key"] == build_key(True, 0, BuiltinSpec())
    assert info["sha256"] == file_digests(PACKAGED_DIR)
    assert set(info["versions"]) >= {"python", "torch", "transformers", "numpy"}
    size = sum(os.path.getsize(os.path.join(PACKAGED_DIR, f)) for f in os.listdir(PACKAGED_DIR))
    assert size < 8 * 2**20


@pytest.fixture(scope="module")
def shipped_answers(shipped_model):
    """{style: [per-env (well formed, accepted, answers) for each sampling seed]}: the
    draws of the build record's checks (GATE_PROMPTS first-turn prompts, 12 per env,
    T=1; each seed draws its own states)."""
    return gate_draws(shipped_model)


@pytest.mark.slow
@pytest.mark.parametrize("style", ["compact", "full"])
def test_shipped_model_answers_in_format(shipped_answers, raw_model, style):
    """Loaded with the Auto classes (inside format_valid_by_env): at least 90% of the
    sampled first answers are well formed under every sampling seed. The grids' and
    bandits' answers are also accepted in their state as often as they are well formed
    (an action name is valid in any state)."""
    rates = []
    for counts in shipped_answers[style]:
        assert set(counts) == set(ragen_envs.BUILTIN_MODEL_ENV_IDS)
        rates.append(sum(well_formed for well_formed, _, _ in counts.values()) / GATE_PROMPTS)
        for env_id, (well_formed, accepted, _) in counts.items():
            assert accepted <= well_formed, env_id
            if gym.make(env_id).unwrapped.action_names:
                assert accepted == well_formed, env_id
    assert min(rates) >= 0.9, rates
    assert format_valid_rate(raw_model, n=32, temperature=1.0, prompt_style=style) < 0.2


@pytest.mark.slow
def test_shipped_model_is_well_formed_on_every_env(shipped_answers):
    """The warm-start gate per env: at least 85% well formed over the 120 answers each
    env gets (60 states in each prompt style, each answered once), as the build
    record's checks count them."""
    totals = {}
    for draws in shipped_answers.values():
        for counts in draws:
            for env_id, row in counts.items():
                totals[env_id] = np.add(totals.get(env_id, (0, 0, 0)), row)
    assert all(total == 120 for _, _, total in totals.values()), totals
    shares = {env_id: well_formed / total for env_id, (well_formed, _, total) in totals.items()}
    assert min(shares.values()) >= 0.85, shares


def test_stale_or_damaged_shipped_weights(tmp_path, caplog):
    copy = str(tmp_path / "builtin")
    shutil.copytree(PACKAGED_DIR, copy)
    key = build_key(True, 0, BuiltinSpec())
    assert packaged_model(key, copy) == copy
    assert packaged_model("another-key", copy) is None  # stale: the caller builds instead
    assert "built by other code" in caplog.text
    with open(os.path.join(copy, "config.json"), "a") as f:
        f.write(" ")
    with pytest.raises(RuntimeError, match=r"damaged: \['config.json'\]"):
        packaged_model(key, copy)
    assert packaged_model(key, str(tmp_path / "absent")) is None


def test_build_script_short_run(tmp_path):
    out = str(tmp_path / "model")
    assert builtin_build.main(["--steps", "2", "--out", out, "--threads", "1", "--no-checks"]) == 0
    with open(os.path.join(out, INFO_FILE)) as f:
        info = json.load(f)
    assert info["steps"] == 2 and info["key"] is None  # a short run is not the shipped build
    assert info["sha256"] == file_digests(out) and "model.safetensors" in info["sha256"]
    assert info["versions"]["torch"] == metadata.version("torch")
    AutoTokenizer.from_pretrained(out)
    AutoModelForCausalLM.from_pretrained(out)
