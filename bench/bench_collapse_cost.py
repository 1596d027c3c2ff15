"""What the collapse indicators and the rollout dumps cost, as a share of the iteration time.

Trains an example (default: the FrozenLakeNoSlip CPU example) for ``--iterations``
in one process and reads the timers training logs: ``collapse/diversity_s``
(the think-text diversity, every iteration), ``collapse/mi_s`` (the
prompt-reasoning information, every ``collapse_metrics_interval`` iterations,
scored by the learner's actor) and ``timers/rollout_dump`` (the Parquet dump and
its TensorBoard samples, every ``rollout_dump_interval`` iterations), against
``timing/iteration_s``. The MI and dump shares are their costs spread over
their intervals; the dumps go to the algorithm's log folder (under ~/ray_results).

    python bench/bench_collapse_cost.py
    python bench/bench_collapse_cost.py tuned_examples/bandit_cpu.yaml --iterations 40
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", default="tuned_examples/frozenlake_noslip_cpu.yaml")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import ray
    import torch

    torch.set_num_threads(args.threads)
    from ragen_rllib.cli.experiments import build_config, load_experiments

    name, exp = next(iter(load_experiments(args.file).items()))
    # One process: the runner in the driver, so every stage shares its threads.
    config, _ = build_config(exp, {"num_env_runners": 0, "async_rollouts": False})
    ray.init(num_cpus=args.threads, include_dashboard=False, log_to_driver=False)
    algo = config.build_algo()
    rows = []
    for _ in range(args.iterations):
        r = algo.train()
        dump_s = r["timers"].get("rollout_dump", math.nan)
        rows.append({**r["collapse"], **r["timing"], "dump_s": dump_s})
    algo.stop()
    iteration_s = statistics.mean(row["iteration_s"] for row in rows[1:])
    diversity_s = statistics.mean(row["diversity_s"] for row in rows[1:])
    mi = [row["mi_s"] for row in rows if not math.isnan(row.get("mi_s", math.nan))]
    every = config.collapse_metrics_interval
    mi_s = statistics.mean(mi) if mi else math.nan
    # The timer keeps its last value between dumps: take the dumping iterations'.
    dump_every = config.rollout_dump_interval
    dumps = [row["dump_s"] for i, row in enumerate(rows, 1) if dump_every and i % dump_every == 0]
    dump_s = statistics.mean(dumps) if dumps else math.nan
    json.dump(
        {
            "experiment": name,
            "iterations": args.iterations,
            "iteration_s": round(iteration_s, 3),
            "diversity_s": round(diversity_s, 5),
            "diversity_share": round(diversity_s / iteration_s, 5),
            "mi_s": round(mi_s, 3),
            "mi_computations": len(mi),
            "mi_interval": every,
            "mi_samples": config.collapse_mi_samples,
            "mi_share": round(mi_s / (every * iteration_s), 4) if every else 0.0,
            "dump_s": round(dump_s, 4),
            "dumps": len(dumps),
            "dump_interval": dump_every,
            "dump_share": round(dump_s / (dump_every * iteration_s), 5) if dumps else 0.0,
        },
        sys.stdout,
        indent=2,
    )
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
