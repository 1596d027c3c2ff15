"""Train a tuned example in one process and print success before and after, time and memory.

The figures the CPU examples are judged by: success on the fixed evaluation
states (``eval_num_states``, ``eval_temperature`` and ``eval_seed`` of the
experiment's config, so 256 states at temperature 0.5 by default) before any
update and after the last one, the iterations run, the wall time of the
training loop, and the peak resident memory of the whole process tree (this
driver, which holds the env runner and the learner when ``num_env_runners``
and ``num_learners`` are 0, plus every Ray process it started), sampled
every 0.5 s from /proc.

    python bench/bench_train_cpu.py tuned_examples/bandit_cpu.yaml
    python bench/bench_train_cpu.py tuned_examples/frozenlake_cpu.yaml --minutes 20

Every iteration's full result is also appended to ``result.json`` in the
run's folder (printed at the start; under ``~/ray_results``; its settings in a
``params.json`` beside it), with the
evaluation before training as iteration 0 and the one after as a last row,
so ``rllib report <folder>`` draws the run's curves (``curves.png``) and its
trajectory browser as it does for ``rllib train``.

``--suites`` evaluates the config's ``eval_suites`` too, before and after, and
keeps its ``eval_interval`` (curves of every suite env: what a self-play run is
measured by, its own game being zero-sum against itself); each suite env's win,
draw and loss rates and mean payoff are printed.

``--iterations`` overrides the experiment's ``stop.training_iteration``;
``--minutes`` stops earlier when the wall time runs out (evaluation time
included), ``--train-minutes`` when the training loop's time does (the
evaluations before and after are not counted: for a real model on a grid env
each takes minutes); ``--checkpoint DIR`` saves the trained algorithm there (for
``rllib evaluate``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
#: The collapse indicators each --curve point carries.
CURVE_COLLAPSE = ("think_words_mean", "distinct_2", "template_repetition", "mi", "mi_zscore")


def _plain(value: object) -> object:
    """JSON for what json cannot write itself: numpy scalars and arrays, else str."""
    for attr in ("item", "tolist"):
        if hasattr(value, attr):
            try:
                return getattr(value, attr)()
            except (TypeError, ValueError):
                continue
    return str(value)


def write_row(out, row: dict) -> None:
    """One result as a line of ``result.json`` (the format ``rllib report`` reads)."""
    out.write(json.dumps(row, default=_plain) + "\n")
    out.flush()


def tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/statm") as f:
                resident = int(f.read().split()[1])
        except OSError:
            continue  # the process ended while we looked
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = resident * PAGE
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


class PeakRSS(threading.Thread):
    def __init__(self, interval: float = 0.5):
        super().__init__(daemon=True)
        self.interval, self.peak, self._halt = interval, 0, threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak = max(self.peak, tree_rss_bytes(os.getpid()))
            self._halt.wait(self.interval)

    def stop(self) -> int:
        self._halt.set()
        self.join()
        return self.peak


#: an evaluation's figures printed per suite env (those it has)
SUITE_KEYS = (
    "success_rate",
    "game/win_rate",
    "game/draw_rate",
    "game/loss_rate",
    "game/payoff_mean",
)


def _suite_envs(evaluation: dict):
    """(suite, env name, metrics) of every suite env in an ``evaluate_all()`` result."""
    for suite, envs in evaluation.items():
        if isinstance(envs, dict):
            for env, metrics in envs.items():
                if isinstance(metrics, dict) and "success_rate" in metrics:
                    yield suite, env, metrics


def print_evaluation(name: str, when: str, evaluation: dict) -> None:
    """An evaluation's success rate, then each suite opponent's figures (with --suites)."""
    print(f"{name}: {when}, eval success {evaluation['success_rate']:.3f}", flush=True)
    for suite, env, metrics in _suite_envs(evaluation):
        shown = ", ".join(f"{k} {metrics[k]:.3f}" for k in SUITE_KEYS if k in metrics)
        print(f"  {when}: {suite}/{env}: {shown}", flush=True)


def suite_figures(evaluation: dict, when: str) -> dict:
    return {
        f"{suite}/{env}/{key}_{when}": round(metrics[key], 4)
        for suite, env, metrics in _suite_envs(evaluation)
        for key in SUITE_KEYS
        if key in metrics
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="experiment YAML (its first experiment is run)")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--minutes", type=float, default=None, help="wall-time limit")
    parser.add_argument(
        "--train-minutes", type=float, default=None, help="limit on the training loop's time"
    )
    parser.add_argument("--config", default=None, help="JSON object merged into the config")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (1 when two runs share 2 cores)"
    )
    parser.add_argument("--curve", default=None, help="write per-iteration metrics (JSON lines)")
    parser.add_argument(
        "--checkpoint", default=None, help="save the trained algorithm to this folder at the end"
    )
    parser.add_argument(
        "--suites",
        action="store_true",
        help="also evaluate the config's eval_suites before and after, and keep its "
        "eval_interval (the suites' curves: a self-play run's measure)",
    )
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from ragen_rllib.cli.experiments import build_config, load_experiments

    name, exp = next(iter(load_experiments(args.file).items()))
    config, grid = build_config(exp, json.loads(args.config) if args.config else {})
    if grid:
        parser.error(f"{args.file} sweeps {sorted(grid)}; this script runs one config")
    iterations = args.iterations or int((exp.get("stop") or {}).get("training_iteration", 50))
    if not args.suites:
        config.eval_interval = 0  # this script evaluates before and after itself
    elif not config.eval_suites:
        parser.error(f"--suites: {args.file} sets no eval_suites")

    import ray

    curve = open(args.curve, "w") if args.curve else None  # noqa: SIM115 - closed below
    sampler = PeakRSS()
    sampler.start()
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ray.init(num_cpus=os.cpu_count(), num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    from ragen_rllib.warmup import format_warmup as warmup

    warmed = bool(config.format_warmup_steps)
    cached = warmed and os.path.isfile(os.path.join(warmup.warmed_path(config), warmup.RECORD_FILE))
    algo = config.build_algo()  # runs the format warm-up, when there is one not cached
    results = open(Path(algo.logdir) / "result.json", "w")  # noqa: SIM115 - closed below
    # The full config, as a Tune trial's params.json holds it, so that `rllib report`
    # on a folder of these runs (or of these and `rllib train`'s) groups them by
    # setting and seed.
    params = json.dumps(config.to_dict(), default=str)
    (Path(algo.logdir) / "params.json").write_text(params)
    print(f"result.json and rollouts in {algo.logdir}", flush=True)
    try:
        start = time.perf_counter()
        before = algo.evaluate_all() if args.suites else algo.evaluate_success()
        write_row(results, {"training_iteration": 0, "evaluation": before})
        print_evaluation(name, "before training", before)
        done = 0
        deadline = None if args.minutes is None else start + 60 * args.minutes
        loop_start = time.perf_counter()
        if args.train_minutes is not None:
            loop_end = loop_start + 60 * args.train_minutes
            deadline = loop_end if deadline is None else min(deadline, loop_end)
        timings: list[dict] = []
        for done in range(1, iterations + 1):
            result = algo.train()
            write_row(results, result)
            r = result["rollout"]
            timings.append(result.get("timing") or {})
            if curve is not None:
                learner = (result.get("learners") or {}).get("default_policy") or {}
                point = {
                    "iteration": done,
                    "wall_s": round(time.perf_counter() - start, 1),
                    "success": r.get("success_rate"),
                    "reward_mean": r.get("reward_mean"),
                    "in_group_reward_std": r.get("in_group_reward_std"),
                    "entropy": learner.get("entropy"),
                    "action_is_valid": r.get("env/action_is_valid"),
                    "policy_lag_mean": r.get("policy_lag_mean"),
                    **{f"timing/{k}": v for k, v in (result.get("timing") or {}).items()},
                    **{
                        f"collapse/{k}": v
                        for k, v in (result.get("collapse") or {}).items()
                        if k in CURVE_COLLAPSE
                    },
                }
                curve.write(json.dumps(point) + "\n")
                curve.flush()
            print(
                f"iter {done}: train success {r['success_rate']:.3f} "
                f"reward {r['reward_mean']:.3f} valid {r.get('env/action_is_valid', 0):.2f} "
                f"lag {r.get('policy_lag_mean', 0):.1f} t {time.perf_counter() - start:.0f}s",
                flush=True,
            )
            if deadline is not None and time.perf_counter() > deadline:
                break
        train_s = time.perf_counter() - start
        loop_s = time.perf_counter() - loop_start
        after = algo.evaluate_all() if args.suites else algo.evaluate_success()
        write_row(results, {"training_iteration": done, "evaluation": after})
        print_evaluation(name, f"after {done} iterations", after)
        total_s = time.perf_counter() - start
        if args.checkpoint:
            algo.save_to_path(os.path.abspath(args.checkpoint))
    finally:
        algo.stop()
        peak = sampler.stop()
        results.close()
        if curve is not None:
            curve.close()
        ray.shutdown()
    # Speed: the median iteration after the first (a warm-up: first allocations, and
    # with a critic its first values), or of all of them when fewer than 4 ran.
    timed = timings[1:] if len(timings) >= 4 else timings
    speed = {
        f"{key}_median": round(statistics.median(t.get(key, 0.0) for t in timed), 2)
        for key in ("iteration_s", "rollout_s", "update_s")
    } if timed else {}  # fmt: skip
    warm = {}
    if warmed:
        with open(os.path.join(warmup.warmed_path(config), warmup.RECORD_FILE)) as f:
            record = json.load(f)
        warm = {"warmup_s": record.get("seconds"), "warmup_cached": cached}
    figures = {
        "experiment": name,
        "env": config.env,
        "eval_states": config.eval_num_states,
        "eval_temperature": config.eval_temperature,
        "success_before": before["success_rate"],
        "success_after": after["success_rate"],
        **suite_figures(before, "before"),
        **suite_figures(after, "after"),
        "iterations": done,
        "train_wall_s": round(train_s, 1),
        "training_loop_s": round(loop_s, 1),
        "total_wall_s": round(total_s, 1),
        "peak_rss_gib": round(peak / 2**30, 2),
        **speed,
        **warm,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
