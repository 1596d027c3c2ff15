"""The vLLM rollout engine on the built-in model (CPU build in CI).

These tests need vLLM, which has its own install (the README's vLLM test
command); where it is absent they are skipped, unless RAGEN_REQUIRE_VLLM=1
(set by that command), which makes its absence a failure.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import learner_logp_gap, private_env, run_script, tiny_config, tiny_dict
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from ragen_rllib.engines.base import SamplingParams
from ragen_rllib.engines.hf_engine import HFEngine

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]

KV_GB = 0.25  # a small KV cache: the tests' sequences are short


#: The tiny config on the vLLM engine, in one remote rollout actor.
VLLM = {
    "env": "ragen/FrozenLakeNoSlip-v0",
    "llm": "builtin",
    "engine": "vllm",
    "num_env_runners": 1,
    "vllm_kv_cache_gb": KV_GB,
    "group_size": 3,
    "max_turns": 3,
    "max_new_tokens": 16,
    "max_context_tokens": 1024,
    "minibatch_size": 2,
}


def vllm_config(**overrides):
    return tiny_config(**{**VLLM, "advantage_estimator": "gae", **overrides})


@pytest.fixture(scope="module")
def runner():
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner

    return LLMEnvRunner(config=vllm_config(), worker_index=0)


def prompts_of(runner, texts):
    return [runner.chat.prompt_ids(text) for text in texts]


def test_generation_stops_at_eos_and_is_reproducible(runner):
    engine, tok = runner.engine, runner.tokenizer
    prompts = prompts_of(runner, ["G _ P", "G _ P", "G _ P", "P _ _ O G"])
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16)
    out = engine.generate(prompts, params, seed=11)
    assert len(out) == 4
    for g in out:
        assert 1 <= len(g.ids) <= 16 and len(g.behaviour_logp) == len(g.ids)
        assert all(0 <= i < len(tok) for i in g.ids)
        assert all(math.isfinite(lp) and lp <= 0 for lp in g.behaviour_logp)
        # eos ends an answer and appears nowhere else in it.
        assert g.ended_with_eos == (g.ids[-1] == tok.eos_token_id)
        assert tok.eos_token_id not in g.ids[:-1]
    # Identical prompts get their own draws; the same seed gives the same answers.
    assert len({tuple(g.ids) for g in out[:3]}) > 1
    again = engine.generate(prompts, params, seed=11)
    assert [g.ids for g in again] == [g.ids for g in out]
    other = engine.generate(prompts, params, seed=12)
    assert any(a.ids != b.ids for a, b in zip(other, out, strict=True))
    # The pretrained built-in model answers in the format it learned.
    assert any("</answer>" in tok.decode(g.ids) for g in out)


def test_greedy_answers_equal_the_hf_engines(runner):
    prompts = prompts_of(runner, ["G _ P", "P _ _ O G", "_ O P G"])
    params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=16)
    tok = runner.tokenizer
    hf = HFEngine(runner._model_path, eos_token_id=tok.eos_token_id, pad_token_id=0)
    ours = runner.engine.generate(prompts, params, seed=0)
    ref = hf.generate(prompts, params, seed=0)
    for a, b in zip(ours, ref, strict=True):
        assert a.ids == b.ids
        assert (
            max(abs(x - y) for x, y in zip(a.behaviour_logp, b.behaviour_logp, strict=True)) <= 1e-3
        )


def test_a_stop_sequence_ends_the_answer_at_its_last_token(runner):
    """vLLM matches stop sequences in its own text; the ids it returns end at the
    token that completes one, and they are the free answer's ids up to there."""
    from ragen_rllib.engines.stops import StopStrings

    tok = runner.tokenizer
    stop = StopStrings(("answer>",), lambda ids: tok.decode(ids, skip_special_tokens=True))
    prompts = prompts_of(runner, ["G _ P", "P _ _ O G", "_ O P G"])
    free = runner.engine.generate(prompts, SamplingParams(0.0, 1.0, 24), seed=0)
    held = runner.engine.generate(prompts, SamplingParams(0.0, 1.0, 24, stop), seed=0)
    ended = 0
    for a, b in zip(free, held, strict=True):
        found = stop.cut(a.ids)
        if found is None:
            assert b.ids == a.ids
            continue
        ended += 1
        assert b.ids == a.ids[: found[0]] and stop.cut(b.ids)[0] == len(b.ids)
    assert ended >= 1  # the built-in model opens its answer with <answer>


def _hf_logprobs(model, prompt, ids, temperature):
    x = torch.tensor([prompt + ids])
    with torch.no_grad():
        logits = model(x).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)


def _perturbed(model, scale=0.05, seed=0):
    g = torch.Generator().manual_seed(seed)
    state = {
        k: v + scale * torch.randn(v.shape, generator=g)
        for k, v in model.state_dict().items()
        if not (k == "lm_head.weight" and model.config.tie_word_embeddings)
    }
    model.load_state_dict(state, strict=False)
    return state


