"""The ``rllib`` command: ``rllib train file <yaml>`` and ``rllib evaluate <checkpoint>``.

Ray 2.60 ships no ``rllib`` console script, so the project provides one for the
classic experiment YAML format::

    experiment-name:
      run: StarPO
      env: ragen/SimpleSokoban-v0
      stop: {training_iteration: 200}
      checkpoint_config: {checkpoint_frequency: 10, checkpoint_at_end: true}
      config: {model: builtin, env_groups: 8, group_size: 16, ...}

A config value may be a sweep, ``lr: {grid_search: [1.0e-4, 3.0e-4]}``: Tune then
runs one trial per point of the grid. Every experiment's config (every grid
point) is built and checked before Ray starts, so a typo or a bad value fails
in a second with a message that names it. Training runs
through Ray Tune: results, checkpoints and TensorBoard logs land in Tune's
storage path (``--storage-path``, default ``~/ray_results``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

EXPERIMENT_KEYS = {"run", "env", "stop", "config", "checkpoint_config", "storage_path"}
CHECKPOINT_KEYS = {"checkpoint_frequency", "checkpoint_at_end", "num_to_keep"}
RUNS = ("StarPO",)


class UsageError(Exception):
    """A problem with the command line or the experiment file: printed, exit code 2."""


def _json_arg(text: str | None, flag: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{flag} is not valid JSON ({err}): {text!r}") from err
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object, got {text!r}")
    return value


def load_experiments(path: str) -> dict[str, dict[str, Any]]:
    """Read and shape-check an experiment YAML file."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise UsageError(f"experiment file {path!r} does not exist")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise UsageError(f"{path} is not valid YAML: {err}") from err
    if not isinstance(data, dict) or not data:
        raise UsageError(f"{path} must map experiment names to experiments")
    for name, exp in data.items():
        if not isinstance(exp, dict):
            raise UsageError(f"{path}: experiment {name!r} must be a mapping")
        unknown = set(exp) - EXPERIMENT_KEYS
        if unknown:
            raise UsageError(
                f"{path}: experiment {name!r} has unknown key(s) {sorted(unknown)}; "
                f"allowed: {sorted(EXPERIMENT_KEYS)}"
            )
        if exp.get("run") not in RUNS:
            raise UsageError(f"{path}: experiment {name!r} run={exp.get('run')!r}; allowed: {RUNS}")
        ckpt = exp.get("checkpoint_config", {}) or {}
        if not isinstance(ckpt, dict) or set(ckpt) - CHECKPOINT_KEYS:
            raise UsageError(
                f"{path}: experiment {name!r} checkpoint_config keys must be among "
                f"{sorted(CHECKPOINT_KEYS)}, got {ckpt!r}"
            )
    return data


MAX_GRID_POINTS = 256


