"""What a run keeps and reports: lifetime counters across a restore, the runner's timing,
non-finite updates skipped and counted, and minibatches that never repeat a trajectory."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import run_script, tiny_dict
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from ragen_rllib.learner.minibatches import TrajectoryMinibatches
from ragen_rllib.maths.batching import num_minibatches


def _batch(rows: int) -> MultiAgentBatch:
    ids = torch.arange(rows)[:, None].repeat(1, 3)  # [B, T]: row i holds i
    owner = torch.arange(rows)  # one row per trajectory
    cols = {"input_ids": ids, "row_trajectory": owner}
    return MultiAgentBatch({"default_policy": SampleBatch(cols)}, env_steps=rows)


def _minibatches(rows: int, minibatch_size, **kw) -> TrajectoryMinibatches:
    steps = num_minibatches([rows], minibatch_size)
    return TrajectoryMinibatches(_batch(rows), num_minibatches=steps, **kw)


def _rows_seen(minibatches) -> list[list[int]]:
    return [mb.policy_batches["default_policy"]["input_ids"][:, 0].tolist() for mb in minibatches]


def test_minibatches_cover_each_trajectory_once_per_epoch():
    seen = _rows_seen(_minibatches(5, 2, num_epochs=2, shuffle=False, seed=0))
    # ceil(5 / 2) = 3 minibatches per epoch, sizes as equal as possible.
    assert seen == [[0, 1], [2, 3], [4], [0, 1], [2, 3], [4]]


def test_shuffled_minibatches_are_a_seeded_permutation_per_epoch():
    def run(seed):
        return _rows_seen(_minibatches(7, 3, num_epochs=2, shuffle=True, seed=seed))

    first = run(11)
    assert first == run(11)  # reproducible, e.g. after a restore
    assert first != run(12)
    assert [len(mb) for mb in first] == [3, 2, 2, 3, 2, 2]  # ceil(7 / 3) = 3, balanced
    for epoch in (first[:3], first[3:]):
        assert sorted(np.concatenate(epoch).tolist()) == list(range(7))


def test_no_minibatch_size_means_one_minibatch_per_epoch():
    it = _minibatches(4, None, num_epochs=1, shuffle=False, seed=0)
    assert _rows_seen(it) == [[0, 1, 2, 3]]


# ----- through the algorithm (Ray) ---------------------------------------------------
CONFIG = repr(
    tiny_dict(env="ragen/FrozenLakeNoSlip-v0", group_size=3, max_turns=2, max_new_tokens=8, seed=5)
)


@pytest.mark.slow
def test_lifetime_counters_after_three_iterations_and_after_a_restore(tmp_path):
    """RAE's estimator, so that its running baselines are part of what is restored."""
    script = f"""
import json, ray
from ragen_rllib.algorithms.starpo.starpo import StarPO
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False)
algo = StarPOConfig.from_user_dict({{**{CONFIG}, "advantage_estimator": "rae"}}).build_algo()
rows, totals = [], {{"turns": 0, "tokens": 0}}
for _ in range(3):
    r = algo.train()
    rows.append({{"counters": r["counters"], "env_steps": r["num_env_steps_sampled_lifetime"],
                 "runner": r["env_runners"], "turns_mean": r["rollout"]["num_turns_mean"],
                 "tokens_mean": r["rollout"]["response_length_mean"]}})
path = algo.save_to_path({str(tmp_path / "ckpt")!r})
saved = algo._sample_stage.get_state()
algo.stop()
algo = StarPO.from_checkpoint(path)
restored = algo._sample_stage.get_state()
r = algo.train()
after = {{"counters": r["counters"], "env_steps": r["num_env_steps_sampled_lifetime"]}}
print(json.dumps({{"rows": rows, "after": after, "saved": saved, "restored": restored}},
                 default=float))
"""
    out = run_script(script, tmp_path, timeout=900)
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
    baselines = out["saved"]["GroupAdvantages"]["role_baselines"]
    assert len(baselines) == 1, baselines  # one env, no seats
    assert out["restored"] == out["saved"]  # RAE's baselines came back
    after = out["after"]["counters"]
    assert after["num_trajectories_lifetime"] == 24  # 3 x 6 before the restore, 6 after
    assert after["num_turns_lifetime"] > turns and out["after"]["env_steps"] > turns


@pytest.mark.slow
def test_non_finite_updates_are_skipped_counted_and_stop_the_run(tmp_path):
    script = f"""
import json, ray, torch
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
from ragen_rllib.learner.starpo_learner import StarPOTorchLearner
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
    out = run_script(script, tmp_path, timeout=900)
    assert out["healthy_skipped"] == 0
    assert out["poisoned_skipped"] == 1 and out["weights_unchanged"]
    assert out["error"] is not None and "2 updates in a row" in out["error"]
    assert "max_nonfinite_updates=2" in out["error"] and out["still_unchanged"]


@pytest.mark.slow
def test_a_batch_without_advantage_takes_no_step_when_asked(tmp_path):
    """skip_zero_advantage_updates: the untrained model's answers all fail to parse,
    so every trajectory scores the format penalty alike and every GRPO advantage is
    0. Skipping leaves the weights as they were and counts the batch; without it the
    entropy bonus alone still moves them (the step the option exists to avoid)."""
    script = f"""
import json, ray, torch
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(address="local", num_cpus=2, include_dashboard=False)
out = {{}}
for skip in (True, False):
    cfg = {{**{CONFIG}, "skip_zero_advantage_updates": skip}}
    algo = StarPOConfig.from_user_dict(cfg).build_algo()
    module = algo.learner_group._learner.module["default_policy"]
    before = torch.cat([p.detach().flatten().clone() for p in module.actor.parameters()])
    r = algo.train()
    after = torch.cat([p.detach().flatten() for p in module.actor.parameters()])
    out[str(skip)] = {{
        "std": r["rollout"]["in_group_reward_std"],
        "valid": r["rollout"]["env/action_is_valid"],
        "skipped": r["rollout"].get("zero_advantage_batches", 0),
        "changed": not bool(torch.equal(before, after)),
        "learner_ran": "default_policy" in (r.get("learners") or {{}}),
    }}
    algo.stop()
print(json.dumps(out, default=float))
"""
    out = run_script(script, tmp_path, timeout=900)
    for run in out.values():  # the precondition: no answer parsed, no reward spread
        assert run["valid"] == 0 and run["std"] == 0
    assert out["True"]["skipped"] == 1 and not out["True"]["changed"]
    assert not out["True"]["learner_ran"]
    assert out["False"]["skipped"] == 0 and out["False"]["changed"] and out["False"]["learner_ran"]
