"""The ``rllib`` command: ``rllib train file <yaml>`` and ``rllib evaluate <checkpoint>``.

Ray 2.60 ships no ``rllib`` console script, so the project provides one for the
classic experiment YAML format::

    experiment-name:
      run: StarPO
      env: ragen/SimpleSokoban-v0
      stop: {training_iteration: 200}
      checkpoint_config: {checkpoint_frequency: 10, checkpoint_at_end: true}
      config: {llm: builtin, env_groups: 8, group_size: 16, ...}

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


def check_stop(stop: Any, where: str) -> dict[str, Any]:
    """A Tune stop criterion: a mapping of result name -> finite number (null: none).
    `where` names it in errors ("exp.yaml: experiment 'x' stop", "--stop")."""
    from .config import is_number

    if stop is None:
        return {}
    allowed = (
        "allowed: a mapping of result name -> finite number, e.g. "
        "{training_iteration: 100} (nested results as 'a/b')"
    )
    if not isinstance(stop, dict):
        raise UsageError(f"{where}={stop!r} is invalid; {allowed}")
    for key, value in stop.items():
        if not isinstance(key, str) or not key.strip():
            raise UsageError(f"{where} has the key {key!r}; {allowed}")
        if not is_number(value):
            raise UsageError(f"{where} {key}={value!r} is invalid; {allowed}")
    return stop


def _check_checkpoint_config(ckpt: Any, where: str) -> None:
    from .config import is_int

    allowed = (
        "allowed: a mapping with checkpoint_frequency (integer >= 0, 0: none), "
        "checkpoint_at_end (true/false), num_to_keep (integer >= 1 or null)"
    )
    if ckpt is None:
        return
    if not isinstance(ckpt, dict):
        raise UsageError(f"{where} checkpoint_config={ckpt!r} is invalid; {allowed}")
    unknown = [k for k in ckpt if k not in CHECKPOINT_KEYS]
    if unknown:
        raise UsageError(
            f"{where} checkpoint_config has unknown key(s) {sorted(map(str, unknown))}; "
            f"keys must be among {sorted(CHECKPOINT_KEYS)}"
        )
    tests = {
        "checkpoint_frequency": lambda v: is_int(v) and v >= 0,
        "checkpoint_at_end": lambda v: isinstance(v, bool),
        "num_to_keep": lambda v: v is None or (is_int(v) and v >= 1),
    }
    for key, value in ckpt.items():
        if not tests[key](value):
            raise UsageError(f"{where} checkpoint_config {key}={value!r} is invalid; {allowed}")


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
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{path} cannot be read as a text file: {err}") from err
    if not isinstance(data, dict) or not data:
        raise UsageError(
            f"{path} must map experiment names to experiments (name: {{run: StarPO, env: "
            f"..., config: {{...}}}}), got {type(data).__name__}"
        )
    for name, exp in data.items():
        if not isinstance(name, str) or not name.strip() or "/" in name or "\\" in name:
            raise UsageError(
                f"{path}: experiment name {name!r} is invalid; allowed: a non-empty string "
                "without '/' or '\\' (Tune's results folder is named after it)"
            )
        where = f"{path}: experiment {name!r}"
        if not isinstance(exp, dict):
            raise UsageError(
                f"{where} must be a mapping with keys among {sorted(EXPERIMENT_KEYS)}, got {exp!r}"
            )
        unknown = [k for k in exp if k not in EXPERIMENT_KEYS]
        if unknown:
            raise UsageError(
                f"{where} has unknown key(s) {sorted(map(str, unknown))}; "
                f"allowed: {sorted(EXPERIMENT_KEYS)}"
            )
        if exp.get("run") not in RUNS or not isinstance(exp.get("run"), str):
            raise UsageError(f"{where} run={exp.get('run')!r}; allowed: {RUNS}")
        check_stop(exp.get("stop"), f"{where} stop")
        _check_checkpoint_config(exp.get("checkpoint_config"), where)
        config = exp.get("config")
        if config is not None and not isinstance(config, dict):
            raise UsageError(
                f"{where} config={config!r} is invalid; allowed: a mapping of config "
                "key -> value (or null for the defaults)"
            )
        storage = exp.get("storage_path")
        if storage is not None and (not isinstance(storage, str) or not storage.strip()):
            raise UsageError(
                f"{where} storage_path={storage!r} is invalid; allowed: a directory path "
                "(a string), or null for ~/ray_results"
            )
    return data


MAX_GRID_POINTS = 256


def _find_search_spec(value: Any) -> str | None:
    """'grid_search' or 'eval' if Tune would resolve a dict inside `value`."""
    if isinstance(value, dict):
        if "grid_search" in value:
            return "grid_search"
        if len(value) == 1 and "eval" in value:
            return "eval"
        items = list(value.values())
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        return None
    for item in items:
        found = _find_search_spec(item)
        if found:
            return found
    return None


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
            nested = [v for v in values if _find_search_spec(v)]
            if nested:
                raise UsageError(
                    f"config {key}: a grid_search value must be a plain value, got {nested[0]!r}"
                )
            grid[key] = values
        else:
            spec = _find_search_spec(value)
            if spec:
                raise UsageError(
                    f"config {key}={value!r} is invalid: a sweep is a config key's whole value, "
                    f"{key}: {{grid_search: [value, ...]}}; {{{spec}: ...}} nested inside a "
                    "value is not supported"
                )
            base[key] = value
    return base, grid


def build_config(exp: dict[str, Any], overrides: dict[str, Any], name: str | None = None):
    """(checked StarPOConfig, grid) for one experiment.

    Every point of a ``grid_search`` sweep is built and checked here, so a bad
    value anywhere in the grid fails before Ray starts; the returned config
    holds the grid's first point. With `name` (and no RAY_ADDRESS), every point's
    GPU demand is also checked against this machine's GPUs.
    """
    from .config import StarPOConfig

    config_section = exp.get("config")
    if config_section is not None and not isinstance(config_section, dict):
        raise UsageError(f"experiment config={config_section!r} is invalid; allowed: a mapping")
    user = dict(config_section or {})
    if "env" in exp:
        if "env" in user and user["env"] != exp["env"]:
            raise UsageError(
                f"env is set twice, env={exp['env']!r} in the experiment and "
                f"env={user['env']!r} in its config; give one"
            )
        user["env"] = exp["env"]
    user.update(overrides)
    base, grid = split_grid_search(user)
    points = list(itertools.product(*grid.values()))
    if len(points) > MAX_GRID_POINTS:
        raise UsageError(
            f"the grid over {sorted(grid)} has {len(points)} points; at most {MAX_GRID_POINTS}"
        )
    check_gpus = name is not None and not os.environ.get("RAY_ADDRESS")

    def point_error(err: Exception, values: dict[str, Any]) -> Exception:
        return type(err)(f"{err} (grid point {values})")

    # First every point's cheap checks, then the models (a build or a hub look-up), so
    # that a bad value anywhere in the grid is reported before a model problem.
    configs = []
    for point in points:
        values = dict(zip(grid, point, strict=True))
        try:
            config = StarPOConfig.from_user_dict({**base, **values})
            config.check_values()
            if check_gpus:
                check_local_gpus(name, config)
        except (ValueError, UsageError) as err:
            if not grid:
                raise
            raise point_error(err, values) from err
        configs.append((config, values))
    for config, values in configs:
        try:
            config.check_model()
        except (ValueError, FileNotFoundError) as err:
            if not grid:
                raise
            raise point_error(err, values) from err
    return configs[0][0], grid


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
            timing = result.get("timing", {})
            if timing:
                # Stage times: waiting for the sample, the update, the weight sync; the
                # idle shares of the runners and the learner; the policy lag trained on.
                line += (
                    f" | wait {timing.get('sample_wait_s', 0):.2f}s "
                    f"learn {timing.get('update_s', 0):.2f}s "
                    f"sync {timing.get('sync_s', 0):.2f}s "
                    f"idle runners {timing.get('runner_idle_share', 0):.0%} "
                    f"learner {timing.get('learner_idle_share', 0):.0%} "
                    f"lag {r.get('policy_lag_mean', 0):.1f}"
                )
            print(line, flush=True)

    return Progress()


def check_dashboard_installed() -> None:
    """The dashboard needs Ray's "default" extra; say so before Ray starts without it."""
    import importlib.util

    missing = [
        m for m in ("aiohttp", "opencensus", "prometheus_client") if not importlib.util.find_spec(m)
    ]
    if missing:
        raise UsageError(
            f"--dashboard needs Ray's dashboard packages (missing: {', '.join(missing)}); "
            "install them with: pip install -c constraints.txt 'ragen-rllib[dashboard]' "
            "(or 'ray[default]' at the installed ray version)"
        )


