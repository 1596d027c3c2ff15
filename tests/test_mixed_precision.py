"""``model_dtype: bfloat16`` is mixed precision: float32 master weights and AdamW
moments, bfloat16 compute, bfloat16 weights for the rollout engines; LoRA's frozen
base in bfloat16 under float32 adapters; and FSDP2 with a MixedPrecisionPolicy."""

from __future__ import annotations

import pytest
import torch
from conftest import built_learner, frozenlake_gae_config, run_script

from ragen_rllib.distributed.wire import from_wire, to_wire
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
from ragen_rllib.rl_module.llm_rl_module import LLMRLModule

MODULE = "default_policy"


config = frozenlake_gae_config


@pytest.fixture(scope="module")
def sampled():
    runner = LLMEnvRunner(config=config(), worker_index=0)
    return runner.get_spaces(), runner.sample()


def _learner(spaces, **overrides):
    return built_learner(config(**overrides), spaces)


def _watch_dtypes(net: torch.nn.Module, seen: dict[str, set], name: str):
    """Record the dtypes of a module's input and output on every forward."""

    def hook(_module, args, output):
        seen.setdefault(name, set()).add((args[0].dtype, output.dtype))

    return net.register_forward_hook(hook)


def _optimizer_tensors(learner) -> dict[str, torch.Tensor]:
    out = {}
    for name, optim in learner._named_optimizers.items():
        for i, state in enumerate(optim.state.values()):
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    out[f"{name}/{i}/{key}"] = value
    return out


# ----- one learner: float32 master weights and AdamW state, bfloat16 compute ---------
def test_bfloat16_keeps_float32_master_weights_and_adam_state_and_computes_in_bfloat16(
    sampled,
):
    spaces, trajs = sampled
    learner = _learner(spaces, model_dtype="bfloat16")
    module = learner.module[MODULE]
    seen: dict[str, set] = {}
    hooks = [
        _watch_dtypes(module.actor.model.layers[0].self_attn.q_proj, seen, "actor linear"),
        _watch_dtypes(module.critic.layers[1].self_attn.q_proj, seen, "critic linear"),
        _watch_dtypes(module.value_head, seen, "value head"),
    ]
    learner.update(episodes=trajs, minibatch_size=len(trajs), num_epochs=1)
    for h in hooks:
        h.remove()
    # The compute: bfloat16 products in actor and critic (the residual stream and the
    # norms feeding them stay float32, as autocast leaves them); the value head float32.
    assert seen["actor linear"] == {(torch.float32, torch.bfloat16)}, seen
    assert seen["critic linear"] == {(torch.float32, torch.bfloat16)}, seen
    assert seen["value head"] == {(torch.float32, torch.float32)}, seen
    # The master weights: every parameter float32, and the update moved them.
    params = dict(module.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.float32}
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in params.values())
    # AdamW's moments, for the actor's and the critic's optimizer: float32, filled.
    state = _optimizer_tensors(learner)
    kinds = {key.rsplit("/", 1)[1] for key in state}
    assert kinds == {"exp_avg", "exp_avg_sq"}, kinds
    assert {key.split("/")[0] for key in state} == {f"{MODULE}_actor", f"{MODULE}_critic"}
    assert len(state) == 2 * len(params)
    assert {v.dtype for v in state.values()} == {torch.float32}
    assert all(bool(v.abs().sum() > 0) for k, v in state.items() if k.endswith("exp_avg_sq"))
    # What a checkpoint saves of them (RLlib converts the state to NumPy): float32.
    saved = learner.get_state(components="optimizer")["optimizer"]
    arrays = [
        v
        for entry in saved.values()
        for per_param in entry["state"]["state"].values()
        for v in per_param.values()
        if getattr(v, "ndim", 0) > 0
    ]
    assert arrays and {str(a.dtype) for a in arrays} == {"float32"}


def _update(spaces, trajs, **overrides):
    """One update from the seeded initial weights: (parameters before, parameters
    after, gradients, the update's logged loss terms)."""
    learner = _learner(spaces, **overrides)
    module = learner.module[MODULE]
    before = {k: v.detach().clone() for k, v in module.named_parameters()}
    result = learner.update(episodes=trajs, minibatch_size=len(trajs), num_epochs=1)
    after = {k: v.detach().clone() for k, v in module.named_parameters()}
    grads = {k: v.grad.detach().clone() for k, v in module.named_parameters()}
    logged = {k: float(result[MODULE][k]) for k in ("policy_loss", "value_loss", "entropy")}
    return before, after, grads, logged