def split_grid_search(user: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """(the config without its sweeps, {key: values}) for ``key: {grid_search: [...]}``."""
    base, grid = {}, {}
    for key, value in user.items():
        if isinstance(value, dict) and "grid_search" in value:
            values = value["grid_search"]
            if set(value) != {"grid_search"} or not isinstance(values, list) or not values:
                raise UsageError(
                    f"config {key}: a sweep is {{grid_search: [value, ...]}} with at least "
                    f"one value, got {value!r}"
                )
            grid[key] = values
        else:
            base[key] = value
    return base, grid


def build_config(exp: dict[str, Any], overrides: dict[str, Any]):
    """(checked StarPOConfig, grid) for one experiment.

    Every point of a ``grid_search`` sweep is built and checked here, so a bad
    value anywhere in the grid fails before Ray starts; the returned config
    holds the grid's first point.
    """
    from .config import StarPOConfig

    user = dict(exp.get("config") or {})
    if "env" in exp:
        user["env"] = exp["env"]
    user.update(overrides)
    base, grid = split_grid_search(user)
    points = list(itertools.product(*grid.values()))
    if len(points) > MAX_GRID_POINTS:
        raise UsageError(f"the grid has {len(points)} points; at most {MAX_GRID_POINTS}")
    first = None
    for point in points:
        values = dict(zip(grid, point, strict=True))
        config = StarPOConfig.from_user_dict({**base, **values})
        try:
            config.check()
        except ValueError as err:
            raise ValueError(f"{err} (grid point {values})" if grid else str(err)) from err
        if first is None:
            first = config
    return first, grid


def param_space(config, grid: dict[str, list[Any]]) -> Any:
    """What tune.Tuner gets: the config itself, or its dict with tune.grid_search entries."""
    if not grid:
        return config
    from ray import tune

    space = config.to_dict()
    for key, values in grid.items():
        name = key if key in space else {"lambda": "lambda_", "lambda_": "lambda"}.get(key, key)
        space[name] = tune.grid_search(values)
    return space


def check_local_gpus(name: str, config) -> None:
    """Fail now, not as a trial that waits forever for GPUs this machine does not have."""
    learners = max(1, config.num_learners)
    needed = config.num_gpus_per_learner * learners
    needed += config.num_gpus_per_env_runner * max(1, config.num_env_runners)
    if needed <= 0:
        return
    import torch

    have = torch.cuda.device_count()
    if have < needed:
        raise UsageError(
            f"experiment {name!r} asks for {needed:g} GPU(s) (num_gpus_per_learner="
            f"{config.num_gpus_per_learner}, num_learners={config.num_learners}, "
            f"num_gpus_per_env_runner={config.num_gpus_per_env_runner}) and this machine "
            f"has {have}. Use a *_cpu.yaml example, override with --config "
            "'{\"num_gpus_per_learner\": 0}', or set RAY_ADDRESS to join a cluster with GPUs."
        )


def _print_progress():
    from ray import tune

    class Progress(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            r = result.get("rollout", {})
            learner = result.get("learners", {}).get("default_policy", {})
            ev = result.get("evaluation", {})
            line = (
                f"[{trial.trial_id}] iter {result.get('training_iteration')}: "
                f"success {r.get('success_rate', float('nan')):.3f} "
                f"reward {r.get('reward_mean', float('nan')):.3f} "
                f"group-std {r.get('in_group_reward_std', float('nan')):.3f} "
                f"entropy {learner.get('entropy', float('nan')):.3f} "
                f"time {result.get('time_total_s', 0):.0f}s"
            )
            # Evaluation runs every `eval_interval` iterations; between runs the
            # key is absent or NaN.
            ev_success = ev.get("success_rate", float("nan"))
            if ev_success == ev_success:
                line += f" | eval success {ev_success:.3f}"
            print(line, flush=True)

    return Progress()


def train(args: argparse.Namespace) -> int:
    experiments = load_experiments(args.file)
    stop_override = _json_arg(args.stop, "--stop")
    config_override = _json_arg(args.config, "--config")
    configs = {
        name: build_config(exp, config_override) for name, exp in experiments.items()
    }  # every experiment is checked before Ray starts

    if not os.environ.get("RAY_ADDRESS"):  # a local Ray instance: only this machine's GPUs
        for name, (config, _) in configs.items():
            check_local_gpus(name, config)

    import ray
    from ray import tune

    from . import register_with_tune

    register_with_tune()
    if not ray.is_initialized():
        ray.init(include_dashboard=args.dashboard, num_cpus=args.num_cpus, log_to_driver=True)
    status = 0
    for name, exp in experiments.items():
        ckpt = exp.get("checkpoint_config") or {}
        storage = (
            args.storage_path or exp.get("storage_path") or os.path.expanduser("~/ray_results")
        )
        tuner = tune.Tuner(
            exp["run"],  # resolved through Tune's registry, like any registered trainable
            param_space=param_space(*configs[name]),
            run_config=tune.RunConfig(
                name=name,
                storage_path=os.path.abspath(os.path.expanduser(storage)),
                stop={**(exp.get("stop") or {}), **stop_override},
                checkpoint_config=tune.CheckpointConfig(
                    checkpoint_frequency=int(ckpt.get("checkpoint_frequency", 0)),
                    checkpoint_at_end=bool(ckpt.get("checkpoint_at_end", True)),
                    num_to_keep=ckpt.get("num_to_keep"),
                ),
                callbacks=[_print_progress()],
                verbose=1,
            ),
        )
        results = tuner.fit()
        for result in results:
            if result.error:
                print(f"experiment {name!r} failed: {result.error}", file=sys.stderr)
                status = 1
            else:
                print(f"experiment {name!r}: results in {result.path}")
                if result.checkpoint:
                    print(f"  checkpoint: {result.checkpoint.path}")
    return status


def evaluate(args: argparse.Namespace) -> int:
    path = Path(args.checkpoint).expanduser()
    if not path.is_dir():
        raise UsageError(f"checkpoint {str(path)!r} is not a directory")

    import ray

    from . import register_with_tune
    from .algorithm import StarPO

    register_with_tune()
    if not ray.is_initialized():
        ray.init(include_dashboard=False, num_cpus=args.num_cpus)
    algo = StarPO.from_checkpoint(str(path.resolve()))
    try:
        if args.max_turns is not None:
            algo.config._is_frozen = False
            algo.config.max_turns = args.max_turns
            if algo.env_runner is not None:
                algo.env_runner.config.max_turns = args.max_turns
        metrics = algo.evaluate_success(args.num_states, args.temperature, args.seed)
    finally:
        algo.stop()
    print(json.dumps(metrics, indent=2, sort_keys=True))
    print(f"success on {args.num_states} fixed initial states: {metrics['success_rate']:.2%}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rllib", description="ragen-rllib command line")
    sub = parser.add_subparsers(dest="command", required=True)
    p_train = sub.add_parser("train", help="train from an experiment YAML file")
    train_sub = p_train.add_subparsers(dest="source", required=True)
    p_file = train_sub.add_parser("file", help="rllib train file <experiment.yaml>")
    p_file.add_argument("file")
    p_file.add_argument("--stop", help="JSON object merged into every experiment's stop")
    p_file.add_argument("--config", help="JSON object merged into every experiment's config")
    p_file.add_argument("--storage-path", help="where Tune writes results (default ~/ray_results)")
    p_file.add_argument("--num-cpus", type=int, default=None)
    p_file.add_argument("--dashboard", action="store_true", help="start the Ray dashboard")
    p_eval = sub.add_parser("evaluate", help="evaluate a checkpoint on fixed initial states")
    p_eval.add_argument("checkpoint")
    p_eval.add_argument("--num-states", type=int, default=256)
    p_eval.add_argument("--temperature", type=float, default=0.5)
    p_eval.add_argument("--max-turns", type=int, default=None)
    p_eval.add_argument("--seed", type=int, default=0, help="first evaluation seed")
    p_eval.add_argument("--num-cpus", type=int, default=None)
    args = parser.parse_args(argv)
    # Our own progress (e.g. the built-in model's first build) on stderr.
    log = logging.getLogger("ragen_rllib")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("ragen_rllib: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    try:
        return train(args) if args.command == "train" else evaluate(args)
    except UsageError as err:
        print(f"rllib: error: {err}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as err:
        print(f"rllib: invalid configuration: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
