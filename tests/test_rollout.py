"""Rollout and learner data path without Ray: token in / token out, masks, turn ends, errors."""

from __future__ import annotations

import pytest
import torch
from conftest import learner_batch, learner_logp_gap, tiny_config

from ragen_rllib.engines.base import Generation
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
from ragen_rllib.learner.connectors import build_learner_pipeline
from ragen_rllib.rl_module.llm_rl_module import LLMRLModule


def config(**overrides):
    base = {
        "env": "ragen/FrozenLakeNoSlip-v0",
        "group_size": 3,
        "max_turns": 3,
        "minibatch_size": 2,
        "advantage_estimator": "gae",
    }
    return tiny_config(**{**base, **overrides})


class ScriptedEngine:
    """Answers from a script (trajectory index -> answers by turn), as real token ids."""

    def __init__(self, tokenizer, answer_for):
        self.tokenizer, self.answer_for, self.policy_version = tokenizer, answer_for, 0
        self.calls = self.prompt_tokens_reused = 0
        self.model = object()

    def generate(self, prompts, params, seed, cache_keys=None):
        self.calls += 1
        out = []
        for row, _ in enumerate(prompts):
            text = self.answer_for(self.calls, row)
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [
                self.tokenizer.eos_token_id
            ]
            out.append(Generation(ids, [-0.5] * len(ids), True))
        return out

    def clear_cache(self):
        pass


@pytest.fixture(scope="module")
def runner():
    return LLMEnvRunner(config=config(), worker_index=0)


def test_token_in_token_out_logprobs_match_the_learner(runner):
    cfg = runner.config
    trajs = runner.sample()
    assert len(trajs) == cfg.env_groups * cfg.group_size
    diff, _, _ = learner_logp_gap(cfg, trajs)
    assert diff <= 1e-4, diff


def test_masks_and_turn_spans_cover_exactly_the_generated_tokens(runner):
    trajs = runner.sample()
    tok = runner.tokenizer
    for t in trajs:
        assert len(t.segments) == 1  # the whole history: one growing sequence
        seg = t.segments[0]
        assert len(seg.input_ids) == len(seg.response_mask) == len(seg.behaviour_logp)
        generated = [i for _, s, e in t.turn_spans for i in range(s, e)]
        assert [i for i, m in enumerate(seg.response_mask) if m] == generated
        assert all(
            lp == 0.0 for lp, m in zip(seg.behaviour_logp, seg.response_mask, strict=True) if not m
        )
        assert len(t.turn_spans) == len(t.turn_rewards) == t.num_turns >= 1
        assert len(t.turn_observations) == t.num_turns
        for k, answer in enumerate(t.answers):
            # The env saw exactly the decoded sampled ids (after the prefill).
            assert answer == runner.chat.prefill + tok.decode(
                t.turn_ids(k), skip_special_tokens=True
            )
        # The prompt starts the sequence and carries no loss.
        assert t.turn_spans[0][1] > 0 and not any(seg.response_mask[: t.turn_spans[0][1]])


def test_trajectories_end_at_different_turns(runner, monkeypatch):
    cfg = config(env="ragen/Bandit-v0", max_turns=3)
    bandit = LLMEnvRunner(config=cfg, worker_index=0)

    def answer(call, row):
        # Rows 0-2 pull an arm at turn 1; rows 3-5 stall until turn 3 (the last one).
        if row < 3 and call == 1 or call == 3:
            return "go </think> <answer> Dragon </answer>"
        return "hmm </think> <answer> Unicorn </answer>"

    bandit.engine = ScriptedEngine(bandit.tokenizer, answer)
    trajs = bandit.sample()
    turns = sorted(t.num_turns for t in trajs)
    assert turns == [1, 1, 1, 3, 3, 3]
    for t in trajs:
        assert t.end_reason == "terminated"
        assert t.turn_rewards[-1] in (pytest.approx(0.0), pytest.approx(1.0))
        if t.num_turns == 3:
            assert t.turn_rewards[:2] == [pytest.approx(-0.1)] * 2  # format penalty, unknown arm


