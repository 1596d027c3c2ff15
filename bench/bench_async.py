"""Asynchronous against synchronous training throughput, side by side in one run.

Runs the same experiment config in several modes, each for ``--warmup`` untimed
and ``--iterations`` timed iterations, and prints iterations per second, the
mean stage times (waiting for the sample, the runner's rollout, the update, the
weight sync), the idle shares and the policy lag of each mode, and the ratio of
each mode's throughput to the synchronous baseline's.

Modes (``--modes``, comma-separated):

- ``sync-local``: the runner in the driver (no remote actor); sampling and the
  update take turns, each with ``--threads`` torch threads;
- ``sync-remote`` / ``sync-remote-2``: one or two remote runner actors (one
  thread each; two split the groups), still in lockstep; the learner uses
  ``--threads`` (the actors wait while it updates);
- ``async`` / ``async-2``: one or two runner actors sample batch i+1 while the
  driver's learner updates on batch i (policy lag 1) with
  ``--learner-threads``.

    python bench/bench_async.py tuned_examples/frozenlake_noslip_cpu.yaml \
        --modes sync-local,sync-remote-2,async,async-2

Every mode reports its stage times and thread counts. Two bounds judge the
ratio: overlapping two equal stages can at most halve an iteration (2x), and
no schedule on C cores beats the stages' single-thread work divided by C
(``--threads`` is C here), which the output prints as ``async_floor_s``.
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
    "sync-remote-2": {"num_env_runners": 2, "async_rollouts": False},
    "async": {"num_env_runners": 1, "async_rollouts": True},
    "async-2": {"num_env_runners": 2, "async_rollouts": True},
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
    parser.add_argument("--modes", default="sync-local,sync-remote-2,async,async-2")
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

    from ragen_rllib.cli.experiments import build_config, load_experiments

    name, exp = next(iter(load_experiments(args.file).items()))
    overrides = json.loads(args.config) if args.config else {}
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    figures: dict = {"experiment": name, "cpus": os.cpu_count(), "modes": {}}
    try:
        for mode in args.modes.split(","):
            config, _ = build_config(exp, {**overrides, **MODES[mode]})
            config.eval_interval = 0
            # The learner has the cores to itself unless runner actors sample beside it.
            overlapped = MODES[mode]["async_rollouts"]
            threads = args.learner_threads if overlapped else args.threads
            torch.set_num_threads(threads)
            out = run_mode(config, args.warmup, args.iterations)
            out["learner_threads"] = threads
            out["runner_threads"] = args.threads if mode == "sync-local" else 1
            out["runner_actors"] = MODES[mode]["num_env_runners"]
            figures["modes"][mode] = out
            print(mode, json.dumps(out), flush=True)
    finally:
        ray.shutdown()
    modes = figures["modes"]
    sync = {m: v for m, v in modes.items() if not MODES[m]["async_rollouts"]}
    if sync:
        best = max(sync, key=lambda m: sync[m]["iterations_per_s"])
        figures["best_sync"] = best
        figures["throughput_vs_best_sync"] = {
            m: round(v["iterations_per_s"] / sync[best]["iterations_per_s"], 2)
            for m, v in modes.items()
        }
    one_thread = [v for v in modes.values() if v["runner_threads"] == v["learner_threads"] == 1]
    if one_thread:
        # Rollout and update work at one thread each (an actor samples its share of the
        # groups, so its busy time times the actors is the whole batch's).
        work = min(v["rollout_s"] * v["runner_actors"] + v["update_s"] for v in one_thread)
        figures["async_floor_s"] = round(work / args.threads, 3)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
