"""Several learners (DDP, and FSDP2, over gloo on CPU) on multi-turn batches: whole
trajectories per learner, and the same step as one learner."""

from __future__ import annotations

import inspect

import pytest
from conftest import first_adamw_step_bound, run_script

pytestmark = pytest.mark.slow

SCRIPT = """
import json, os, numpy as np, ray, torch
from transformers import AutoModelForCausalLM
from ragen_rllib.models.resolve import resolve_model
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=4, include_dashboard=False)
def make(**over):
    return StarPOConfig.from_user_dict({
        "env": "ragen/FrozenLakeNoSlip-v0", "llm": "builtin", "env_groups": 2, "group_size": 4,
        "max_turns": 3, "max_new_tokens": 16, "minibatch_size": 8, "filter_keep_ratio": 1.0,
        "advantage_estimator": "gae", "lr": 1e-4, "seed": 3, "model_dtype": "float32", **over,
    }).build_algo()
def state(learner):
    m = learner.module["default_policy"]
    m = m.unwrapped() if hasattr(m, "unwrapped") else m
    grads = {k: v.grad for k, v in m.named_parameters() if v.grad is not None}
    if any(hasattr(g, "full_tensor") for g in grads.values()):
        grads = {k: g.full_tensor() for k, g in grads.items()}
    return (
        {k: v.numpy() for k, v in m.get_state().items()},
        {k: g.detach().cpu().numpy() for k, g in grads.items()},
    )
def states(algo, fn=state):
    out = algo.learner_group.foreach_learner(fn)
    return [o.get() if hasattr(o, "get") else o for o in out]
def flat(tree, prefix=""):
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flat(sub, f"{prefix}/{key}").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, sub in enumerate(tree) for k, v in flat(sub, f"{prefix}/{i}").items()}
    if isinstance(tree, torch.Tensor):
        return {prefix: tree.detach().cpu().float().numpy()}
    return {prefix: np.asarray(tree, dtype=float)} if isinstance(tree, (int, float)) else {}
def optimizer(learner):  # all learners call it; the first gathers every shard
    return flat(learner.get_state(components="optimizer")["optimizer"])
def run(save=None, **over):
    algo = make(**over)
    result = algo.train()
    turns = result["rollout"]["num_turns_mean"]
    out = states(algo)
    engine = {k: v.float().numpy().copy()
              for k, v in algo.env_runner.engine.model.state_dict().items()}
    opt = states(algo, optimizer)[0] if save else None
    if save:
        algo.save_to_path(os.path.abspath(save))
    algo.stop()
    learner = result["learners"]["default_policy"]
    run.blank_passes = learner.get("blank_passes", 0)
    run.logged = {k: float(learner[k]) for k in LOGGED if k in learner}
    return out, turns, engine, opt
LOGGED = ("policy_loss", "entropy", "value_loss", "kl_to_reference", "response_tokens", "ratio_max",
          "clip_frac", "approx_kl", "value_mean", "off_policy_kl", "rollout_mismatch_tokens",
          "is_weight_mean", "is_weight_max", "is_corrected_frac")
def logged_diff(a, b):
    # Relative, with an absolute floor: at the first step the policy loss and the
    # approximate KL are ~1e-7 (ratios of 1, whitened advantages summing to ~0).
    assert set(a) == set(b), (a, b)
    return max(abs(a[k] - b[k]) / (abs(a[k]) + 1e-2) for k in a)
def adam_excess(p0, g0, p, g):
    # How far each parameter ends beyond what AdamW's first step allows for its
    # gradient difference (first_adamw_step_bound, defined above this script).
    return float((np.abs(p - p0) - first_adamw_step_bound(g, g0, p0)).max())
def compare(ref, others):
    (p0, g0) = ref
    return {
        "param": max(max(float(np.abs(p0[k] - p[k]).max()) for k in p0) for p, _ in others),
        "param_beyond_adam_bound": max(
            max(adam_excess(p0[k], g0[k], p[k], g[k]) for k in g0) for p, g in others
        ),
        "grad": max(
            max(float(np.abs(g0[k] - g[k]).max() / (np.abs(g0[k]).max() + 1e-12)) for k in g0)
            for _, g in others
        ),
        "keys_equal": all(set(p0) == set(p) and set(g0) == set(g) for p, g in others),
    }
(one,), turns, _, _ = run(num_learners=0)
logged_one = run.logged
ddp, turns_ddp, _, _ = run(num_learners=2, max_tokens_per_microbatch=400)
logged_ddp = run.logged
fsdp, turns_fsdp, engine_fsdp, opt_saved = run(
    save="ckpt", num_learners=2, learner_strategy="fsdp", max_tokens_per_microbatch=400
)
logged_fsdp = run.logged
restored = make(num_learners=2, learner_strategy="fsdp", max_tokens_per_microbatch=400)
restored.restore_from_path(os.path.abspath("ckpt"))
after = states(restored)
opt_after = states(restored, optimizer)[0]
next_turns = restored.train()["rollout"]["num_turns_mean"]
restored.stop()
# Critic-free, one row per turn and one row per micro-batch: when the learners' shards
# have different row counts, one of them must add passes (loss x 0) to keep step. The
# first seed whose batch splits unevenly is used: 4 on the machines tried (it saves a
# run), the others of 3-12 after it should sampling there differ.
for seed in (4, 3, *range(5, 13)):
    per_turn = dict(advantage_estimator="grpo", context_window=0, max_tokens_per_microbatch=1,
                    seed=seed)
    grpo_fsdp, _, _, _ = run(num_learners=2, learner_strategy="fsdp", **per_turn)
    logged_grpo_fsdp = run.logged
    blank_passes = run.blank_passes
    if blank_passes > 0:
        break
(grpo_one,), _, _, _ = run(num_learners=0, **per_turn)
logged_grpo_one = run.logged
# The loss menu and the rollout correction with a bfloat16 engine (a real gap):
# the proximal log-probs, the gap's figures and the weights are the same on two.
menu = dict(policy_loss="cispo", rollout_correction="tis", rollout_correction_level="sequence",
            rollout_correction_cap=1.001, engine_dtype="bfloat16")
(menu_one,), _, _, _ = run(num_learners=0, **menu)
logged_menu_one = run.logged
menu_ddp, _, _, _ = run(num_learners=2, max_tokens_per_microbatch=400, **menu)
logged_menu_ddp = run.logged
start = AutoModelForCausalLM.from_pretrained(resolve_model("builtin"), dtype=torch.float32)
moved = max(
    float(np.abs(one[0]["actor." + k] - v.detach().numpy()).max())
    for k, v in start.named_parameters()
)
print(json.dumps({
    "learners": [len(ddp), len(fsdp)], "turns": [turns, turns_ddp, turns_fsdp], "moved": moved,
    "ddp": compare(one, ddp), "fsdp": compare(one, fsdp),
    "engine": max(
        float(np.abs(engine_fsdp[k] - fsdp[0][0]["actor." + k]).max())
        for k in engine_fsdp if "actor." + k in fsdp[0][0]
    ),
    "engine_keys": sum("actor." + k in fsdp[0][0] for k in engine_fsdp),
    "restored": max(
        max(float(np.abs(fsdp[0][0][k] - p[k]).max()) for k in p) for p, _ in after
    ),
    "next_turns": next_turns,
    "optimizer": {
        "keys": sorted(opt_saved) == sorted(opt_after) and len(opt_saved) > 10,
        "diff": max(float(np.abs(opt_saved[k] - opt_after[k]).max()) for k in opt_saved),
        "moments": sum(float(np.abs(v).sum()) for k, v in opt_saved.items() if "exp_avg" in k),
    },
    "grpo_fsdp": compare(grpo_one, grpo_fsdp), "blank_passes": blank_passes,
    "menu_ddp": compare(menu_one, menu_ddp),
    "logged": {"one": logged_one, "ddp": logged_ddp, "fsdp": logged_fsdp,
               "grpo_one": logged_grpo_one, "grpo_fsdp": logged_grpo_fsdp,
               "menu_one": logged_menu_one, "menu_ddp": logged_menu_ddp},
    "logged_diff": {"ddp": logged_diff(logged_one, logged_ddp),
                    "fsdp": logged_diff(logged_one, logged_fsdp),
                    "grpo_fsdp": logged_diff(logged_grpo_one, logged_grpo_fsdp),
                    "menu_ddp": logged_diff(logged_menu_one, logged_menu_ddp)},
}))
"""