def test_context_overflow_ends_the_trajectory_and_keeps_it():
    small = LLMEnvRunner(config=config(env="ragen/Bandit-v0", max_turns=5), worker_index=0)
    small.engine = ScriptedEngine(
        small.tokenizer, lambda call, row: "a </think> <answer> Unicorn </answer>"
    )
    prompt_len = small.sample()[0].turn_spans[0][1]
    # Room for the first answer but not for a second turn.
    small.config.max_context_tokens = prompt_len + small.config.max_new_tokens + 20
    out = small.sample()
    assert {t.end_reason for t in out} == {"context_overflow"}
    assert all(t.num_turns == 1 and t.done for t in out)
    # No room for even the first answer: ended before any turn (the config check stops
    # a run whose seed-0 prompt does not fit; another seed's is dropped with its group).
    small.config.max_context_tokens = prompt_len
    out = small.sample()
    assert all(t.end_reason == "context_overflow" and t.num_turns == 0 for t in out)
    assert all(t.unplayable and f"max_context_tokens={prompt_len}" in t.error for t in out)


def test_env_errors_end_their_trajectory_and_are_logged(runner, monkeypatch, caplog):
    envs = runner._make_envs([runner._mix[0]] * 6)

    def broken_step(text):
        raise RuntimeError("boom")

    def broken_reset(**kwargs):
        raise KeyError("no map")

    monkeypatch.setattr(envs[0], "step", broken_step)
    monkeypatch.setattr(envs[4], "reset", broken_reset)
    with caplog.at_level("WARNING", logger="ragen_rllib.env_runner"):
        trajs = runner.sample()
    assert [t.end_reason == "env_error" for t in trajs] == [1, 0, 0, 0, 1, 0]
    assert trajs[0].error == "step(): RuntimeError: boom" and trajs[0].num_turns == 0
    assert trajs[4].error == "reset(): KeyError: 'no map'" and trajs[4].segments == []
    logged = caplog.text
    for t in (trajs[0], trajs[4]):
        assert f"env ragen/FrozenLakeNoSlip-v0 (seed {t.seed}): {t.error}; its group" in logged


def test_observation_tokens_carry_no_loss_or_gradient(runner):
    from ragen_rllib.learner.starpo_learner import StarPOTorchLearner

    cfg = runner.config
    trajs = runner.sample()
    module = LLMRLModule(
        observation_space=None, action_space=None, model_config=cfg.llm_module_config()
    )
    batch = learner_batch(cfg, module, trajs)
    learner = StarPOTorchLearner.__new__(StarPOTorchLearner)  # only the loss is exercised

    class _Metrics:
        def log_value(self, *args, **kwargs):
            pass

    learner.metrics, learner._reference = _Metrics(), None
    mask = batch["response_mask"] > 0

    def loss_and_grad(b):
        module.zero_grad()
        out = module.forward_train(b)
        loss = learner.compute_loss_for_module(module_id="m", config=cfg, batch=b, fwd_out=out)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in module.parameters() if p.grad is not None])
        return loss.detach(), grads

    loss, grads = loss_and_grad(batch)
    noisy = dict(batch)
    for key in ("advantages", "behaviour_logp", "value_targets", "old_values"):
        noisy[key] = torch.where(mask, batch[key], torch.randn_like(batch[key]) * 100)
    loss2, grads2 = loss_and_grad(noisy)
    assert torch.equal(loss, loss2) and torch.allclose(grads, grads2)


