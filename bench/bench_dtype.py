"""float32 against bfloat16 on this CPU: seconds per training iteration of a tuned example,
side by side, and what ``model_dtype: auto`` chooses for its model.

Each run is a fresh process that builds the experiment's algorithm with the dtype
forced (``model_dtype`` and the engine's with it), evaluation off, and trains
``--iterations`` iterations; the first is left out (kernels' first calls, the
allocator's growth) and the median of the rest is the run's figure. The dtypes
alternate, ``--rounds`` times each (f32, bf16, f32, bf16, ...), so that a drift in
the machine's speed falls on both. It also prints the model's width and what
``model_dtype: auto`` takes for it on this machine. Prints JSON:

    python bench/bench_dtype.py tuned_examples/bandit_cpu.yaml --iterations 12
    python bench/bench_dtype.py tuned_examples/frozenlake_noslip_smollm2_cpu.yaml \\
        --config '{"env_groups": 4, "group_size": 8}' --iterations 4

Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

RUN = """
import json, sys, time
import ray
from ragen_rllib.cli.experiments import build_config, load_experiments
file, overrides, iterations = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
name, exp = next(iter(load_experiments(file).items()))
config, _ = build_config(exp, overrides)
config.eval_interval = 0
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
algo = config.build_algo()
times = []
for _ in range(iterations):
    start = time.perf_counter()
    algo.train()
    times.append(time.perf_counter() - start)
algo.stop()
print(json.dumps({"dtype": config.model_dtype_used, "seconds": times}))
"""

AUTO = """
import json, sys
from ragen_rllib.cli.experiments import build_config, load_experiments
from ragen_rllib.planning.shapes import model_width
name, exp = next(iter(load_experiments(sys.argv[1]).items()))
config, _ = build_config(exp, json.loads(sys.argv[2]))
config.model_dtype = "auto"
print(json.dumps({"hidden_size": model_width(config.llm), "auto_chooses": config.dtype_note()}))
"""


def _last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON line in: {text[-2000:]}")


def _run(script: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=False
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return _last_json(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="experiment YAML (its first experiment is run)")
    parser.add_argument("--config", default="{}", help="JSON object merged into the config")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    if args.iterations < 2:
        parser.error("--iterations must be at least 2 (the first is left out)")
    from ragen_rllib.models.runtime import cpu_flags

    flags = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    base = json.loads(args.config)
    medians: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    for _ in range(args.rounds):
        for dtype in medians:
            overrides = json.dumps({**base, "model_dtype": dtype})
            out = _run(RUN, args.file, overrides, str(args.iterations))
            medians[dtype].append(round(statistics.median(out["seconds"][1:]), 3))
    f32, bf16 = (statistics.median(medians[d]) for d in ("float32", "bfloat16"))
    print(json.dumps({
        "file": args.file, "config": base, "cpu_flags": flags, "threads": os.cpu_count(),
        "iterations": args.iterations, "s_per_iteration_float32": medians["float32"],
        "s_per_iteration_bfloat16": medians["bfloat16"],
        "bfloat16_speedup_measured": round(f32 / bf16, 3),
        **_run(AUTO, args.file, args.config),
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
