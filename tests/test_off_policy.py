"""Off-policy training end to end: the engine-learner gap each update logs, the rollout
correction in a real update, DAPO's dynamic sampling and overlong handling, and the
per-token policy versions. The formulas themselves are checked against their
definitions in test_policy_losses.py."""

from __future__ import annotations

import pytest
from conftest import run_script

from ragen_rllib.connectors.sample_batch import OverlongPenalty
from ragen_rllib.learner.connectors import build_learner_pipeline
from ragen_rllib.records.trajectory import Trajectory

SCRIPT = """
import json, math, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
BASE = {"env": "ragen/FrozenLakeNoSlip-v0", "llm": "builtin", "env_groups": 4, "group_size": 4,
        "max_turns": 3, "max_new_tokens": 12, "minibatch_size": 16, "filter_keep_ratio": 1.0,
        "advantage_estimator": "grpo", "lr": 1e-4, "seed": 5, "model_dtype": "float32"}
def learner_logs(over, iterations=1, spy=False):
    algo = StarPOConfig.from_user_dict({**BASE, **over}).build_algo()
    trained = []
    if spy:  # what each update is handed
        real = algo.learner_group.update
        def update(**kwargs):
            trained.append(list(kwargs["episodes"]))
            return real(**kwargs)
        algo.learner_group.update = update
    for _ in range(iterations):
        result = algo.train()
    algo.stop()
    logs = {k: float(v) for k, v in result["learners"]["default_policy"].items()
            if isinstance(v, (int, float))}
    return logs, result, trained
out = {}
runs = {"fp32": {}, "bf16": {"engine_dtype": "bfloat16"},
        "bf16_rescored": {"engine_dtype": "bfloat16", "log_rollout_mismatch": True}}
for name, over in runs.items():
    logs, _, _ = learner_logs(over)
    out[name] = {k: logs.get(k) for k in ("rollout_mismatch_kl", "rollout_mismatch_max_abs",
                                          "rollout_mismatch_tokens", "token_lag_max")}
logs, result, _ = learner_logs({"engine_dtype": "bfloat16", "rollout_correction": "mis",
                                "rollout_correction_cap": 1.02, "overlong": "penalty",
                                "overlong_buffer": 6})
out["mis"] = {k: logs.get(k) for k in ("is_corrected_frac", "is_weight_max", "policy_loss")}
out["overlong"] = result["overlong"]
# 6 groups with spread asked of calls of 4 groups: at least one extra call each time.
logs, result, trained = learner_logs(
    {"dynamic_sampling_groups": 6, "dynamic_sampling_max_calls": 2}, iterations=2, spy=True)
groups = []
for batch in trained:
    by = {}
    for t in batch:
        by.setdefault(t.group, []).append([t.total_reward, t.success])
    groups.append({str(g): r for g, r in by.items()})
out["dynamic"] = {"groups": groups, "metrics": result["dynamic_sampling"],
                  "lifetime": result["counters"]["num_dynamic_sampling_calls_lifetime"]}
print(json.dumps(out, default=float))
"""


