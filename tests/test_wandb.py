"""`rllib train file ... --wandb PROJECT`: Tune's WandbLoggerCallback, run offline."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import private_env, tiny_dict

pytestmark = pytest.mark.slow


def test_wandb_logs_every_trial_offline(tmp_path):
    config = tiny_dict()
    env = config.pop("env")
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "wb:\n  run: StarPO\n"
        f"  env: {env}\n"
        "  stop: {training_iteration: 2}\n"
        "  checkpoint_config: {checkpoint_at_end: false}\n"
        "  config:\n" + "".join(f"    {k}: {json.dumps(v)}\n" for k, v in config.items())
    )
    wandb_dir = tmp_path / "wandb"
    wandb_dir.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "ragen_rllib.cli", "train", "file", str(exp),
         "--storage-path", str(tmp_path / "results"), "--wandb", "ragen-test"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
        env=private_env(tmp_path, WANDB_MODE="offline", WANDB_DIR=str(wandb_dir),
                        WANDB_SILENT="true"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = list(wandb_dir.rglob("offline-run-*"))
    assert len(runs) == 1, runs
    logs = list(runs[0].glob("*.wandb"))
    assert logs and logs[0].stat().st_size > 0
    blob = logs[0].read_bytes()
    # The trial's results, flattened by Tune's callback, and the project and group.
    assert b"rollout/success_rate" in blob and b"ragen-test" in blob


def test_wandb_on_resume_is_refused(tmp_path, capsys):
    from ragen_rllib.cli import main

    exp = tmp_path / "exp.yaml"
    exp.write_text("wb:\n  run: StarPO\n  env: ragen/Bandit-v0\n  config: {llm: builtin-raw}\n")
    code = main(["train", "file", str(exp), "--storage-path", str(tmp_path), "--resume",
                 "--wandb", "p"])  # fmt: skip
    assert code == 2
    assert "--wandb cannot be added on --resume" in capsys.readouterr().err
