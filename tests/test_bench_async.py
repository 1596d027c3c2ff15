"""bench/bench_async.py --device-time: the simulation runs and its figures are sane.

The rollout and the update sleep 0.3 s each (``--quick``), so the asynchronous
mode, which overlaps them, must be clearly faster than the synchronous one; the
checks are on what the run must show whatever the machine's load: the overlap
itself (the runner samples while the driver updates), the policy lag, the real
weights pushed, and every overhead part present and non-negative.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import private_env

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_async.py"
PARTS = (
    "rllib_step_ms",
    "launch_ms",
    "collect_ms",
    "sample_stage_ms",
    "buffer_ms",
    "learner_call_ms",
    "push_ms",
    "push_get_state_ms",
    "push_to_wire_ms",
    "push_put_ms",
    "push_dispatch_ms",
    "push_await_ms",
    "driver_other_ms",
    "sample_send_ms",
    "runner_sample_ms",
    "sample_return_ms",
    "weights_get_ms",
    "weights_unpack_ms",
    "weights_load_ms",
)


def _overlap(timeline: list[list], a: str, b: str) -> float:
    """Milliseconds during which the driver's ``a`` and a runner's ``b`` both ran."""
    driver = [(t0, t1) for who, what, t0, t1 in timeline if who == "driver" and what == a]
    runner = [(t0, t1) for who, what, t0, t1 in timeline if who != "driver" and what == b]
    return sum(max(0.0, min(d1, r1) - max(d0, r0)) for d0, d1 in driver for r0, r1 in runner)


@pytest.mark.slow
def test_device_time_quick(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--device-time", "--quick", "--json", str(out)],
        cwd=tmp_path,
        env=private_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads(out.read_text())
    assert "simulation" in figures and "--device-time --quick" in figures["command"]
    assert "| builtin" in proc.stdout  # the table is printed
    [run] = figures["runs"]
    assert (run["model"], run["runners"], run["ratio"]) == ("builtin", 1, "1:1")
    sync, asynchronous = run["sync"], run["async"]

    # Two equal 0.3 s stages: at best 2x. How close a run comes is the bench's figure,
    # not the test's (on a loaded machine the overheads grow and a CI run with a CPU
    # hog beside it read 1.10x); the overlap itself is checked below.
    assert run["ideal"] == 2.0
    assert math.isfinite(run["async_vs_sync"]) and run["async_vs_sync"] > 0, run
    for mode, device_s in ((sync, 0.6), (asynchronous, 0.3)):
        assert mode["device_s_per_iteration"] == pytest.approx(device_s)
        assert mode["seconds_per_iteration"] >= device_s
        assert mode["overhead_ms"] >= 0
        assert set(PARTS) <= set(mode["parts_ms"])
        for key, value in mode["parts_ms"].items():
            assert math.isfinite(value) and value >= 0, (key, value)
        # The stages really slept: RLlib's own timings hold them.
        assert mode["timing_s"]["rollout_s"] >= 0.3
        assert mode["timing_s"]["update_s"] >= 0.3
        assert mode["dropped_stale"] == 0

    # The real weights travel: the built-in model's parameters, in fp32 (its tied LM
    # head is the embedding, sent once).
    from transformers import AutoModelForCausalLM

    from ragen_rllib.models.resolve import resolve_model

    model = AutoModelForCausalLM.from_pretrained(resolve_model("builtin"))
    nbytes = 4 * sum(p.numel() for p in model.parameters())
    assert sync["push_bytes"] == asynchronous["push_bytes"] == nbytes
    assert asynchronous["parts_ms"]["weights_load_ms"] > 0

    # Asynchronous: the runner samples during the update, on weights one update old.
    assert asynchronous["policy_lag_mean"] == 1.0
    assert _overlap(asynchronous["timeline"], "update", "sample") > 0.5 * 300
    # Synchronous: the runner waits while the learner updates, and the lag is 0.
    assert sync["policy_lag_mean"] == 0.0
    assert _overlap(sync["timeline"], "update", "sample") == 0.0
