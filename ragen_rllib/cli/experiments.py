"""Experiment files: loading, checking and building every config before Ray starts.

The classic RLlib experiment YAML format::

    experiment-name:
      run: StarPO
      env: ragen/SimpleSokoban-v0
      stop: {training_iteration: 200}
      checkpoint_config: {checkpoint_frequency: 10, checkpoint_at_end: true}
      config: {llm: builtin, env_groups: 8, group_size: 16, ...}

A config value may be a sweep, ``lr: {grid_search: [1.0e-4, 3.0e-4]}``: Tune then
runs one trial per point of the grid. Every experiment's config (every grid
point) is built and checked here, so a typo or a bad value fails in a second
with a message that names it.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

EXPERIMENT_KEYS = {"run", "env", "stop", "config", "checkpoint_config", "storage_path"}
CHECKPOINT_KEYS = {"checkpoint_frequency", "checkpoint_at_end", "num_to_keep"}
RUNS = ("StarPO",)


class UsageError(Exception):
    """A problem with the command line or the experiment file: printed, exit code 2."""


def json_arg(text: str | None, flag: str) -> dict[str, Any]:
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
    from ragen_rllib.algorithms.starpo.config.rules import is_number

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
    from ragen_rllib.algorithms.starpo.config.rules import is_int

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


def build_config(
    exp: dict[str, Any],
    overrides: dict[str, Any],
    name: str | None = None,
    *,
    hardware=None,
    model: bool = True,
):
    """(checked StarPOConfig, grid) for one experiment.

    Every point of a ``grid_search`` sweep is built and checked here, so a bad
    value anywhere in the grid fails before Ray starts; the returned config
    holds the grid's first point. With `name`, every point's GPU demand is also
    checked against `hardware` (default: this machine's GPUs, unless RAY_ADDRESS
    names a cluster). ``model=False`` skips loading the model (a plan for
    another machine reads only its shape).
    """
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

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
    check_gpus = name is not None and (hardware is not None or not os.environ.get("RAY_ADDRESS"))

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
                check_gpus_available(name, config, hardware)
        except (ValueError, UsageError) as err:
            if not grid:
                raise
            raise point_error(err, values) from err
        configs.append((config, values))
    for config, values in configs if model else ():
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
        if key in ("agent", "agent_tasks"):  # a trial may start in another directory
            from ragen_rllib.agents.programs import resolve_path

            values = [resolve_path(v) for v in values]
        space[name] = tune.grid_search(values)
    return space


def check_gpus_available(name: str, config, hardware=None) -> None:
    """Fail now, not as a trial that waits forever for GPUs the machine (or the
    described cluster) does not have."""
    from ragen_rllib.planning.placement import gpus_asked, local_hardware

    needed = gpus_asked(config)
    if needed <= 0:
        return
    hardware = hardware or local_hardware()
    have = hardware.nodes * hardware.gpus_per_node
    if have < needed:
        raise UsageError(
            f"experiment {name!r} asks for {needed:g} GPU(s) (num_gpus_per_learner="
            f"{config.num_gpus_per_learner}, num_learners={config.num_learners}, "
            f"num_gpus_per_env_runner={config.num_gpus_per_env_runner}, num_env_runners="
            f"{config.num_env_runners}) and {hardware.source} has {have}. Use a *_cpu.yaml "
            "example, override with --config '{\"num_gpus_per_learner\": 0}', describe the "
            "target with --gpus/--gpu-memory (--dry-run, rllib plan), or set RAY_ADDRESS to "
            "join a cluster with GPUs."
        )
