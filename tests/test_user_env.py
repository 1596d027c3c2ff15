"""A user's own environment: `module:EnvId` ids, `env_module`, and a plain gymnasium.Env
that offers only str observations and step(str), trained through `rllib train file`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_rllib.config import StarPOConfig
from ragen_rllib.context import FORMAT_HINT
from ragen_rllib.env_loading import success_of
from ragen_rllib.env_runner import LLMEnvRunner

ROOT = Path(__file__).resolve().parents[1]
USER_ENVS = Path(__file__).resolve().parent / "user_envs"
SMALL = {
    "llm": "builtin-raw",
    "env_groups": 2,
    "group_size": 2,
    "max_turns": 1,
    "max_new_tokens": 8,
    "minibatch_size": 4,
    "filter_keep_ratio": 1.0,
    "advantage_estimator": "grpo",
}


@pytest.fixture(autouse=True)
def user_envs_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(USER_ENVS))


def test_module_colon_id_and_env_module_pass_the_check():
    StarPOConfig.from_user_dict({**SMALL, "env": "my_text_envs:SayTheWord-v0"}).check()
    StarPOConfig.from_user_dict(
        {**SMALL, "env": "SayTheWord-v0", "env_module": "my_text_envs"}
    ).check()
    StarPOConfig.from_user_dict(
        {**SMALL, "env": "SayTheWord-v0", "env_module": ["json", "my_text_envs"]}
    ).check()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"env": "no_such_pkg.envs:Game-v0"}, r"config env: importing the env module 'no_such_pkg"),
        (
            {"env": "Game-v0", "env_module": "no_such_pkg"},
            r"config env_module: importing the env module 'no_such_pkg'",
        ),
        ({"env": "json:NotRegistered-v0"}, r"env='json:NotRegistered-v0' is not a registered"),
        ({"env": "Unknown-v9"}, r"use 'module:EnvId' or name the module .* `env_module`"),
        ({"env": "SayTheWord-v0", "env_module": 3}, r"config env_module=3 is invalid"),
        ({"env": "SayTheWord-v0", "env_module": []}, r"config env_module=\[\] is invalid"),
        ({"env": "a:b:c"}, r"at most one ':'"),
        ({"env": 7}, r"config env=7 is invalid"),
    ],
)
def test_env_errors_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        StarPOConfig.from_user_dict({**SMALL, **overrides}).check()


def test_plain_env_uses_the_documented_fallbacks():
    runner = LLMEnvRunner(
        config=StarPOConfig.from_user_dict({**SMALL, "env": "my_text_envs:SayTheWord-v0"}),
        worker_index=0,
    )
    trajs = runner.sample()
    assert len(trajs) == 4 and all(t.end_reason == "terminated" for t in trajs)
    prompt = runner.tokenizer.decode(trajs[0].segments[0].input_ids)
    # No instructions(): the first user message is turn 1 alone; no actions_left: no line.
    assert "<|im_start|>user\nTurn 1:\nState:\nSay " in prompt
    assert "actions left" not in prompt and FORMAT_HINT in prompt
    # No info["success"]: success is a positive reward on the last turn.
    for t in trajs:
        assert t.success == (t.turn_rewards[-1] > 0)
    assert success_of({"success": False}, 1.0) is False and success_of({}, 0.5) is True


@pytest.mark.slow
def test_train_file_trains_a_users_env_in_every_ray_process(tmp_path):
    """The module is importable only through PYTHONPATH and is registered nowhere else:
    the trial process and the remote env runner must import it themselves."""
    exp = tmp_path / "mine.yaml"
    config = "\n".join(f"    {k}: {v}" for k, v in SMALL.items())
    exp.write_text(
        "by-env-module:\n"
        "  run: StarPO\n"
        "  env: SayTheWord-v0\n"
        "  stop: {training_iteration: 2}\n"
        "  checkpoint_config: {checkpoint_at_end: false}\n"
        "  config:\n"
        "    env_module: my_text_envs\n"
        "    num_env_runners: 1\n"
        f"{config}\n"
        "by-module-id:\n"
        "  run: StarPO\n"
        "  env: my_text_envs:SayTheWord-v0\n"
        "  stop: {training_iteration: 2}\n"
        "  checkpoint_config: {checkpoint_at_end: false}\n"
        "  config:\n"
        f"{config}\n"
    )
    storage = tmp_path / "results"
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(USER_ENVS),
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "ragen_rllib.cli", "train", "file", str(exp),
         "--storage-path", str(storage)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("by-env-module", "by-module-id"):
        trial = next((storage / name).glob("StarPO_*"))
        rows = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
        assert [r["training_iteration"] for r in rows] == [1, 2], name
        for row in rows:
            assert row["rollout"]["num_trajectories"] == 4
            assert row["rollout"]["env_errors"] == 0
            assert "policy_loss" in row["learners"]["default_policy"]