def _flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors.values()])


def test_one_bfloat16_update_is_close_to_the_float32_update(sampled):
    """The same initial weights and batch, one update with bfloat16 compute and one
    with float32: the gradients, the weight changes and the logged losses agree."""
    spaces, trajs = sampled
    start32, end32, grads32, loss32 = _update(spaces, trajs, model_dtype="float32")
    start16, end16, grads16, loss16 = _update(spaces, trajs, model_dtype="bfloat16")
    assert all(torch.equal(start32[k], start16[k]) for k in start32)  # the same start
    g32, g16 = _flat(grads32), _flat(grads16)
    delta32 = _flat({k: end32[k] - start32[k] for k in start32})
    delta16 = _flat({k: end16[k] - start16[k] for k in start16})
    # Gradients: bfloat16 keeps 8 significant bits (a relative rounding of 2^-9 per
    # product); summed over a few layers that is ~1% of the gradient. Measured: 1.2%.
    assert ((g16 - g32).norm() / g32.norm()).item() <= 0.05
    # Weight changes: AdamW's first step is about lr * sign(g) per weight, so a weight
    # whose gradient is near 0 can step the other way, which moves the change by
    # 2 lr. A share f of such weights gives a relative difference of about 2 sqrt(f):
    # 0.2 allows f = 1%. Measured: 99.8% of the signs agree, relative difference 0.12,
    # cosine 0.991.
    assert (delta16.sign() == delta32.sign()).float().mean().item() >= 0.99
    assert ((delta16 - delta32).norm() / delta32.norm()).item() <= 0.2
    assert torch.nn.functional.cosine_similarity(delta16, delta32, dim=0).item() >= 0.98
    # Losses. The first step's policy loss is ~0 (ratios of 1, whitened advantages);
    # bfloat16 log-probabilities move each ratio by ~1e-2 in either direction, which
    # averages out. Measured: |diff| 2.7e-5; value loss and entropy 5e-4 and 3e-4
    # relative.
    assert abs(loss16["policy_loss"] - loss32["policy_loss"]) <= 1e-3, (loss16, loss32)
    for key in ("value_loss", "entropy"):
        assert abs(loss16[key] - loss32[key]) <= 1e-2 * abs(loss32[key]), (key, loss16, loss32)


