"""What a run keeps and reports: lifetime counters across a restore, the runner's timing,
non-finite updates skipped and counted, and minibatches that never repeat a trajectory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from ragen_rllib.learner import TrajectoryMinibatches


def _batch(rows: int) -> MultiAgentBatch:
    ids = torch.arange(rows)[:, None].repeat(1, 3)  # [B, T]: row i holds i
    return MultiAgentBatch({"default_policy": SampleBatch({"input_ids": ids})}, env_steps=rows)


def _rows_seen(minibatches) -> list[list[int]]:
    return [mb.policy_batches["default_policy"]["input_ids"][:, 0].tolist() for mb in minibatches]


def test_minibatches_cover_each_trajectory_once_per_epoch():
    seen = _rows_seen(
        TrajectoryMinibatches(_batch(5), minibatch_size=2, num_epochs=2, shuffle=False, seed=0)
    )
    assert seen == [[0, 1], [2, 3], [4], [0, 1], [2, 3], [4]]  # the last one is smaller


def test_shuffled_minibatches_are_a_seeded_permutation_per_epoch():
    def run(seed):
        batches = _batch(7)
        return _rows_seen(
            TrajectoryMinibatches(batches, minibatch_size=3, num_epochs=2, shuffle=True, seed=seed)
        )

    first = run(11)
    assert first == run(11)  # reproducible, e.g. after a restore
    assert first != run(12)
    assert [len(mb) for mb in first] == [3, 3, 1, 3, 3, 1]
    for epoch in (first[:3], first[3:]):
        assert sorted(np.concatenate(epoch).tolist()) == list(range(7))


def test_no_minibatch_size_means_one_minibatch_per_epoch():
    it = TrajectoryMinibatches(_batch(4), minibatch_size=None, num_epochs=1, shuffle=False, seed=0)
    assert _rows_seen(it) == [[0, 1, 2, 3]]


# ----- through the algorithm (Ray) ---------------------------------------------------
def _run_script(script: str, tmp: Path) -> dict:
    env = {**os.environ, "HOME": str(tmp / "home"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp, env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CONFIG = """{
    "env": "ragen/FrozenLakeNoSlip-v0", "llm": "builtin-raw", "env_groups": 2,
    "group_size": 3, "max_turns": 2, "max_new_tokens": 8, "minibatch_size": 4,
    "filter_keep_ratio": 1.0, "advantage_estimator": "grpo", "seed": 5,
}"""


@pytest.mark.slow
def test_lifetime_counters_after_three_iterations_and_after_a_restore(tmp_path):
    script = f"""
import json, ray
from ragen_rllib.algorithm import StarPO
from ragen_rllib.config import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False)
algo = StarPOConfig.from_user_dict({CONFIG}).build_algo()
rows, totals = [], {{"turns": 0, "tokens": 0}}
for _ in range(3):
    r = algo.train()
    rows.append({{"counters": r["counters"], "env_steps": r["num_env_steps_sampled_lifetime"],
                 "runner": r["env_runners"], "turns_mean": r["rollout"]["num_turns_mean"],
                 "tokens_mean": r["rollout"]["response_length_mean"]}})
path = algo.save_to_path({str(tmp_path / "ckpt")!r})
algo.stop()
algo = StarPO.from_checkpoint(path)
r = algo.train()
after = {{"counters": r["counters"], "env_steps": r["num_env_steps_sampled_lifetime"]}}
print(json.dumps({{"rows": rows, "after": after}}, default=float))
"""
    out = _run_script(script, tmp_path)
    turns = tokens = 0
    for i, row in enumerate(out["rows"], start=1):
        counters = row["counters"]
        assert counters["num_trajectories_lifetime"] == 6 * i
        new_tokens = round(row["tokens_mean"] * row["turns_mean"] * 6)
        turns += round(row["turns_mean"] * 6)
        tokens += new_tokens
        assert counters["num_turns_lifetime"] == turns == row["env_steps"]
        assert counters["num_generated_tokens_lifetime"] == pytest.approx(tokens, abs=1)
        assert counters["num_env_errors_lifetime"] == 0
        runner = row["runner"]  # this iteration's sampling, from the env runner
        assert runner["generated_tokens"] == pytest.approx(new_tokens, abs=1)
        assert runner["rollout_time_s"] > 0 and runner["generated_tokens_per_s"] > 0
    after = out["after"]["counters"]
    assert after["num_trajectories_lifetime"] == 24  # 3 x 6 before the restore, 6 after
    assert after["num_turns_lifetime"] > turns and out["after"]["env_steps"] > turns


@pytest.mark.slow
def test_non_finite_updates_are_skipped_counted_and_stop_the_run(tmp_path):
    script = f"""
import json, ray, torch
from ragen_rllib.config import StarPOConfig
from ragen_rllib.learner import StarPOTorchLearner
ray.init(num_cpus=2, include_dashboard=False)
poison = {{"on": False}}
original = StarPOTorchLearner.compute_loss_for_module
def loss(self, **kwargs):
    value = original(self, **kwargs)
    return value * float("nan") if poison["on"] else value
StarPOTorchLearner.compute_loss_for_module = loss
cfg = {{**{CONFIG}, "minibatch_size": 6, "max_nonfinite_updates": 2}}
algo = StarPOConfig.from_user_dict(cfg).build_algo()
module = algo.learner_group._learner.module["default_policy"]
def weights():
    return torch.cat([p.detach().flatten().clone() for p in module.actor.parameters()])
out = {{}}
r = algo.train()
out["healthy_skipped"] = r["learners"]["default_policy"]["skipped_nonfinite"]
poison["on"] = True
before = weights()
r = algo.train()
out["poisoned_skipped"] = r["learners"]["default_policy"]["skipped_nonfinite"]
out["weights_unchanged"] = bool(torch.equal(before, weights()))
try:
    algo.train()
    out["error"] = None
except Exception as err:
    out["error"] = str(err)
out["still_unchanged"] = bool(torch.equal(before, weights()))
print(json.dumps(out, default=float))
"""
    out = _run_script(script, tmp_path)
    assert out["healthy_skipped"] == 0
    assert out["poisoned_skipped"] == 1 and out["weights_unchanged"]
    assert out["error"] is not None and "2 updates in a row" in out["error"]
    assert "max_nonfinite_updates=2" in out["error"] and out["still_unchanged"]
