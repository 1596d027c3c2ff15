"""LoRA through peft: what trains, what travels, how the rollout actor applies it, the
KL reference without a second copy, and the Bandit learnt with adapters only."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import learner_batch, run_script, tiny_config, tiny_dict

from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
from ragen_rllib.models.lora import AdapterMerger, LoraSettings
from ragen_rllib.models.resolve import resolve_model
from ragen_rllib.rl_module.llm_rl_module import LLMRLModule
from ragen_rllib.rl_module.scoring import response_logprobs


def config(**overrides):
    base = {
        "env": "ragen/FrozenLakeNoSlip-v0", "llm": "builtin", "group_size": 3, "max_turns": 2,
        "minibatch_size": 2, "advantage_estimator": "gae", "lora_rank": 4, "lora_alpha": 8.0,
        "seed": 0,
    }  # fmt: skip
    return tiny_config(**{**base, **overrides})


@pytest.fixture(scope="module")
def module():
    torch.manual_seed(0)
    m = LLMRLModule(
        observation_space=None, action_space=None, model_config=config().llm_module_config()
    )
    with torch.no_grad():  # a trained adapter: lora_B starts at 0, which would hide bugs
        for name, p in m.actor.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    return m


def test_only_the_adapters_and_the_value_head_train(module):
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("value_head.") for n in trainable)
    assert any(n.startswith("critic.") for n in trainable)  # the critic is adapted too
    assert {id(p) for p in module.actor_parameters()} == {
        id(p) for n, p in module.actor.named_parameters() if "lora_" in n
    }
    # rank 4 on q, k, v, o, gate, up, down of 3 layers (hidden 128, kv 64, mlp 384)
    per_layer = 4 * (128 + 128) * 2 + 4 * (128 + 64) * 2 + 4 * (128 + 384) * 3
    assert sum(p.numel() for p in module.actor_parameters()) == 3 * per_layer


def test_only_the_adapter_travels_and_the_merge_is_the_merged_model(module):
    sent = module.actor_weights()
    assert sent and all(".lora_A.weight" in k or ".lora_B.weight" in k for k in sent)
    full = sum(p.numel() for p in module.lm.parameters())
    assert sum(v.numel() for v in sent.values()) < 0.1 * full
    merger = AdapterMerger.from_pretrained(resolve_model("builtin"), LoraSettings(4, 8.0))
    merged = merger.merged(sent)
    reference = copy.deepcopy(module.actor).merge_and_unload().state_dict()
    assert "lm_head.weight" not in merged  # tied: the engines take the embeddings
    assert set(merged) == set(reference) - {"lm_head.weight"}
    moved = 0
    for name, weight in merged.items():
        assert torch.allclose(weight, reference[name], atol=1e-6), name
        moved += int(not torch.equal(weight, merger.base[name]))
    assert moved == 21  # 7 adapted linear layers x 3 layers
    with pytest.raises(ValueError, match="neither lora_A nor lora_B"):
        merger.merged({"model.norm.weight": torch.zeros(128)})


def test_the_rollout_engine_samples_with_the_merged_weights(module):
    """Token in, token out under LoRA: the engine, given only the adapter, returns the
    log-probabilities the adapted learner model computes (1e-5)."""
    cfg = config()
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    runner.set_state({"rl_module": module.get_state(inference_only=True), "weights_seq_no": 3})
    assert runner.engine.policy_version == 3
    trajs = runner.sample()
    batch = learner_batch(cfg, module, trajs)
    batch = {k: torch.as_tensor(v) for k, v in batch.items()}
    with torch.no_grad():
        logp = response_logprobs(module.lm, batch, cfg.temperature)["logp"]
    mask = batch["response_mask"] > 0
    assert (logp - batch["behaviour_logp"])[mask].abs().max() <= 1e-5


def test_the_kl_reference_is_the_model_with_its_adapter_off(module):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(resolve_model("builtin"), dtype=torch.float32)
    ids = torch.randint(3, 1000, (2, 20))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    batch["response_mask"] = torch.zeros_like(ids)
    batch["response_mask"][:, 10:] = 1
    with torch.no_grad():
        adapted = response_logprobs(module.lm, batch, 1.0)["logp"]
        with module.actor.disable_adapter():
            off = response_logprobs(module.lm, batch, 1.0)["logp"]
        plain = response_logprobs(base, batch, 1.0)["logp"]
    assert (off - plain).abs().max() <= 1e-5
    assert (adapted - plain).abs().max() > 1e-3  # the adapter does change the policy


def test_lora_config_values_are_checked():
    for overrides, names in (
        ({"lora_rank": -1}, ["lora_rank=-1", ">= 0"]),
        ({"lora_alpha": 0}, ["lora_alpha=0", "> 0"]),
        ({"lora_dropout": 1.0}, ["lora_dropout=1.0", "[0, 1)"]),
        ({"lora_target_modules": []}, ["lora_target_modules=[]", "'all-linear'"]),
        (
            {"learner_strategy": "fsdp", "num_learners": 2},
            ["lora_rank=4", "not supported with learner_strategy 'fsdp'"],
        ),
    ):
        with pytest.raises(ValueError) as err:
            config(**overrides).check_values()
        for name in names:
            assert name in str(err.value), str(err.value)


#: The paper's LoRA setting on the Bandit, 8 groups of 8.
LORA_BANDIT = tiny_dict(
    llm="builtin", env_groups=8, group_size=8, max_new_tokens=24, reward_norm_method="mean",
    filter_keep_ratio=0.5, minibatch_size=16, seed=0, lora_rank=64, lora_alpha=64.0, lr=1.0e-3,
)  # fmt: skip
SCRIPT = """
import json, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False)
config = StarPOConfig.from_user_dict(CONFIG)
algo = config.build_algo()
before = algo.evaluate_success()["success_rate"]
rows = [algo.train() for _ in range(30)]
after = algo.evaluate_success()["success_rate"]
learner = rows[-1]["learners"]["default_policy"]
algo.stop()
print(json.dumps({"before": before, "after": after,
                  "trainable": learner["trainable_parameters"],
                  "total": learner["total_parameters"]}))
"""


@pytest.mark.slow
def test_the_bandit_is_learnt_with_lora_adapters(tmp_path):
    """The paper's LoRA setting (rank 64, alpha 64, all linear layers, 10x the
    learning rate) on the built-in model: evaluation success >= 90%."""
    out = run_script(SCRIPT, tmp_path, timeout=900, define={"CONFIG": LORA_BANDIT})
    assert out["before"] < 0.6 and out["after"] >= 0.9, out
    assert 0 < out["trainable"] < out["total"], out  # adapters only


def test_wrapping_a_model_in_adapters_warns_nothing():
    """peft's wrap asks transformers a renamed question; the user sees no warning for it."""
    import warnings

    from transformers import AutoModelForCausalLM

    from ragen_rllib.models.lora import wrap

    model = AutoModelForCausalLM.from_pretrained(resolve_model("builtin"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrap(model, LoraSettings.from_dict(config().llm_module_config()["lora"]))
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], caught
