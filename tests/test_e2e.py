"""End to end: `rllib train file` as a subprocess, then restore from its checkpoint and go on."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import private_env, run_script, tiny_dict

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    storage = tmp / "results"
    overrides = {"llm": "builtin-raw", "env_groups": 4, "group_size": 4, "minibatch_size": 8}
    proc = subprocess.run(
        [
            sys.executable, "-m", "ragen_rllib.cli", "train", "file",
            str(ROOT / "tuned_examples" / "bandit_cpu.yaml"),
            "--stop", '{"training_iteration": 2}',
            "--config", json.dumps(overrides),
            "--storage-path", str(storage),
        ],
        cwd=tmp, env=private_env(tmp), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trial = next((storage / "bandit-cpu").glob("StarPO_*"))
    return tmp, trial, proc.stdout, proc.stderr


#: Third-party notices kept off the console (ragen_rllib/console.py says why).
SILENCED = (
    "on the new API stack", "Token authentication is enabled", "Install gputil",
    "Generated new authentication token",
    "Trainable.setup took", "Checkpoint successfully created at",
    "Wrote the latest version of all result files", "Started a local Ray instance",
    "Loading weights", "FutureWarning", "RLModuleConfig",
)  # fmt: skip


def test_the_console_holds_the_header_the_iterations_and_no_silenced_notice(trained):
    _, _, stdout, stderr = trained
    console = stdout + stderr
    assert [f for f in SILENCED if f in console] == []
    assert "== bandit-cpu: StarPO on ragen/Bandit-v0 ==" in stdout and "iter 2: success" in stdout


def test_train_file_writes_results_and_a_checkpoint(trained):
    _, trial, stdout, _ = trained
    rows = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == [1, 2]
    for row in rows:
        assert row["rollout"]["num_trajectories"] == 16
        assert 0.0 <= row["rollout"]["success_rate"] <= 1.0
        assert "policy_loss" in row["learners"]["default_policy"]
    assert list(trial.glob("events.out.tfevents.*"))
    assert (trial / "checkpoint_000000").is_dir()
    assert "iter 2: success" in stdout


def test_restore_and_continue_training(trained):
    tmp, trial, _, _ = trained
    script = f"""
