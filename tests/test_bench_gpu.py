"""bench/gpu_run.sh's CPU path (bench/bench_gpu.py at a tiny size, three settings):
each run trains, and every figure it writes is there and sane; the GPU figures
need a GPU machine. And the update's FLOPs count that the MFU divides by."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from conftest import private_env

ROOT = Path(__file__).resolve().parents[1]


def _gpu_script(tmp_path, out, timeout=300, **env):
    """gpu_run.sh's CPU path with ``env`` over a clean slate of its own settings."""
    base = {k: v for k, v in private_env(tmp_path).items()
            if k not in ("ONLY", "GGUF", "DEADLINE", "RUN_TIMEOUT", "LEARN_MINUTES")}  # fmt: skip
    return subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_run.sh"), "--cpu", str(out)],
        cwd=tmp_path,
        env={**base, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_gpu_script_runs_its_cpu_path(tmp_path):
    out = tmp_path / "out"
    proc = _gpu_script(tmp_path, out, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], (out / "runs.log").read_text()[-3000:])
    assert {p.name for p in out.iterdir()} == {
        "facts.txt", "results.jsonl", "runs.log", "summary.txt",
    }  # fmt: skip
    assert "python 3." in (out / "facts.txt").read_text()
    runs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["run"] for r in runs] == ["sokoban", "lora", "no-ckpt"]
    assert [r["overrides"] for r in runs] == [
        {}, {"lora_rank": 64}, {"gradient_checkpointing": False},
    ]  # fmt: skip
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[:2] for line in summary] == [
        ["sokoban", "exit=0"], ["lora", "exit=0"], ["no-ckpt", "exit=0"],
    ]  # fmt: skip
    for r in runs:
        assert r["device"] == "cpu" and r["iterations"] == 1, r
        for key in ("rollout_tokens_per_s", "learner_tokens_per_s", "weight_push_s"):
            assert r[key] > 0, (key, r)
        # What the update trained on is what the filter kept: the example keeps a
        # quarter of the groups (4 groups of 2 here: one group).
        assert r["trained_trajectories"] == 2 and r["sampled_trajectories"] == 8, r
        assert r["iteration_s"] >= r["update_s"] > 0, r
        # The planner's estimate at the longest trajectory sampled and the measured
        # peak: the same order (the plan also holds Ray's own processes, the RSS not).
        assert 0.5 < max(r["planned_at_longest_gib"].values()) / r["peak_rss_gib"] < 2.0, r
        assert r["planned_at_longest_gib"]["update"] <= r["planned_worst_case_gib"]["update"]
        assert "mfu" not in r  # no known peak FLOP/s for a CPU


def test_runs_past_the_deadline_are_skipped_and_fail_the_script(tmp_path):
    """DEADLINE=0: nothing is left for any run, so each is named as skipped and the
    exit status is not 0 (not run is not passed). A short RUN_TIMEOUT without a
    DEADLINE is not a reason to skip: that run starts (and here runs out of time)."""
    out = tmp_path / "out"
    proc = _gpu_script(tmp_path, out, DEADLINE="0")
    assert proc.returncode == 1, proc.stdout[-3000:]
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[:2] for line in summary] == [
        ["sokoban", "skipped:"], ["lora", "skipped:"], ["no-ckpt", "skipped:"],
    ]  # fmt: skip
    assert (out / "results.jsonl").read_text() == ""  # no run wrote figures
    short = tmp_path / "short"
    proc = _gpu_script(tmp_path, short, ONLY="sokoban", RUN_TIMEOUT="2")
    summary = (short / "summary.txt").read_text().splitlines()
    assert [line.split()[:2] for line in summary] == [["sokoban", "exit=124"]], summary


def _bench_gpu():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "bench_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_update_flops_per_token():
    from ragen_rllib.planning.shapes import KNOWN_CONFIGS, ModelShape

    shape = ModelShape.from_config(KNOWN_CONFIGS["qwen/qwen2.5-0.5b"], "qwen2.5-0.5b")
    flops = _bench_gpu().update_flops_per_token
    n = shape.params()
    critic = n - shape.vocab * shape.hidden

    def cfg(**kw):
        base = {"lora_rank": 0, "gradient_checkpointing": False, "uses_critic": False}
        return SimpleNamespace(**{**base, **kw})

    assert flops(cfg(), shape) == 6 * n  # forward 2N, backward 4N
    assert flops(cfg(gradient_checkpointing=True), shape) == 8 * n  # the forward again
    assert flops(cfg(uses_critic=True), shape) == 6 * n + 6 * critic + 2 * critic
    lora = shape.lora_params(64)
    # Frozen weights get no weight gradients: 4N plus the adapters' 2t.
    assert flops(cfg(lora_rank=64), shape) == 4 * n + 2 * lora
    # An untied model's input embedding is a lookup: only its LM head is a matmul.
    untied = ModelShape.from_config(
        {**KNOWN_CONFIGS["qwen/qwen2.5-0.5b"], "tie_word_embeddings": False}, "untied"
    )
    assert untied.params() == n + untied.vocab * untied.hidden
    assert flops(cfg(), untied) == 6 * n
    # The shipped Sokoban config: checkpointing and a critic; 7.53 GFLOP per token.
    shipped = flops(cfg(gradient_checkpointing=True, uses_critic=True), shape)
    assert round(shipped / 1e9, 2) == 7.53


def test_the_decode_probe_decodes_the_same_tokens_with_a_static_cache_on_cpu(tmp_path):
    """bench/probe_decode_launch.py's CPU path: the static cache's greedy tokens are the
    dynamic cache's (float32, every row), and each row carries its timings."""
    spec = importlib.util.spec_from_file_location(
        "probe", ROOT / "bench" / "probe_decode_launch.py"
    )
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    out = tmp_path / "rows.jsonl"
    argv = ["--device", "cpu", "--shape", "tiny", "--batch", "1", "3", "--steps", "6"]
    assert probe.main([*argv, "--prompt", "12", "--json", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["batch"] for r in rows] == [1, 3]
    for row in rows:
        assert row["static_rows_equal_dynamic"] == 1.0
        assert row["dynamic_ms"] > 0 and row["static_ms"] > 0
        assert "graph_ms" not in row  # a CUDA graph needs a GPU
