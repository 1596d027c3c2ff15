"""Asynchronous against synchronous training throughput, side by side in one run.

Runs the same experiment config in several modes, each for ``--warmup`` untimed
and ``--iterations`` timed iterations, and prints iterations per second, the
mean stage times (waiting for the sample, the runner's rollout, the update, the
weight sync), the idle shares and the policy lag of each mode, and the ratio of
each mode's throughput to the synchronous baseline's.

Modes (``--modes``, comma-separated):

- ``sync-local``: the runner in the driver (no remote actor), torch threads =
  ``--threads``; sampling and the update take turns on all the cores;
- ``sync-remote``: one remote runner actor, still in lockstep;
- ``async``: one remote runner actor that samples batch i+1 while the driver's
  learner updates on batch i (policy lag 1).

    python bench/bench_async.py tuned_examples/frozenlake_noslip_cpu.yaml

On 2 cores the async mode runs the learner with 1 torch thread and the runner
actor with 1 (Ray gives an actor with one CPU one thread); the ceiling for two
overlapped stages of equal length is 2x.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

MODES = {
    "sync-local": {"num_env_runners": 0, "async_rollouts": False},
    "sync-remote": {"num_env_runners": 1, "async_rollouts": False},
    "async": {"num_env_runners": 1, "async_rollouts": True},
}


def run_mode(config, warmup: int, iterations: int) -> dict:
    algo = config.build_algo()
    try:
        for _ in range(warmup):
            algo.train()
        rows = []
        start = time.perf_counter()
        for _ in range(iterations):
            result = algo.train()
            rows.append({**result["timing"], "lag": result["rollout"].get("policy_lag_mean", 0)})
        wall = time.perf_counter() - start
    finally:
        algo.stop()

    def mean(key):
        return round(sum(r[key] for r in rows) / len(rows), 3)

    return {
        "iterations_per_s": round(iterations / wall, 4),
        "seconds_per_iteration": round(wall / iterations, 3),
        **{
            key: mean(key)
            for key in (
                "sample_wait_s",
                "rollout_s",
                "update_s",
                "sync_s",
                "runner_idle_share",
                "learner_idle_share",
                "lag",
            )
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="experiment YAML (its first experiment is run)")
    parser.add_argument("--config", default=None, help="JSON object merged into the config")
    parser.add_argument("--modes", default="sync-local,async")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument(
        "--learner-threads",
        type=int,
        default=1,
        help="torch threads of the driver's learner beside a runner actor (which has 1)",
    )
    args = parser.parse_args(argv)

    import ray
    import torch

    from ragen_rllib.cli import build_config, load_experiments

    name, exp = next(iter(load_experiments(args.file).items()))
    overrides = json.loads(args.config) if args.config else {}
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    figures: dict = {"experiment": name, "cpus": os.cpu_count(), "modes": {}}
    try:
        for mode in args.modes.split(","):
            config, _ = build_config(exp, {**overrides, **MODES[mode]})
            config.eval_interval = 0
            # Beside a runner actor, the driver's learner uses --learner-threads.
            threads = args.threads if mode == "sync-local" else args.learner_threads
            torch.set_num_threads(threads)
            out = run_mode(config, args.warmup, args.iterations)
            out["learner_threads"] = threads
            out["runner_threads"] = args.threads if mode == "sync-local" else 1
            figures["modes"][mode] = out
            print(mode, json.dumps(out), flush=True)
    finally:
        ray.shutdown()
    modes = figures["modes"]
    base = modes.get("sync-local") or modes.get("sync-remote")
    if base:
        figures["throughput_vs_sync"] = {
            m: round(v["iterations_per_s"] / base["iterations_per_s"], 2) for m, v in modes.items()
        }
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