@pytest.mark.slow
def test_the_gap_correction_and_dynamic_sampling_in_real_runs(tmp_path):
    out = run_script(SCRIPT, tmp_path, timeout=600)
    fp32, bf16 = out["fp32"], out["bf16"]
    # float32 engine beside the float32 learner: the same numbers up to summation order.
    assert fp32["rollout_mismatch_tokens"] > 100 and fp32["token_lag_max"] == 0
    assert fp32["rollout_mismatch_kl"] < 1e-9 and fp32["rollout_mismatch_max_abs"] < 1e-4
    # bfloat16 weights in the engine: a real gap, orders of magnitude above.
    assert bf16["rollout_mismatch_kl"] > 1e-6 and bf16["rollout_mismatch_max_abs"] > 1e-3
    # Measured for free in the first minibatch (here the whole batch) or by scoring
    # the batch once more in the learner connector: the same figures.
    again = out["bf16_rescored"]
    assert again["rollout_mismatch_tokens"] == bf16["rollout_mismatch_tokens"]
    assert again["rollout_mismatch_kl"] == pytest.approx(bf16["rollout_mismatch_kl"], rel=1e-3)
    assert again["rollout_mismatch_max_abs"] == pytest.approx(
        bf16["rollout_mismatch_max_abs"], rel=1e-3
    )
    # MIS with a narrow band drops some tokens and keeps a finite loss.
    mis = out["mis"]
    assert 0 < mis["is_corrected_frac"] < 1 and mis["is_weight_max"] > 1.02, mis
    assert mis["policy_loss"] == mis["policy_loss"]  # not NaN
    assert 0 < out["overlong"]["penalised_turn_share"] <= 1  # 12-token answers, buffer 6
    assert out["overlong"]["penalty_mean"] < 0
    dynamic = out["dynamic"]
    assert len(dynamic["groups"]) == 2
    for batch in dynamic["groups"]:
        # Every group trained on has reward spread; at most 6 of them; some came from
        # an extra call (their ids start after the first call's 4).
        assert 0 < len(batch) <= 6, batch
        # DAPO's rule (the default): some of each group's trajectories succeeded, some not.
        assert all(len({s for _, s in group}) > 1 for group in batch.values()), batch
        assert max(int(g) for g in batch) >= 4, batch
    metrics = dynamic["metrics"]  # the last iteration's
    assert 1 <= metrics["extra_calls"] <= 2
    assert metrics["short"] == int(metrics["groups_with_spread"] < 6)
    assert len(dynamic["groups"][-1]) == min(6, metrics["groups_with_spread"])
    assert dynamic["lifetime"] >= 2  # both iterations needed a call


def test_the_overlong_penalty_follows_dapos_definition():
    """0 up to limit - buffer tokens, then linear down to -penalty at the limit."""
    piece = OverlongPenalty(limit=20, buffer=8, penalty=0.5)
    for tokens in range(0, 21):
        expected = 0.0 if tokens <= 12 else -0.5 * (tokens - 12) / 8
        assert piece.turn_penalty(tokens) == pytest.approx(expected), tokens
    trajectory = _trajectory([(5, False), (20, True)], rewards=[1.0, 0.0])
    piece(rl_module=None, batch={}, episodes=[trajectory])
    assert trajectory.turn_rewards == [1.0, -0.5]


def _trajectory(turns, rewards, versions=None) -> Trajectory:
    """A trajectory of one segment: a 3-token context, then each turn's answer of
    ``length`` tokens (``cut``: it hit the limit) and 2 tokens of observation."""
    t = Trajectory(env_id="x", seed=0, group=0, policy_version=4)
    t.append_context([1, 2, 3])
    for k, (length, cut) in enumerate(turns):
        version = None if versions is None else versions[k]
        t.append_generation([7] * length, [-0.5] * length, version, cut)
        t.append_context([8, 9])
    t.turn_rewards = list(rewards)
    t.turn_advantages = [1.0] * len(rewards)
    return t


def _config(**over):
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    return StarPOConfig.from_user_dict(
        {"env": "ragen/Bandit-v0", "advantage_estimator": "grpo", **over}
    )


@pytest.mark.parametrize("overlong", ["none", "mask"])
def test_overlong_mask_takes_cut_answers_out_of_the_loss_only(overlong):
    """The cut turn's tokens keep their advantages but leave the response mask."""
    t = _trajectory([(4, False), (6, True), (3, False)], rewards=[0.0, 0.0, 1.0])
    cols = build_learner_pipeline(_config(overlong=overlong))(rl_module={}, batch={}, episodes=[t])[
        "default_policy"
    ]
    mask = cols["response_mask"][0].tolist()
    cut = slice(3 + 4 + 2, 3 + 4 + 2 + 6)
    assert sum(mask) == (7 if overlong == "mask" else 13)
    assert all(m == (0 if overlong == "mask" else 1) for m in mask[cut])
    assert all(a == 1.0 for a in cols["advantages"][0][cut].tolist())
    assert "cut_mask" not in cols