def test_two_learners_take_the_step_of_one_on_a_multi_turn_batch(tmp_path):
    """num_learners=2 under DDP and under FSDP2 (gloo on CPU; each learner also in
    micro-batches) ends the first update where num_learners=0 does on the same
    sampled batch; FSDP's gathered weights reach the rollout engine, and its
    checkpoint restores onto two fresh FSDP learners, which train on."""
    out = run_script(inspect.getsource(first_adamw_step_bound) + SCRIPT, tmp_path, timeout=900)
    assert out["learners"] == [2, 2]
    assert out["turns"][0] == out["turns"][1] == out["turns"][2] > 1  # one multi-turn batch
    assert out["moved"] > 1e-5  # a real step (lr 1e-4)
    for strategy in ("ddp", "fsdp"):
        diff = out[strategy]
        assert diff["keys_equal"], strategy
        # The same gradient, relative to each tensor's largest entry...
        assert diff["grad"] <= 1e-4, (strategy, out)
        # ...so the same Adam step, up to its sensitivity to gradients near zero (a step
        # is lr * m / (sqrt(v) + eps), and fp32 sums in another order move tiny ones):
        # every entry within what its own gradient difference allows.
        assert diff["param_beyond_adam_bound"] <= 0.0, (strategy, out)
    # The engine holds exactly the weights the FSDP learners gathered after their step.
    assert out["engine_keys"] > 0 and out["engine"] == 0.0, out
    assert out["restored"] == 0.0  # each restored learner holds exactly the saved state
    assert out["optimizer"]["keys"] and out["optimizer"]["moments"] > 0, out["optimizer"]
    assert out["optimizer"]["diff"] == 0.0  # and exactly the saved AdamW moments
    assert out["next_turns"] > 0
    # Passes added to even out the FSDP learners' counts change nothing.
    assert out["blank_passes"] > 0, out
    assert out["grpo_fsdp"]["grad"] <= 1e-4, out
    assert out["grpo_fsdp"]["param_beyond_adam_bound"] <= 0.0, out
    # CISPO with sequence-level TIS against a bfloat16 engine: the same step on two.
    assert out["menu_ddp"]["grad"] <= 1e-4, out
    # Its parameters end within 1e-7 of that bound (about one float32 ulp of the
    # largest weights), not inside it as above: not yet isolated which rounding the
    # bound misses here.
    assert out["menu_ddp"]["param_beyond_adam_bound"] <= 1e-7, out
    assert out["logged"]["menu_one"]["is_corrected_frac"] > 0, out["logged"]["menu_one"]
    assert out["logged"]["menu_one"]["off_policy_kl"] > 0, out["logged"]["menu_one"]
    # The logged loss terms with two learners are the one-learner values (each learner
    # logs its share times the number of learners; RLlib averages the learners).
    logged = out["logged"]
    assert {"policy_loss", "entropy", "value_loss"} <= set(logged["one"]), logged
    # Maxima are maxima over the learners too (the mean of two learners' maxima is not
    # the one learner's maximum).
    assert "ratio_max" in logged["one"] and "is_weight_max" in logged["menu_one"], logged
    for pair, diff in out["logged_diff"].items():
        assert diff <= 1e-4, (pair, logged)
