"""bench/bench_remote_env.py at a small size: a real server, the same answers in
process and remote, the figures it prints are positive."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("openenv")

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "bench_remote_env", ROOT / "bench/bench_remote_env.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_the_bench_measures_both_paths_on_a_real_server():
    r = bench.measure("ragen/FrozenLakeNoSlip-v0", sessions=2, rounds=3)
    assert r["local_steps"] == r["remote_steps"] == 6
    assert r["local_step_us"] > 0 and r["remote_step_us"] > 0
    assert r["remote_reset_us"] > 0