def test_every_token_carries_the_version_that_generated_it():
    """Turns generated under versions 4 and 5 of a trajectory handed to the update of
    version 6: their tokens' lags are 2 and 1; context tokens carry -1."""
    t = _trajectory([(2, False), (3, False)], rewards=[0.0, 1.0], versions=[4, 5])
    seg = t.segments[0]
    assert seg.versions == [-1] * 3 + [4] * 2 + [-1] * 2 + [5] * 3 + [-1] * 2
    t.policy_lag = 2  # the buffer's stamp: learner version 6 minus the oldest, 4
    from ragen_rllib.learner.connectors import TrajectoriesToBatch

    cols = TrajectoriesToBatch()(rl_module={}, batch={}, episodes=[t])["default_policy"]
    lag = cols["token_lag"][0]
    response = cols["response_mask"][0] > 0
    assert lag[response].tolist() == [2, 2, 1, 1, 1]


PARTIAL = """
import json, ray, torch
from transformers import AutoModelForCausalLM
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
from ragen_rllib.distributed.mailbox import WeightMailbox
from ragen_rllib.distributed.wire import to_wire
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
from ragen_rllib.rl_module.scoring import response_logprobs
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
cfg = StarPOConfig.from_user_dict({
    "env": "ragen/FrozenLakeNoSlip-v0", "llm": "builtin", "env_groups": 2, "group_size": 3,
    "max_turns": 4, "max_new_tokens": 16, "minibatch_size": 6, "advantage_estimator": "grpo",
    "num_env_runners": 1, "async_rollouts": True, "partial_rollouts": True, "seed": 2,
    "model_dtype": "float32"})
runner = LLMEnvRunner(config=cfg, worker_index=1)
g = torch.Generator().manual_seed(0)
old = {k: v.detach().clone() for k, v in runner.engine.model.named_parameters()}
new = {k: v + 0.05 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
       for k, v in old.items()}
mailbox = WeightMailbox.remote()
runner.set_mailbox(mailbox)
# Version 1 is posted while version 0 samples: the runner finds it before turn 2.
ray.get(mailbox.post.remote(1, [ray.put({"rl_module": to_wire(new), "weights_seq_no": 1})]))
trajs = runner.sample()
def scorer(state):
    model = AutoModelForCausalLM.from_pretrained(runner._model_path, dtype=torch.float32)
    model.load_state_dict(state, strict=False)
    return model.eval()
models = {0: scorer(old), 1: scorer(new)}
gaps, turn_versions = {0: 0.0, 1: 0.0}, []
for t in trajs:
    seg = t.segments[0]
    versions = [seg.versions[start] for _, start, _ in t.turn_spans]
    turn_versions.append(versions)
    ids = torch.tensor([seg.input_ids])
    for version, model in models.items():
        mask = torch.tensor([[1.0 if v == version else 0.0 for v in seg.versions]])
        if mask.sum() == 0:
            continue
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": mask}
        with torch.no_grad():
            logp = response_logprobs(model, batch, cfg.temperature or 1.0)["logp"]
        gap = (logp - torch.tensor([seg.behaviour_logp]))[mask > 0].abs().max().item()
        gaps[version] = max(gaps[version], gap)
loaded = runner.metrics.peek("weights_loaded_mid_sample")
# The push of version 1 queued behind the sample is not loaded again...
junk = {k: torch.zeros_like(v) if v.is_floating_point() else v for k, v in new.items()}
runner.set_state({"rl_module": to_wire(junk), "weights_seq_no": 1})
engine = runner.engine.model.state_dict()
kept = max((engine[k] - v).abs().max().item() for k, v in new.items())
# ...and version 2 is.
runner.set_state({"rl_module": to_wire(old), "weights_seq_no": 2})
print(json.dumps({"turn_versions": turn_versions, "gaps": gaps, "loaded": loaded, "kept": kept,
                  "version": runner.engine.policy_version,
                  "start_versions": [t.policy_version for t in trajs]}))
"""