def _check_against_hf(engine, model, prompts, temperatures, seed):
    worst = 0.0
    for t in temperatures:
        params = SamplingParams(temperature=t, top_p=1.0, max_new_tokens=24)
        for p, g in zip(prompts, engine.generate(prompts, params, seed=seed), strict=True):
            ref = _hf_logprobs(model, p, g.ids, t)
            worst = max(worst, (ref - torch.tensor(g.behaviour_logp)).abs().max().item())
    return worst


def test_logprobs_equal_the_hf_models_after_a_weight_update(runner):
    """After load_weights, the engine samples from the new weights (also for prompts
    whose prefix blocks it cached under the old ones) and its log-probabilities are
    log_softmax(logits / T) of the HF model holding those weights."""
    engine = runner.engine
    # Long prompts (several 128-token blocks on the CPU build), cached before the update.
    prompts = [p * 6 for p in prompts_of(runner, ["G _ P", "P _ _ O G"])]
    engine.generate(prompts, SamplingParams(1.0, 1.0, 8), seed=1)
    model = AutoModelForCausalLM.from_pretrained(runner._model_path, dtype=torch.float32)
    before = _check_against_hf(engine, model, prompts, [1.0], seed=2)
    assert before <= 1e-3, before
    state = _perturbed(model)
    engine.load_weights(state, version=3)
    assert engine.policy_version == 3
    worst = _check_against_hf(engine, model, prompts, [1.0, 0.7], seed=3)
    assert worst <= 1e-3, worst
    # A control: the old weights' log-probabilities are far from the new ones.
    old = AutoModelForCausalLM.from_pretrained(runner._model_path, dtype=torch.float32)
    assert _check_against_hf(engine, old, prompts, [1.0], seed=3) > 0.05
    engine.load_weights(
        {k: v for k, v in old.state_dict().items() if k != "lm_head.weight"}, version=4
    )
    with pytest.raises(ValueError, match="do not match"):
        engine.load_weights({"nonsense.weight": torch.zeros(1)}, version=5)


def _untied_check(model_dir: str) -> float:
    """Build an engine on ``model_dir`` (an untied copy of the built-in model), update
    its weights, and return the worst log-probability difference to the HF model."""
    from ragen_rllib.engines.vllm_engine import VLLMEngine

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = VLLMEngine(
        model_dir, eos_token_id=tok.eos_token_id, max_model_len=1024, kv_cache_gb=KV_GB
    )
    prompts = [tok.encode(t) * 3 for t in ("G _ P <answer>", "P _ O <think>")]
    worst = _check_against_hf(engine, model, prompts, [1.0], seed=1)
    state = _perturbed(model, seed=1)
    assert "lm_head.weight" in state
    engine.load_weights(state, version=1)
    return max(worst, _check_against_hf(engine, model, prompts, [1.0, 0.5], seed=2))


