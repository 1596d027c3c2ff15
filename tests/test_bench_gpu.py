"""bench/bench_gpu.py's CPU path at a tiny size: it trains, and every figure it prints
is there and sane (the GPU figures need a GPU machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import private_env

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_bench_runs_its_cpu_path(tmp_path):
    proc = subprocess.run(
        [
            sys.executable, str(ROOT / "bench" / "bench_gpu.py"), "--model", "builtin",
            "--device", "cpu", "--dtype", "float32", "--iterations", "2", "--tiny",
        ],
        cwd=tmp_path, env=private_env(tmp_path), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert out["device"] == "cpu" and out["iterations"] == 2
    for key in ("rollout_tokens_per_s", "learner_tokens_per_s", "weight_push_s"):
        assert out[key] > 0, (key, out)
    # The planner's estimate for this process and its measured peak: the same order.
    assert 0.5 < out["planned_peak_gib"] / out["peak_rss_gib"] < 2.0, out
    assert "mfu" not in out  # no known peak FLOP/s for a CPU