def check_resumable(path: str, name: str) -> None:
    """Fail before Ray starts when there is nothing to resume or a checkpoint is damaged."""
    from ray import tune

    from .checkpoint import CorruptCheckpointError, verify_checkpoint

    if not tune.Tuner.can_restore(path):
        raise UsageError(
            f"--resume: no experiment {name!r} to resume under {path}; check --storage-path, "
            "or run without --resume to start it"
        )
    for trial in sorted(Path(path).glob("*/")):
        checkpoints = sorted(trial.glob("checkpoint_*"))
        if checkpoints:  # Tune resumes each trial from its newest checkpoint
            try:
                verify_checkpoint(checkpoints[-1])
            except CorruptCheckpointError as err:
                raise UsageError(
                    f"--resume: {err}. Delete that checkpoint folder to resume from the one "
                    "before it."
                ) from err


def train(args: argparse.Namespace) -> int:
    experiments = load_experiments(args.file)
    stop_override = check_stop(_json_arg(args.stop, "--stop"), "--stop")
    config_override = _json_arg(args.config, "--config")
    if args.num_cpus is not None and args.num_cpus < 1:
        raise UsageError(f"--num-cpus {args.num_cpus} is invalid; allowed: an integer >= 1")
    # Every experiment (every grid point, and its GPUs when Ray is local) is checked
    # before Ray starts.
    configs = {
        name: build_config(exp, config_override, name=name) for name, exp in experiments.items()
    }
    storages = {
        name: os.path.abspath(
            os.path.expanduser(args.storage_path or exp.get("storage_path") or "~/ray_results")
        )
        for name, exp in experiments.items()
    }
    if args.resume:
        for name in experiments:
            check_resumable(os.path.join(storages[name], name), name)
    if args.dry_run:
        for name, (_, grid) in configs.items():
            points = len(list(itertools.product(*grid.values())))
            print(f"experiment {name!r}: OK ({points} config(s) checked)")
        return 0

    import ray
    from ray import tune

    from . import register_with_tune

    register_with_tune()
    # Tune snapshots its experiment state (trial statuses, their newest checkpoints,
    # result.json) into the storage path every few seconds by default; a run killed
    # between two snapshots would resume from an older checkpoint and lose the rows of
    # the iterations since. Snapshot on every step of Tune's loop instead: it writes a
    # small JSON file and copies the trial logs, cheap next to an LLM iteration.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")
    if not ray.is_initialized():
        if args.dashboard:
            check_dashboard_installed()
        context = ray.init(
            include_dashboard=args.dashboard,
            dashboard_host="127.0.0.1",  # this machine only; tunnel it to look from elsewhere
            num_cpus=args.num_cpus,
            log_to_driver=True,
        )
        if args.dashboard:
            print(f"Ray dashboard: http://{context.dashboard_url}", flush=True)
    status = 0
    for name, exp in experiments.items():
        ckpt = exp.get("checkpoint_config") or {}
        storage = storages[name]
        if args.resume:
            # Tune's own restore: finished trials stay finished, the others go on from
            # their newest checkpoint (weights, optimizer, counters, RNG states).
            tuner = tune.Tuner.restore(
                os.path.join(storage, name),
                trainable=exp["run"],
                param_space=param_space(*configs[name]),
                resume_unfinished=True,
                resume_errored=True,
            )
        else:
            tuner = tune.Tuner(
                exp["run"],  # resolved through Tune's registry, like any registered trainable
                param_space=param_space(*configs[name]),
                run_config=tune.RunConfig(
                    name=name,
                    storage_path=storage,
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
    from .checkpoint import CorruptCheckpointError, verify_checkpoint

    path = Path(args.checkpoint).expanduser()
    if not path.is_dir():
        raise UsageError(f"checkpoint {str(path)!r} is not a directory")
    try:
        verify_checkpoint(path)
    except CorruptCheckpointError as err:
        raise UsageError(str(err)) from err

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
    p_file.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run of this file (same --storage-path) from each "
        "trial's newest checkpoint, through Tune's restore",
    )
    p_file.add_argument(
        "--dry-run",
        action="store_true",
        help="load the file and check every experiment (every grid point, and the GPUs "
        "it asks for), print what was checked and exit 0, without starting Ray",
    )
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