import json, ray, torch
from ragen_rllib.algorithms.starpo.starpo import StarPO
ray.init(num_cpus=2, include_dashboard=False)
algo = StarPO.from_checkpoint({str(trial / "checkpoint_000000")!r})
learner = algo.learner_group._learner.module["default_policy"]
engine = algo.env_runner.engine.model.state_dict()
same = all(torch.equal(v, engine[k]) for k, v in learner.actor_weights().items())
before = algo.training_iteration
result = algo.train()
print(json.dumps({{"before": before, "after": result["training_iteration"], "same": same}}))
"""
    out = run_script(script, tmp)
    assert out == {"before": 2, "after": 3, "same": True}


def test_evaluate_command_prints_success_and_keeps_the_trajectories(trained):
    import pyarrow.parquet as pq

    tmp, trial, _, _ = trained
    kept = tmp / "eval" / "trajectories.parquet"
    proc = subprocess.run(
        [
            sys.executable, "-m", "ragen_rllib.cli", "evaluate",
            str(trial / "checkpoint_000000"), "--num-states", "8", "--trajectories", str(kept),
        ],
        cwd=tmp, env=private_env(tmp), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ragen/Bandit-v0: success " in proc.stdout
    # The checkpoint's own eval_samples_per_state (the example sets 4).
    assert "(8 fixed initial states x 4 answer(s))" in proc.stdout
    # Progress on stderr before the long part, then the kept trajectories.
    progress = [x for x in proc.stderr.splitlines() if x.startswith("rllib evaluate:")]
    assert "loading" in progress[0] and "evaluating 8 states x 4 answer(s)" in progress[1]
    table = pq.read_table(kept)
    assert "32 trajectories" in proc.stderr and table.num_rows == 32  # Bandit: one turn each
    rows = table.to_pylist()
    assert {r["seed"] for r in rows} == set(
        range(min(r["seed"] for r in rows), 8 + min(r["seed"] for r in rows))
    )
    success = sum(r["success"] for r in rows) / len(rows)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("ragen/Bandit-v0: success"))
    assert f"{success:.2%}" in line


def test_evaluate_command_runs_a_suite_with_pass_at_k(trained):
    tmp, trial, _, _ = trained
    out = tmp / "bandit_suite.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "ragen_rllib.cli", "evaluate",
            str(trial / "checkpoint_000000"), "--num-states", "4", "--suite", "bandit",
            "--samples-per-state", "4", "--pass-k", "1", "2", "4", "--output", str(out),
        ],
        cwd=tmp, env=private_env(tmp), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results) == {"bandit"}
    assert set(results["bandit"]) == {"train", "held_out", "rev"}
    for metrics in results["bandit"].values():
        assert metrics["num_trajectories"] == 16
        assert metrics["pass@1"] == pytest.approx(metrics["success_rate"])
        assert metrics["pass@1"] <= metrics["pass@2"] <= metrics["pass@4"]
    assert "bandit/rev: success" in proc.stdout
    # k above the samples per state is refused with the key named.
    bad = subprocess.run(
        [
            sys.executable, "-m", "ragen_rllib.cli", "evaluate",
            str(trial / "checkpoint_000000"), "--num-states", "2", "--pass-k", "8",
        ],
        cwd=tmp, env=private_env(tmp), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert "eval_pass_k" in bad.stderr and "Traceback" not in bad.stderr


def test_grid_search_sweep_runs_one_trial_per_point(tmp_path):
    storage = tmp_path / "results"
    exp = tmp_path / "sweep.yaml"
    config = tiny_dict()
    env = config.pop("env")
    exp.write_text(
        "sweep:\n"
        "  run: StarPO\n"
        f"  env: {env}\n"
        "  stop: {training_iteration: 1}\n"
        "  checkpoint_config: {checkpoint_at_end: false}\n"
        "  config:\n"
        + "".join(f"    {k}: {json.dumps(v)}\n" for k, v in config.items())
        + "    lr: {grid_search: [1.0e-5, 1.0e-4]}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "ragen_rllib.cli", "train", "file", str(exp),
         "--storage-path", str(storage)],
        cwd=tmp_path, env=private_env(tmp_path), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trials = sorted((storage / "sweep").glob("StarPO_*"))
    assert len(trials) == 2
    lrs = []
    for trial in trials:
        rows = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
        assert [r["training_iteration"] for r in rows] == [1]
        assert rows[0]["rollout"]["num_trajectories"] == 4
        lrs.append(rows[0]["learners"]["default_policy"]["actor_learning_rate"])
    assert sorted(lrs) == [1e-5, 1e-4]


def test_online_k_reuses_each_rollout_batch_k_times(tmp_path):
    script = """
import json, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False)
config = StarPOConfig.from_user_dict(CONFIG)
algo = config.build_algo()
rows = []
for _ in range(3):
    result = algo.train()
    rows.append([algo._num_sample_calls, result["rollout"]["batch_uses"]])
print(json.dumps(rows))
"""
    rows = run_script(script, tmp_path, define={"CONFIG": tiny_dict(online_k=2)})
    # Iterations 1 and 2 train on the first rollout batch, iteration 3 on a fresh one.
    assert rows == [[1, 1], [1, 2], [2, 1]]


def test_critic_estimators_train_through_the_learner(tmp_path):
    base = tiny_dict(env="ragen/FrozenLakeNoSlip-v0", max_turns=3)
    script = """
