"""bench/bench_gateway.py at a small size: both paths answer every turn (the bench
asserts no turn is lost) and every figure it prints is there and positive."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import private_env

ROOT = Path(__file__).resolve().parents[1]


def test_the_gateway_bench_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_gateway.py"), "--agents", "4",
         "--turns", "2", "--single-turns", "2", "--max-tokens", "4"],
        cwd=tmp_path, env=private_env(tmp_path), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    one, many = out["one_agent"], out["many_agents"]
    assert one["turns"] == 2 and one["direct_ms_per_turn"] > 0 and one["gateway_ms_per_turn"] > 0
    assert many["direct_s_per_turn"] > 0 and many["gateway_s_per_turn"] > 0
    # 2 warm-up turns, 2 single turns, 4 agents x 2 turns.
    assert many["requests_answered"] == 2 + 2 + 8
    assert 1 <= many["largest_batch"] <= 4