def test_bfloat16_module_keeps_float32_weights_and_shares_storage(runner):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragen_rllib.engines.hf_engine import HFEngine

    cfg = config(model_dtype="bfloat16")
    module_cfg = cfg.llm_module_config()
    assert module_cfg["critic"]  # the default estimator is GAE: actor and critic
    module = LLMRLModule(observation_space=None, action_space=None, model_config=module_cfg)
    state = module.get_state()
    params = dict(module.named_parameters())
    # Master weights in float32: a bf16 weight would swallow lr=1e-6 updates.
    assert {v.dtype for v in state.values()} == {torch.float32}
    # No copy on the CPU: the state's tensors are the parameters' storage.
    key = "actor.model.embed_tokens.weight"
    assert state[key].data_ptr() == params[key].data_ptr()
    assert any(k.startswith("critic.") for k in state) and "value_head.weight" in state
    # Inference-only: the actor's weights under the rollout model's own names.
    actor_only = module.get_state(inference_only=True)
    engine_names = set(AutoModelForCausalLM.from_pretrained(module_cfg["model_path"]).state_dict())
    assert actor_only and set(actor_only) <= engine_names
    assert "model.embed_tokens.weight" in actor_only

    # The forward pass runs in bfloat16 (autocast) and still returns float32 log-probs,
    # close to the float32 ones.
    batch = build_learner_pipeline(cfg)(
        rl_module={"default_policy": module}, batch={}, episodes=runner.sample()
    )["default_policy"]
    with torch.no_grad():
        out = module.forward_train(batch)
        module.compute_dtype = torch.float32
        exact = module.forward_train(batch)
    mask = batch["response_mask"] > 0
    assert out["logp"].dtype == torch.float32 and out["values"].dtype == torch.float32
    assert not torch.equal(out["logp"][mask], exact["logp"][mask])
    assert (out["logp"] - exact["logp"])[mask].abs().max() < 0.25

    other = LLMRLModule(observation_space=None, action_space=None, model_config=module_cfg)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    other.set_state(state)
    assert all(torch.equal(v, other.get_state()[k]) for k, v in state.items())
    with pytest.raises(ValueError, match="lacks"):
        other.set_state({**state, "nonsense.weight": torch.zeros(1)})

    # The rollout engine holds bfloat16 weights and takes the actor's under its own names.
    tok = AutoTokenizer.from_pretrained(module_cfg["model_path"])
    engine = HFEngine(
        module_cfg["model_path"],
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="bfloat16",
    )
    engine.load_weights(actor_only, version=7)
    assert engine.policy_version == 7
    loaded = engine.model.state_dict()
    assert all(torch.equal(loaded[k], v.to(torch.bfloat16)) for k, v in actor_only.items())


def test_rollout_device_choice():
    from ragen_rllib.engines.factory import rollout_device

    assert rollout_device("cpu") == "cpu"
    assert rollout_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="rollout_device='cuda'"):
            rollout_device("cuda")


def test_prefix_cache_gives_the_logprobs_of_a_full_encode(runner):
    """A turn that reuses the previous turn's keys and values (prefix caching) samples
    what a fresh encode of the whole prompt samples, with the same log-probabilities."""
    from ragen_rllib.engines.base import SamplingParams
    from ragen_rllib.engines.hf_engine import HFEngine

    engine = runner.engine
    tok = runner.tokenizer
    prompts = [runner.chat.prompt_ids(text) for text in ("G _ P", "P _ _ O G", "_ _ P")]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=12)
    keys = ["a", "b", "c"]
    engine.clear_cache()
    first = engine.generate(prompts, params, seed=3, cache_keys=keys)
    # The next turn extends each context by the answer and a new observation of a
    # different length per row; row "c" starts over (a prompt the cache does not hold).
    extra = [tok.encode(t, add_special_tokens=False) for t in ("O", "G P _ _", "P")]
    nxt = [p + g.ids + e for p, g, e in zip(prompts, first, extra, strict=True)]
    nxt[2] = runner.chat.prompt_ids("O P _")
    before = engine.prompt_tokens_reused
    cached = engine.generate(nxt, params, seed=4, cache_keys=keys)
    assert engine.prompt_tokens_reused - before > sum(len(p) for p in prompts[:2])
    engine.clear_cache()
    fresh = HFEngine(
        runner._model_path, eos_token_id=tok.eos_token_id, pad_token_id=engine.pad_token_id
    )
    plain = fresh.generate(nxt, params, seed=4)
    for c, p in zip(cached, plain, strict=True):
        assert c.ids == p.ids
        assert (
            max(abs(a - b) for a, b in zip(c.behaviour_logp, p.behaviour_logp, strict=True)) <= 1e-5
        )


