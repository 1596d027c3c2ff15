"""bench/bench_agents.py at a small size, run from another directory: both runners
sample every trajectory, and every figure it prints is there and positive."""

from __future__ import annotations

from conftest import run_bench


def test_the_agent_bench_runs(tmp_path):
    args = ("--groups", "2", "--group-size", "2", "--repeats", "1", "--threads", "1")
    out = run_bench(tmp_path, "bench_agents.py", *args)
    assert out["task"] == "bandit" and out["trajectories"] == 4
    for side in ("env", "agent"):
        assert out[side]["turns"] == 4  # one model call per bandit trajectory
        assert out[side]["batch_s"] > 0 and out[side]["per_turn_ms"] > 0
    assert out["agent_over_env_per_turn"] > 0