@pytest.mark.slow
def test_partial_rollouts_load_posted_weights_at_the_next_turn_boundary(tmp_path):
    """Weights posted while a sample runs are loaded before its second turn: turn 1's
    tokens carry version 0 and match the old weights' log-probs, later turns carry
    version 1 and match the new weights' (the prompt cache was re-encoded); the same
    weights queued behind the sample are not loaded a second time."""
    out = run_script(PARTIAL, tmp_path, timeout=300)
    multi = [v for v in out["turn_versions"] if len(v) > 1]
    assert multi, out  # some trajectory lasted past its first turn
    assert all(v[0] == 0 and set(v[1:]) == {1} for v in out["turn_versions"] if len(v) > 1)
    assert out["start_versions"] == [0] * len(out["turn_versions"])  # the oldest token's
    assert out["gaps"]["0"] < 1e-4 and out["gaps"]["1"] < 1e-4, out["gaps"]
    assert out["loaded"] == 1
    assert out["kept"] == 0.0  # still the posted weights, not the queued junk
    assert out["version"] == 2


def test_a_trajectory_pickled_before_the_new_fields_loads_with_their_defaults():
    """A checkpoint's buffered trajectories from before per-token versions and
    turn_cut existed: unpickled, they get the defaults and go through the batch."""
    import pickle

    t = _trajectory([(2, False)], rewards=[1.0])
    del t.__dict__["turn_cut"], t.segments[0].__dict__["versions"]
    old = pickle.loads(pickle.dumps(t))
    assert old.turn_cut == [] and old.segments[0].versions == []
    from ragen_rllib.learner.connectors import TrajectoriesToBatch

    cols = TrajectoriesToBatch()(rl_module={}, batch={}, episodes=[old])["default_policy"]
    assert cols["token_lag"].sum() == 0 and cols["cut_mask"].sum() == 0


def _group(group, rewards, successes):
    out = []
    for reward, success in zip(rewards, successes, strict=True):
        t = Trajectory(env_id="x", seed=0, group=group)
        t.turn_rewards, t.success = [reward], success
        out.append(t)
    return out


def test_dynamic_sampling_keeps_groups_by_success_spread_as_dapo_does():
    from ragen_rllib.algorithms.starpo.starpo import groups_with_spread

    batch = (
        _group(0, [1.0, 0.0, 1.0], [True, False, True])  # mixed outcome: kept
        + _group(1, [1.0, 0.95, 1.0], [True, True, True])  # only a length penalty differs
        + _group(2, [0.1 + 0.2, 0.3], [False, False])  # only float noise differs
        + _group(3, [float("nan"), float("nan")], [True, False])  # undefined advantages
        + _group(4, [0.0, float("inf")], [False, True])
    )
    kept, nonfinite = groups_with_spread(batch)
    assert [g[0].group for g in kept] == [0]
    assert nonfinite == 2
    # By reward: the penalty's 0.05 is a spread, float noise is not, non-finite never.
    kept, nonfinite = groups_with_spread(batch, "reward", reward_tol=1e-6)
    assert [g[0].group for g in kept] == [0, 1]
    assert nonfinite == 2
    kept, _ = groups_with_spread(batch, "reward", reward_tol=0.1)
    assert [g[0].group for g in kept] == [0]


def test_dynamic_sampling_spread_is_a_checked_knob():
    with pytest.raises(ValueError, match="dynamic_sampling_spread"):
        _config(dynamic_sampling_spread="accuracy").validate()
    with pytest.raises(ValueError, match="dynamic_sampling_reward_tol"):
        _config(dynamic_sampling_reward_tol=-1.0).validate()