@pytest.mark.parametrize("keyed", [True, False])
def test_a_common_prefix_is_encoded_once_and_changes_no_answer(runner, monkeypatch, keyed):
    """The tokens every prompt of a call begins with (the chat template's system
    message and the env's instructions) are encoded once for the whole call and
    kept for the next call until the cache is cleared: every answer and its
    log-probabilities are those of an engine that encodes each prompt in full."""
    from ragen_rllib.engines import prefix_cache as engine_module
    from ragen_rllib.engines.base import SamplingParams
    from ragen_rllib.engines.hf_engine import HFEngine

    tok = runner.tokenizer
    engine = HFEngine(
        runner._model_path, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    head = "Reach the goal. Symbols: P you, G goal, O hole.\n"
    turn1 = [runner.chat.prompt_ids(head + t) for t in ("G _ P", "P _ _ O G", "_ _ P", "G _ P")]
    turn2 = [runner.chat.prompt_ids(head + t) for t in ("O P", "P G _", "_ P O _", "P _")]
    # A third call whose prompts part earlier: their common prefix is part of the kept one.
    turn3 = [runner.chat.prompt_ids(t) for t in ("Reach it. G _ P", "Reach the hole. P _")]
    common = engine_module.common_prefix_length(turn1[0], turn1[1])
    assert common >= 16 and turn1[0][:common] == turn2[2][:common]
    assert 8 <= engine_module.common_prefix_length(*turn3) < common
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=10)
    keys = list(range(4)) if keyed else None
    keys_of = {1: keys, 2: keys, 3: None if keys is None else [10, 11]}
    encoded: list[tuple[int, ...]] = []  # the input shape of every forward pass
    hook = engine.model.get_input_embeddings().register_forward_hook(
        lambda m, args, out: encoded.append(tuple(args[0].shape))
    )
    engine.clear_cache()
    before = engine.prompt_tokens_reused
    calls = ((turn1, 1), (turn2, 2), (turn3, 3))
    shared = [engine.generate(p, params, seed=s, cache_keys=keys_of[s]) for p, s in calls]
    hook.remove()
    engine.clear_cache()
    # The common prefix is one pass of its own, once for all calls (the third one's is
    # cut from it); the prompts' rests follow (turn 1: rows 0 and 3 are one prompt,
    # encoded once), then the decode steps (one token a row).
    assert encoded.count((1, common)) == 1 and encoded[0] == (1, common)
    prefills = [shape for shape in encoded if shape[1] > 1 and shape != (1, common)]
    assert [rows for rows, _ in prefills] == [3, 4, 2]
    assert max(width for _, width in prefills[:2]) < max(len(p) for p in turn1 + turn2) - common + 1
    # Every row reuses the prefix (a trajectory's own cache may give a row more).
    assert engine.prompt_tokens_reused - before >= common * 8
    monkeypatch.setattr(engine_module, "MIN_COMMON_PREFIX", 10**9)  # never shared
    plain_engine = HFEngine(
        runner._model_path, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    plain = [plain_engine.generate(p, params, seed=s) for p, s in calls]
    for turn_a, turn_b in zip(shared, plain, strict=True):
        for a, b in zip(turn_a, turn_b, strict=True):
            assert a.ids == b.ids
            pairs = zip(a.behaviour_logp, b.behaviour_logp, strict=True)
            assert max(abs(x - y) for x, y in pairs) <= 1e-5


def test_ended_rows_leave_the_batch_without_changing_any_answer(runner, monkeypatch):
    """Rows whose answers ended are dropped from the decode batch (in bulk): every
    row's tokens and log-probabilities are those of a batch that keeps all rows to
    the end, and the prefix cache built along the way serves the next turn."""
    from ragen_rllib.engines import hf_engine as engine_module
    from ragen_rllib.engines.base import SamplingParams
    from ragen_rllib.engines.hf_engine import HFEngine
    from ragen_rllib.models.resolve import resolve_model

    tok = runner.tokenizer
    # The pretrained model: its answers end (with eos) after different lengths.
    engine = HFEngine(
        resolve_model("builtin"), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    texts = ["G _ P", "P _ _ O G", "_ _ P", "O P _", "P G", "_ O _ P G"] * 4
    prompts = [runner.chat.prompt_ids(t) for t in texts]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=24)
    keys = list(range(len(prompts)))
    extra = tok.encode("O", add_special_tokens=False)

    def two_turns():
        engine.clear_cache()
        first = engine.generate(prompts, params, seed=5, cache_keys=keys)
        nxt = [p + g.ids + extra for p, g in zip(prompts, first, strict=True)]
        second = engine.generate(nxt, params, seed=6, cache_keys=keys)
        engine.clear_cache()
        return first, second

    compacted = two_turns()
    monkeypatch.setattr(engine_module, "COMPACT_SHARE", 2.0)  # never
    kept = two_turns()
    lengths = {len(g.ids) for g in compacted[0]}
    assert len(lengths) > 2 and sum(g.ended_with_eos for g in compacted[0]) > 6  # ends differ
    for turn_a, turn_b in zip(compacted, kept, strict=True):
        for a, b in zip(turn_a, turn_b, strict=True):
            assert a.ids == b.ids and a.ended_with_eos == b.ended_with_eos
            assert (
                max(abs(x - y) for x, y in zip(a.behaviour_logp, b.behaviour_logp, strict=True))
                <= 1e-5
            )


def test_sampling_draws_tokens_with_their_probabilities():
    """The engine's sampler (one uniform draw per row, inverse CDF) matches the
    distribution it is given, top-p truncation included, and never picks a token
    of probability 0."""
    from ragen_rllib.engines.base import SamplingParams
    from ragen_rllib.engines.hf_engine import _sample

    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05])
    logits = probs.clamp_min(1e-30).log().repeat(20000, 1)
    gen = torch.Generator().manual_seed(0)
    token, logp = _sample(logits, SamplingParams(temperature=1.0), gen)
    freq = torch.bincount(token, minlength=5).float() / len(token)
    assert torch.allclose(freq, probs, atol=0.01) and freq[1] == 0
    assert torch.allclose(logp, probs.clamp_min(1e-30).log()[token], atol=1e-5)
    # top_p=0.8 keeps 0.5 and 0.3 only, renormalised: 0.625 / 0.375.
    token, _ = _sample(logits, SamplingParams(temperature=1.0, top_p=0.8), gen)
    freq = torch.bincount(token, minlength=5).float() / len(token)
    assert torch.allclose(freq, torch.tensor([0.625, 0, 0.375, 0, 0]), atol=0.01)


