"""bench/bench_agents.py at a small size, run from another directory: both runners
sample every trajectory, and every figure it prints is there and positive."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import private_env

ROOT = Path(__file__).resolve().parents[1]


def test_the_agent_bench_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_agents.py"), "--groups", "2",
         "--group-size", "2", "--repeats", "1", "--threads", "1"],
        cwd=tmp_path, env=private_env(tmp_path), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert out["task"] == "bandit" and out["trajectories"] == 4
    for side in ("env", "agent"):
        assert out[side]["turns"] == 4  # one model call per bandit trajectory
        assert out[side]["batch_s"] > 0 and out[side]["per_turn_ms"] > 0
    assert out["agent_over_env_per_turn"] > 0
