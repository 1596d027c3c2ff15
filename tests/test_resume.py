"""Resume: a `rllib train file` run killed with SIGKILL goes on with `--resume` and
repeats, iteration for iteration, what an uninterrupted run with the same seed does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import private_env, tiny_dict

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

CONFIG = tiny_dict(
    env="ragen/FrozenLakeNoSlip-v0", env_groups=3, max_turns=2, max_new_tokens=8,
    shuffle_batch_per_epoch=True, advantage_estimator="gae", lr=1.0e-3, critic_lr=1.0e-3,
    seed=3,
)  # fmt: skip
# The same with a mixture of three envs, one group each: Sokoban, FrozenLakeNoSlip (in
# compact prompts) and Countdown (one attempt: one turn).
MIXED = ("SimpleSokoban", "FrozenLakeNoSlip", "Countdown")
MIX = {k: v for k, v in CONFIG.items() if k not in ("env", "env_groups")} | {
    "env_mix": [
        {"env": "ragen/SimpleSokoban-v0", "groups": 1},
        {"env": "ragen/FrozenLakeNoSlip-v0", "groups": 1, "prompt_style": "compact"},
        {"env": "ragen/Countdown-v0", "groups": 1, "max_turns": 1},
    ]
}
EXPERIMENTS = {
    "one env": f"""
resume-test:
  run: StarPO
  env: {CONFIG["env"]}
  stop: {{training_iteration: 5}}
  checkpoint_config: {{checkpoint_frequency: 1, checkpoint_at_end: true}}
  config: {json.dumps({k: v for k, v in CONFIG.items() if k != "env"})}
""",
    "mixture": f"""
resume-test:
  run: StarPO
  stop: {{training_iteration: 5}}
  checkpoint_config: {{checkpoint_frequency: 1, checkpoint_at_end: true}}
  config: {json.dumps(MIX)}
""",
}
# Metrics that depend on the sampled tokens, the update and the counters (not on time).
COMPARED = {
    "rollout": ("reward_mean", "success_rate", "response_length_mean", "in_group_reward_std"),
    "learners/default_policy": (
        "policy_loss",
        "entropy",
        "value_loss",
        "gradients_actor_global_norm",
        "gradients_critic_global_norm",
    ),
    "counters": (
        "num_trajectories_lifetime",
        "num_turns_lifetime",
        "num_generated_tokens_lifetime",
    ),
}


def _cmd(yaml_file: Path, storage: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "ragen_rllib.cli", "train", "file", str(yaml_file),
        "--storage-path", str(storage), *extra,
    ]  # fmt: skip


def _rows(storage: Path) -> list[dict]:
    trial = next((storage / "resume-test").glob("StarPO_*"))
    return [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]


def _compared(row: dict) -> dict:
    out = {}
    sections = dict(COMPARED)
    for name in MIXED:  # a mixture's per-env metrics
        if name in row["rollout"]:
            sections[f"rollout/{name}"] = COMPARED["rollout"]
    for section, keys in sections.items():
        values = row
        for part in section.split("/"):
            values = values[part]
        out.update({f"{section}/{k}": values[k] for k in keys})
    return out


@pytest.mark.parametrize("kind", list(EXPERIMENTS))
def test_killed_run_resumes_without_losing_iterations(tmp_path, kind):
    yaml_file = tmp_path / "resume.yaml"
    yaml_file.write_text(EXPERIMENTS[kind])
    env = private_env(tmp_path)

    reference = tmp_path / "uninterrupted"
    proc = subprocess.run(
        _cmd(yaml_file, reference), cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

    killed = tmp_path / "killed"
    log = open(tmp_path / "killed.log", "w")
    run = subprocess.Popen(
        _cmd(yaml_file, killed), cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    third = None
    while time.monotonic() < deadline and run.poll() is None:
        third = next(killed.glob("resume-test/StarPO_*/checkpoint_000002"), None)
        if third is not None and (third / "ragen_checkpoint_manifest.json").is_file():
            break
        time.sleep(0.2)
    assert run.poll() is None, "the run ended before it could be killed"
    assert third is not None, "no checkpoint after iteration 3 within 10 minutes"
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    done_before = {r["training_iteration"] for r in _rows(killed)}
    assert {1, 2, 3} <= done_before and 5 not in done_before

    proc = subprocess.run(
        _cmd(yaml_file, killed, "--resume"), cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

    resumed = _rows(killed)
    # No completed iteration is lost, and the run went on from a checkpoint instead of
    # starting over: at most the iteration after the last snapshot runs twice.
    assert {r["training_iteration"] for r in resumed} == {1, 2, 3, 4, 5}
    assert len(resumed) <= 6, [r["training_iteration"] for r in resumed]
    expected = {r["training_iteration"]: _compared(r) for r in _rows(reference)}
    got = {r["training_iteration"]: _compared(r) for r in resumed}  # the last row wins
    for iteration in (4, 5):
        assert got[iteration] == pytest.approx(expected[iteration], rel=1e-6, abs=1e-7), iteration
    if kind == "mixture":
        assert {f"rollout/{name}/success_rate" for name in MIXED} <= set(got[5])
    # Lifetime counters continue across the restore: 6 trajectories per iteration.
    assert got[5]["counters/num_trajectories_lifetime"] == 30


def test_resume_names_a_truncated_checkpoint_file(tmp_path):
    from ragen_rllib.algorithms.starpo.checkpoint import (
        MANIFEST,
        CorruptCheckpointError,
        verify_checkpoint,
    )

    ckpt = tmp_path / "checkpoint_000000"
    (ckpt / "learner_group").mkdir(parents=True)
    (ckpt / "algorithm_state.pkl").write_bytes(b"x" * 100)
    (ckpt / "learner_group" / "state.pkl").write_bytes(b"y" * 50)
    from ragen_rllib.algorithms.starpo.checkpoint import write_manifest

    write_manifest(ckpt)
    verify_checkpoint(ckpt)  # intact
    assert (ckpt / MANIFEST).is_file()
    (ckpt / "learner_group" / "state.pkl").write_bytes(b"y" * 20)
    with pytest.raises(CorruptCheckpointError, match=r"learner_group/state\.pkl' is truncated"):
        verify_checkpoint(ckpt)
    (ckpt / "learner_group" / "state.pkl").write_bytes(b"z" * 50)
    with pytest.raises(CorruptCheckpointError, match=r"state\.pkl' is corrupt"):
        verify_checkpoint(ckpt)
    (ckpt / "algorithm_state.pkl").unlink()
    with pytest.raises(CorruptCheckpointError, match=r"algorithm_state\.pkl' is missing"):
        verify_checkpoint(ckpt)