def test_sampling_at_the_top_edge_picks_the_last_token_with_probability():
    """A draw whose target rounds up to the total mass (index V from the search) falls
    back to the last token of positive probability, never to a truncated one."""
    from ragen_rllib.engines.base import SamplingParams
    from ragen_rllib.engines.hf_engine import _sample

    probs = torch.tensor([[0.5, 0.0, 0.3, 0.15, 0.05]] * 3)
    logits = probs.clamp_min(1e-30).log()
    gen = torch.Generator().manual_seed(0)
    # 1.0 stands for a draw whose product with the total rounds up to it.
    uniforms = torch.tensor([[1.0], [0.0], [0.9999]])
    token, _ = _sample(logits, SamplingParams(temperature=1.0, top_p=0.8), gen, uniforms)
    assert token.tolist() == [2, 0, 2]  # top-p keeps 0 and 2: the edge lands on 2
    token, _ = _sample(logits, SamplingParams(temperature=1.0), gen, uniforms)
    assert token.tolist() == [4, 0, 4]


def test_a_first_prompt_is_encoded_once_per_sample(runner, monkeypatch):
    """The N trajectories of a group share their first prompt: it is encoded once, and
    every trajectory still holds those ids in a list of its own."""
    chat = runner.chat
    encoded: list[str] = []
    original = chat.prompt_ids

    def prompt_ids(text):
        encoded.append(text)
        return original(text)

    monkeypatch.setattr(chat, "prompt_ids", prompt_ids)
    trajs = runner.sample()
    firsts = [t.turn_prompts[0] for t in trajs]
    assert sorted(encoded) == sorted(set(firsts))  # one encode per distinct first prompt
    assert len(encoded) < len(trajs)  # group_size 3: the copies were not encoded
    for t in trajs:
        ids = original(t.turn_prompts[0])
        assert t.segments[0].input_ids[: len(ids)] == ids
    assert len({id(t.segments[0].input_ids) for t in trajs}) == len(trajs)
