"""Several learners (DDP, and FSDP2, over gloo on CPU) on multi-turn batches: whole
trajectories per learner, and the same step as one learner."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """
import json, os, numpy as np, ray, torch
from transformers import AutoModelForCausalLM
from ragen_rllib.builtin_model import resolve_model
from ragen_rllib.config import StarPOConfig
ray.init(num_cpus=4, include_dashboard=False)
def make(**over):
    return StarPOConfig.from_user_dict({
        "env": "ragen/FrozenLakeNoSlip-v0", "llm": "builtin", "env_groups": 2, "group_size": 4,
        "max_turns": 3, "max_new_tokens": 16, "minibatch_size": 8, "filter_keep_ratio": 1.0,
        "advantage_estimator": "gae", "lr": 1e-4, "seed": 3, **over,
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
def states(algo):
    out = algo.learner_group.foreach_learner(state)
    return [o.get() if hasattr(o, "get") else o for o in out]
def run(save=None, **over):
    algo = make(**over)
    turns = algo.train()["rollout"]["num_turns_mean"]
    out = states(algo)
    engine = {k: v.numpy().copy() for k, v in algo.env_runner.engine.model.state_dict().items()}
    if save:
        algo.save_to_path(os.path.abspath(save))
    algo.stop()
    return out, turns, engine
def compare(ref, others):
    (p0, g0) = ref
    return {
        "param": max(max(float(np.abs(p0[k] - p[k]).max()) for k in p0) for p, _ in others),
        "grad": max(
            max(float(np.abs(g0[k] - g[k]).max() / (np.abs(g0[k]).max() + 1e-12)) for k in g0)
            for _, g in others
        ),
        "keys_equal": all(set(p0) == set(p) and set(g0) == set(g) for p, g in others),
    }
(one,), turns, engine_one = run(num_learners=0)
ddp, turns_ddp, _ = run(num_learners=2, max_tokens_per_microbatch=400)
fsdp, turns_fsdp, engine_fsdp = run(
    save="ckpt", num_learners=2, learner_strategy="fsdp", max_tokens_per_microbatch=400
)
restored = make(num_learners=2, learner_strategy="fsdp", max_tokens_per_microbatch=400)
restored.restore_from_path(os.path.abspath("ckpt"))
after = states(restored)
next_turns = restored.train()["rollout"]["num_turns_mean"]
restored.stop()
start = AutoModelForCausalLM.from_pretrained(resolve_model("builtin"), dtype=torch.float32)
moved = max(
    float(np.abs(one[0]["actor." + k] - v.detach().numpy()).max())
    for k, v in start.named_parameters()
)
print(json.dumps({
    "learners": [len(ddp), len(fsdp)], "turns": [turns, turns_ddp, turns_fsdp], "moved": moved,
    "ddp": compare(one, ddp), "fsdp": compare(one, fsdp),
    "engine": max(float(np.abs(engine_one[k] - engine_fsdp[k]).max()) for k in engine_one),
    "restored": max(
        max(float(np.abs(fsdp[0][0][k] - p[k]).max()) for k in p) for p, _ in after
    ),
    "next_turns": next_turns,
}))
"""


def test_two_learners_take_the_step_of_one_on_a_multi_turn_batch(tmp_path):
    """num_learners=2 under DDP and under FSDP2 (gloo on CPU; each learner also in
    micro-batches) ends the first update where num_learners=0 does on the same
    sampled batch; FSDP's gathered weights reach the rollout engine, and its
    checkpoint restores onto two fresh FSDP learners, which train on."""
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["learners"] == [2, 2]
    assert out["turns"][0] == out["turns"][1] == out["turns"][2] > 1  # one multi-turn batch
    assert out["moved"] > 1e-5  # a real step (lr 1e-4)
    for strategy in ("ddp", "fsdp"):
        diff = out[strategy]
        assert diff["keys_equal"], strategy
        # The same gradient, relative to each tensor's largest entry...
        assert diff["grad"] <= 1e-4, (strategy, out)
        # ...so the same Adam step, up to its sensitivity to gradients near zero (a step
        # is lr * m / (sqrt(v) + eps), and fp32 sums in another order move tiny ones).
        assert diff["param"] <= 0.05 * 1e-4, (strategy, out)
    assert out["engine"] <= 0.05 * 1e-4  # the engine holds the gathered FSDP weights
    assert out["restored"] == 0.0  # each restored learner holds exactly the saved state
    assert out["next_turns"] > 0