# ----- the rollout engines: bfloat16 weights, half the bytes on the wire ----------------
def test_pushed_weights_are_bfloat16_and_the_engine_holds_them(sampled):
    spaces, _ = sampled
    learner = _learner(spaces, model_dtype="bfloat16")
    module = learner.module[MODULE]
    # What SamplingMixin._push_weights asks the learner for.
    pushed = learner.get_state(components=f"rl_module/{MODULE}", inference_only=True)
    pushed = pushed["rl_module"][MODULE]
    assert pushed and {v.dtype for v in pushed.values()} == {torch.bfloat16}
    masters = dict(module.actor.named_parameters())
    assert "lm_head.weight" not in pushed  # tied: the embeddings carry it
    for name, weight in pushed.items():
        assert torch.equal(weight, masters[name].detach().to(torch.bfloat16)), name
    # On the wire: half the bytes of the float32 master weights.
    wire = to_wire(pushed)
    sent = sum(array.nbytes for array, _ in wire.values())
    assert sent * 2 == sum(masters[name].numel() * 4 for name in pushed)
    # The rollout engine is bfloat16 and takes the pushed weights as they are.
    runner = LLMEnvRunner(config=config(model_dtype="bfloat16"), worker_index=0)
    engine = runner.engine.model
    assert {p.dtype for p in engine.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        for p in masters.values():
            p.add_(1e-2)  # new weights, so that loading them is seen
    fresh = module.get_state(inference_only=True)
    runner.set_state({"rl_module": to_wire(fresh), "weights_seq_no": 5})
    assert runner.engine.policy_version == 5
    state = engine.state_dict()
    for name, weight in from_wire(to_wire(fresh)).items():
        assert torch.equal(state[name], weight), name
    assert {p.dtype for p in engine.parameters()} == {torch.bfloat16}


def test_float32_pushes_the_master_weights_themselves(sampled):
    """With model_dtype float32 nothing is cast: the pushed tensors are the master
    weights' own storage (no copy on the CPU)."""
    spaces, _ = sampled
    module = _learner(spaces).module[MODULE]
    pushed = module.get_state(inference_only=True)
    masters = dict(module.actor.named_parameters())
    assert {v.dtype for v in pushed.values()} == {torch.float32}
    assert all(v.data_ptr() == masters[k].data_ptr() for k, v in pushed.items())


# ----- LoRA: float32 adapters over a bfloat16 frozen base ---------------------------
def test_lora_trains_float32_adapters_over_a_bfloat16_frozen_base(sampled):
    spaces, trajs = sampled
    lora = dict(model_dtype="bfloat16", lora_rank=4, lora_alpha=8.0)
    learner = _learner(spaces, **lora)
    module = learner.module[MODULE]
    params = dict(module.named_parameters())
    trainable = {k for k, p in params.items() if p.requires_grad}
    assert trainable and all("lora_" in k or k.startswith("value_head.") for k in trainable)
    assert {params[k].dtype for k in trainable} == {torch.float32}
    assert {p.dtype for k, p in params.items() if k not in trainable} == {torch.bfloat16}
    # A tied LM head is cast once and stays the embedding matrix.
    lm = module.lm
    assert lm.lm_head.weight is lm.model.embed_tokens.weight
    # An update: float32 gradients and AdamW moments for the adapters and value head.
    seen: dict[str, set] = {}
    hook = _watch_dtypes(lm.model.layers[0].self_attn.q_proj, seen, "adapted linear")
    learner.update(episodes=trajs, minibatch_size=len(trajs), num_epochs=1)
    hook.remove()
    assert {out for _, out in seen["adapted linear"]} == {torch.bfloat16}, seen
    state = _optimizer_tensors(learner)
    assert len(state) == 2 * len(trainable)
    assert {v.dtype for v in state.values()} == {torch.float32}
    assert all(params[k].grad.dtype == torch.float32 for k in trainable)
    # Only the float32 adapters travel (the runner merges them into its base).
    sent = module.get_state(inference_only=True)
    assert sent and all("lora_" in k for k in sent)
    assert {v.dtype for v in sent.values()} == {torch.float32}


def test_a_float32_lora_checkpoint_restores_into_a_bfloat16_module():
    """Checkpoints written before the frozen base was held in bfloat16 hold a float32
    base: it loads, rounded once to bfloat16; the adapters load exactly."""
    lora = dict(lora_rank=4, lora_alpha=8.0)
    old = LLMRLModule(
        observation_space=None,
        action_space=None,
        model_config=config(model_dtype="float32", **lora).llm_module_config(),
    )
    with torch.no_grad():
        for p in old.parameters():
            p.add_(torch.randn_like(p) * 1e-2)
    saved = old.get_state()
    assert {v.dtype for v in saved.values()} == {torch.float32}
    new = LLMRLModule(
        observation_space=None,
        action_space=None,
        model_config=config(model_dtype="bfloat16", **lora).llm_module_config(),
    )
    new.set_state(saved)
    restored = dict(new.named_parameters())
    for name, value in saved.items():
        if name not in restored:
            continue  # a buffer
        p = restored[name]
        want = value if p.requires_grad else value.to(torch.bfloat16)
        assert p.dtype == (torch.float32 if p.requires_grad else torch.bfloat16), name
        assert torch.equal(p.detach(), want), name


# ----- FSDP2: the MixedPrecisionPolicy over float32 shards ------------------------------
FSDP_SCRIPT = """
import json, ray, torch
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=4, include_dashboard=False)
algo = StarPOConfig.from_user_dict({
    "env": "ragen/FrozenLakeNoSlip-v0", "llm": "builtin", "env_groups": 2, "group_size": 4,
    "max_turns": 2, "max_new_tokens": 16, "minibatch_size": 8, "filter_keep_ratio": 1.0,
    "advantage_estimator": "gae", "lr": 1e-4, "seed": 3, "model_dtype": "bfloat16",
    "num_learners": 2, "learner_strategy": "fsdp",
}).build_algo()
def watch(learner):
    m = learner.module["default_policy"]
    m = m.unwrapped() if hasattr(m, "unwrapped") else m
    learner.seen = {}
    def hook(name):
        def record(_mod, args, out):
            learner.seen.setdefault(name, set()).add((str(args[0].dtype), str(out.dtype)))
        return record
    m.actor.model.layers[0].self_attn.q_proj.register_forward_hook(hook("actor linear"))
    m.critic.layers[0].self_attn.q_proj.register_forward_hook(hook("critic linear"))
    m.value_head.register_forward_hook(hook("value head"))
def report(learner):
    m = learner.module["default_policy"]
    m = m.unwrapped() if hasattr(m, "unwrapped") else m
    def policy(unit):
        p = unit._get_fsdp_state()._mp_policy
        return [str(p.param_dtype), str(p.reduce_dtype)]
    units = {"actor": m.actor, "actor layer": m.actor.model.layers[1],
             "critic": m.critic, "critic layer": m.critic.layers[2], "value head": m.value_head}
    params = list(m.parameters())
    moments = [v for o in learner._named_optimizers.values() for s in o.state.values()
               for k, v in s.items() if k.startswith("exp_avg")]
    return {
        "policies": {k: policy(u) for k, u in units.items()},
        "sharded": all(hasattr(p, "to_local") for p in params),
        "params": sorted({str(p.to_local().dtype) for p in params}),
        "grads": sorted({str(p.grad.to_local().dtype) for p in params if p.grad is not None}),
        "moments": sorted({str(v.to_local().dtype) for v in moments}),
        "num_moments": len(moments), "num_params": len(params),
        "seen": {k: sorted(map(list, v)) for k, v in learner.seen.items()},
    }
algo.learner_group.foreach_learner(watch)
algo.train()
out = [r.get() if hasattr(r, "get") else r for r in algo.learner_group.foreach_learner(report)]
pushed = algo.learner_group.get_state(
    components="learner/rl_module/default_policy", inference_only=True
)["learner"]["rl_module"]["default_policy"]
engine = algo.env_runner.engine.model.state_dict()
algo.stop()
print(json.dumps({
    "learners": out,
    "pushed": sorted({str(v.dtype) for v in pushed.values()}),
    "engine": sorted({str(v.dtype) for v in engine.values()}),
    "engine_equal": all(torch.equal(engine[k], v) for k, v in pushed.items()),
}))
"""


@pytest.mark.slow
def test_fsdp_gathers_bfloat16_over_float32_shards(tmp_path):
    """Two FSDP2 learners (gloo, CPU) with model_dtype bfloat16: every transformer unit
    has MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), the value
    head's gathers float32; the shards, their gradients and AdamW's moments are
    float32; layers compute in bfloat16; the engine receives bfloat16 weights."""
    out = run_script(FSDP_SCRIPT, tmp_path, timeout=900)
    assert len(out["learners"]) == 2
    bf16, fp32 = "torch.bfloat16", "torch.float32"
    for learner in out["learners"]:
        policies = learner["policies"]
        for unit in ("actor", "actor layer", "critic", "critic layer"):
            assert policies[unit] == [bf16, fp32], (unit, policies)
        assert policies["value head"] == ["None", fp32], policies
        assert learner["sharded"]
        assert learner["params"] == learner["grads"] == learner["moments"] == [fp32], learner
        assert learner["num_moments"] == 2 * learner["num_params"]
        seen = learner["seen"]
        assert seen["actor linear"] == seen["critic linear"] == [[bf16, bf16]], seen
        assert seen["value head"] == [[fp32, fp32]], seen
    assert out["pushed"] == out["engine"] == [bf16]
    assert out["engine_equal"]


def test_a_bfloat16_lora_module_exports_its_merge_in_float32(tmp_path):
    """The export merges the float32 adapters into the base in float32: the exported
    weight is base + (alpha / rank) * B @ A without a bfloat16 rounding of the sum."""
    from transformers import AutoModelForCausalLM

    from ragen_rllib.algorithms.starpo.export import export_module

    module = LLMRLModule(
        observation_space=None,
        action_space=None,
        model_config=config(
            model_dtype="bfloat16", lora_rank=4, lora_alpha=8.0
        ).llm_module_config(),
    )
    layer = module.lm.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_(std=1e-3)  # a small, trained-like update
    base = layer.base_layer.weight.detach().float()
    delta = 2.0 * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    want = base + delta.detach()
    export_module(module, tmp_path / "out")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    got = model.model.layers[0].self_attn.q_proj.weight.detach()
    assert torch.allclose(got, want, rtol=0, atol=1e-7)
    # A bfloat16 merge would have lost most of the update.
    assert not torch.allclose(want.to(torch.bfloat16).float(), want, rtol=0, atol=1e-5)