import json, math, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False)
out = {}
for estimator, level in (("gae", "trajectory"), ("gae", "turn"), ("bilevel_gae", "turn")):
    config = StarPOConfig.from_user_dict(
        {**BASE, "advantage_estimator": estimator, "reward_level": level}
    )
    algo = config.build_algo()
    learner = algo.train()["learners"]["default_policy"]
    out[f"{estimator}/{level}"] = {
        k: learner[k] for k in ("value_loss", "policy_loss", "critic_learning_rate",
                                "gradients_critic_global_norm")
    }
    algo.stop()
print(json.dumps(out))
"""
    out = run_script(script, tmp_path, define={"BASE": base})
    assert set(out) == {"gae/trajectory", "gae/turn", "bilevel_gae/turn"}
    for name, stats in out.items():
        assert stats["critic_learning_rate"] == 1e-5, name
        assert stats["value_loss"] > 0 and math.isfinite(stats["policy_loss"]), name
        assert stats["gradients_critic_global_norm"] > 0, name


def test_evaluate_names_a_truncated_checkpoint_file(trained, tmp_path):
    _, trial, _, _ = trained
    ckpt = tmp_path / "checkpoint_000000"
    shutil.copytree(trial / "checkpoint_000000", ckpt)
    state = next(p for p in sorted(ckpt.rglob("*.pkl")) if p.stat().st_size > 100)
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    proc = subprocess.run(
        [sys.executable, "-m", "ragen_rllib.cli", "evaluate", str(ckpt), "--num-states", "4"],
        cwd=tmp_path, env=private_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"checkpoint file {str(state)!r} is truncated" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_critic_free_estimators_train_through_the_learner(tmp_path):
    """Every critic-free estimator runs an iteration end to end: the sample stage
    gives each turn its advantage, and the learner takes a finite, non-zero step."""
    base = tiny_dict(
        env="ragen/FrozenLakeNoSlip-v0", llm="builtin", group_size=4, max_turns=3,
        minibatch_size=8, seed=1, prompt_style="compact", context_window=0,
        env_config={"instructions": "compact", "max_actions_per_turn": 1},
    )  # fmt: skip
    script = """
import json, math, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False)
out = {}
for estimator in ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gigpo"):
    config = StarPOConfig.from_user_dict({**BASE, "advantage_estimator": estimator})
    algo = config.build_algo()
    learner = algo.train()["learners"]["default_policy"]
    out[estimator] = {k: learner[k] for k in ("policy_loss", "gradients_actor_global_norm")}
    algo.stop()
print(json.dumps(out))
"""
    out = run_script(script, tmp_path, define={"BASE": base})
    assert len(out) == 6
    for name, stats in out.items():
        assert math.isfinite(stats["policy_loss"]), name
        assert stats["gradients_actor_global_norm"] > 0, name


def test_kl_to_the_reference_starts_at_zero_and_grows(tmp_path):
    """kl_coeff > 0 loads the frozen reference model; at the first update the policy
    is the reference (KL 0), and the KL grows as the policy moves away."""
    config = tiny_dict(
        llm="builtin", env_groups=4, group_size=4, max_new_tokens=24, minibatch_size=16,
        kl_coeff=0.1, lr=3e-4, seed=2, prompt_style="compact",
        env_config={"instructions": "compact"},
    )  # fmt: skip
    # lr 3e-4: steps small enough for the KL to grow at every update (at 3e-3 the first
    # step alone took it to ~4.8, and the KL penalty then pulled it back).
    script = """
import json, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False)
config = StarPOConfig.from_user_dict(CONFIG)
algo = config.build_algo()
has_reference = algo.learner_group._learner._reference is not None
kls = [algo.train()["learners"]["default_policy"]["kl_to_reference"] for _ in range(4)]
algo.stop()
print(json.dumps({"reference": has_reference, "kl": kls}))
"""
    out = run_script(script, tmp_path, define={"CONFIG": config})
    assert out["reference"]
    kl = out["kl"]
    assert abs(kl[0]) < 1e-6, kl  # the first update starts from the reference itself
    assert kl[-1] > 1e-4 and kl[3] > kl[2] > kl[1] > kl[0], kl
