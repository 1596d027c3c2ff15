"""Several learners (DDP over gloo on CPU) on multi-turn batches: whole trajectories
per learner, and the same step as one learner."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """
import json, numpy as np, ray, torch
from transformers import AutoModelForCausalLM
from ragen_rllib.builtin_model import resolve_model
from ragen_rllib.config import StarPOConfig
ray.init(num_cpus=4, include_dashboard=False)
def run(**over):
    cfg = StarPOConfig.from_user_dict({
        "env": "ragen/FrozenLakeNoSlip-v0", "llm": "builtin", "env_groups": 2, "group_size": 4,
        "max_turns": 3, "max_new_tokens": 16, "minibatch_size": 8, "filter_keep_ratio": 1.0,
        "advantage_estimator": "gae", "lr": 1e-4, "seed": 3, **over,
    })
    algo = cfg.build_algo()
    turns = algo.train()["rollout"]["num_turns_mean"]
    def params(learner):
        m = learner.module["default_policy"]
        m = m.unwrapped() if hasattr(m, "unwrapped") else m
        return (
            {k: v.detach().cpu().numpy() for k, v in m.named_parameters()},
            {k: v.grad.detach().cpu().numpy() for k, v in m.named_parameters()},
        )
    out = algo.learner_group.foreach_learner(params)
    out = [o.get() if hasattr(o, "get") else o for o in out]
    algo.stop()
    return out, turns
((one, one_grad),), turns = run(num_learners=0)
two, turns2 = run(num_learners=2, max_tokens_per_microbatch=400)
start = AutoModelForCausalLM.from_pretrained(resolve_model("builtin"), dtype=torch.float32)
moved = max(
    float(np.abs(one["actor." + k] - v.detach().numpy()).max())
    for k, v in start.named_parameters()
)
print(json.dumps({
    "learners": len(two), "turns": [turns, turns2], "moved": moved,
    "keys_equal": all(set(one) == set(b) for b, _ in two),
    "param_diffs": [max(float(np.abs(one[k] - b[k]).max()) for k in one) for b, _ in two],
    "grad_diffs": [
        max(float(np.abs(one_grad[k] - g[k]).max() / (np.abs(one_grad[k]).max() + 1e-12))
            for k in one_grad)
        for _, g in two
    ],
}))
"""


def test_two_learners_take_the_step_of_one_on_a_multi_turn_batch(tmp_path):
    """num_learners=2 (each learner in micro-batches too) ends the first update with
    the parameters num_learners=0 reaches on the same sampled batch."""
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["learners"] == 2 and out["keys_equal"]
    assert out["turns"][0] == out["turns"][1] > 1  # the same multi-turn batch
    assert out["moved"] > 1e-5  # a real step (lr 1e-4)
    # The same gradient, relative to each tensor's largest entry...
    assert max(out["grad_diffs"]) <= 1e-4, out
    # ...so the same Adam step, up to its sensitivity to gradients near zero (a step is
    # lr * m / (sqrt(v) + eps), and fp32 sums in another order move tiny gradients).
    assert max(out["param_diffs"]) <= 0.05 * 1e-4, out