def test_an_untied_lm_head_is_updated_too(tmp_path, runner):
    """Models with their own LM head (most of those above 1B parameters). The check
    runs in a process of its own: vLLM's parallel state is per process, and a second
    engine in this one would tear it down for the first when it is freed."""
    cfg = AutoConfig.from_pretrained(runner._model_path)
    cfg.tie_word_embeddings = False
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).float().save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(runner._model_path).save_pretrained(tmp_path)
    done = subprocess.run(
        [sys.executable, __file__, str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    worst = float(done.stdout.strip().splitlines()[-1])
    assert worst <= 1e-3, worst


def test_token_in_token_out_with_the_vllm_engine(runner):
    """Multi-turn rollouts through the vLLM engine: the learner's first-update
    log-probabilities equal the engine's, and later turns reuse cached prefixes."""
    cfg = runner.config
    before = runner.engine.prompt_tokens_reused
    trajs = runner.sample()
    assert len(trajs) == cfg.env_groups * cfg.group_size
    assert max(t.num_turns for t in trajs) >= 2
    assert runner.engine.prompt_tokens_reused > before
    # The engine holds the shipped weights (the weight-update test put them back).
    diff, _, _ = learner_logp_gap(cfg, trajs)
    assert diff <= 1e-4, diff


LORA_CONFIG = tiny_dict(**{**VLLM, "max_turns": 2, "lora_rank": 4, "lora_alpha": 8.0})
#: A module with random LoRA adapters (the script's CONFIG), as a script's start.
ADAPTED_MODULE = """
import json, os, torch
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
from ragen_rllib.rl_module.llm_rl_module import LLMRLModule
cfg = StarPOConfig.from_user_dict(CONFIG)
torch.manual_seed(0)
module = LLMRLModule(observation_space=None, action_space=None,
                     model_config=cfg.llm_module_config())
with torch.no_grad():
    for name, p in module.actor.named_parameters():
        if "lora_B" in name:
            p.normal_(std=0.05)
"""
LORA_SCRIPT = (
    ADAPTED_MODULE
    + """
from ragen_rllib.learner.connectors import build_learner_pipeline
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
runner = LLMEnvRunner(config=cfg, worker_index=0)
sent = module.actor_weights()
runner.set_state({"rl_module": sent, "weights_seq_no": 1})
trajs = runner.sample()
batch = build_learner_pipeline(cfg)(rl_module={"default_policy": module}, batch={},
                                    episodes=trajs)["default_policy"]
with torch.no_grad():
    out = module.forward_train({k: torch.as_tensor(v) for k, v in batch.items()})
mask = torch.as_tensor(batch["response_mask"]) > 0
diff = (out["logp"] - torch.as_tensor(batch["behaviour_logp"]))[mask].abs().max().item()
print(json.dumps({"diff": diff, "adapter_only": all("lora_" in k for k in sent),
                  "version": runner.engine.policy_version}))
"""
)


def test_lora_adapters_reach_the_vllm_engine_merged(tmp_path):
    """Under LoRA only the adapter travels; the rollout actor merges it into the base
    weights and the vLLM engine samples with the adapted policy (its log-probabilities
    equal the learner's). In a process of its own, like the untied-head check."""
    # The inherited environment, HOME included, as for the untied-head check.
    out = run_script(
        LORA_SCRIPT, tmp_path, timeout=600, env=os.environ, define={"CONFIG": LORA_CONFIG}
    )
    assert out["adapter_only"] and out["version"] == 1
    assert out["diff"] <= 1e-3, out


EXPORT_SCRIPT = (
    ADAPTED_MODULE
    + """
from transformers import AutoModelForCausalLM, AutoTokenizer
from ragen_rllib.algorithms.starpo.export import export_module
from ragen_rllib.engines.base import SamplingParams
from ragen_rllib.engines.vllm_engine import VLLMEngine
out = os.path.abspath("exported")
export_module(module, out)
tok = AutoTokenizer.from_pretrained(out)
engine = VLLMEngine(out, eos_token_id=tok.eos_token_id, kv_cache_gb=KV_GB, max_model_len=1024)
prompts = [tok.encode(t, add_special_tokens=False) for t in ("G _ P", "P _ _ O G")]
gens = engine.generate(prompts, SamplingParams(1.0, 1.0, 12), seed=3)
hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
diff = 0.0
for prompt, gen in zip(prompts, gens):
    x = torch.tensor([prompt + gen.ids])
    with torch.no_grad():
        logits = hf(x).logits[0, len(prompt) - 1 : -1].float()
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(gen.ids)[:, None]).squeeze(-1)
    diff = max(diff, float((ref - torch.tensor(gen.behaviour_logp)).abs().max()))
print(json.dumps({"diff": diff, "tokens": sum(len(g.ids) for g in gens)}))
"""
)


def test_an_exported_model_loads_in_vllm(tmp_path):
    """``rllib export``'s folder (here of a module with LoRA adapters, merged on
    export) is a model vLLM serves: its sampled tokens' log-probabilities equal
    transformers' on the same folder."""
    out = run_script(
        EXPORT_SCRIPT, tmp_path, timeout=600, env=os.environ,
        define={"CONFIG": LORA_CONFIG, "KV_GB": KV_GB},
    )  # fmt: skip
    assert out["tokens"] > 2
    assert out["diff"] <= 1e-3, out


@pytest.mark.slow
def test_the_bandit_example_learns_with_vllm_rollout_actors(tmp_path):
    """The README's main example through `rllib train file`, sampled asynchronously by
    one remote rollout actor holding a vLLM engine: learning needs every update to
    reach that engine."""
    storage = tmp_path / "results"
    overrides = {
        "engine": "vllm",
        "num_env_runners": 1,
        "async_rollouts": True,
        "vllm_kv_cache_gb": 0.5,
    }
    env = private_env(tmp_path)
    proc = subprocess.run(
        [
            sys.executable, "-m", "ragen_rllib.cli", "train", "file",
            str(ROOT / "tuned_examples" / "bandit_cpu.yaml"),
            "--stop", '{"training_iteration": 20}',
            "--config", json.dumps(overrides),
            "--storage-path", str(storage),
        ],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trial = next((storage / "bandit-cpu").glob("StarPO_*"))
    rows = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
    assert len(rows) == 20
    # The pretrained model picks the better arm about half the time (47% measured).
    assert rows[0]["rollout"]["success_rate"] < 0.75
    assert rows[-1]["evaluation"]["success_rate"] >= 0.9
    assert rows[-1]["rollout"]["policy_version"] == 19
    assert max(r["rollout"]["policy_lag_max"] for r in rows) <= 1


def test_config_checks_for_the_vllm_engine():
    vllm_config(num_env_runners=0).check_values()  # beside the learner in the driver
    with pytest.raises(ValueError, match="engine_sleep_level"):
        vllm_config(engine_sleep_level=2).check_values()  # in a runner actor
    with pytest.raises(ValueError, match="top_p"):
        vllm_config(top_p=0.9, temperature=0.8).check_values()
    vllm_config(top_p=0.9, temperature=1.0).check_values()  # raw log-probs are exact
    with pytest.raises(ValueError, match="vllm_kv_cache_gb"):
        vllm_config(vllm_kv_cache_gb=0).check_values()


if __name__ == "__main__":
    print(_untied_check(sys.argv[1]))
