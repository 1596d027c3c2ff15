"""A curriculum: reset options for the training envs that change with the iteration.

The ``curriculum`` setting is a list of stages, each
``{from_iteration: i, reset_options: {...}}``, the first from iteration 0 and
the rest in increasing order. From its iteration on, a stage's options go to
every training env's ``reset(seed=..., options=...)``; evaluation (and the
evaluation suites) always reset without options, so they measure the env's
own distribution. The stage of a batch is that of the sample call that drew
it, which the algorithm checkpoints, so a resumed run is in the same stage.

What the options mean is the env's (``FrozenLakeEnv`` takes ``slip_rate``, the
episode's slip rate). ``SokobanEnv`` takes ``max_solution_length``
and ``min_solution_length`` (the planner's shortest solution, in moves), so a
schedule such as

    curriculum:
      - {from_iteration: 0, reset_options: {max_solution_length: 3}}
      - {from_iteration: 200, reset_options: {max_solution_length: 6}}
      - {from_iteration: 400, reset_options: {}}

trains on rooms solved in at most 3 moves first, and on every room from
iteration 400.
"""

from __future__ import annotations

from typing import Any

Stage = tuple[int, dict[str, Any]]


def parse_curriculum(value: Any) -> list[Stage]:
    """The stages of a ``curriculum`` value (null: none); ValueError naming it."""
    if value is None:
        return []
    example = "e.g. [{from_iteration: 0, reset_options: {max_solution_length: 3}}]"
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(
            f"config curriculum={value!r} is invalid: null or a list of stages, {example}"
        )
    stages: list[Stage] = []
    for i, stage in enumerate(value):
        where = f"config curriculum[{i}]={stage!r} is invalid"
        if not isinstance(stage, dict) or set(stage) != {"from_iteration", "reset_options"}:
            raise ValueError(f"{where}: a mapping with exactly from_iteration and reset_options")
        start, options = stage["from_iteration"], stage["reset_options"]
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise ValueError(f"{where}: from_iteration must be an int >= 0")
        if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
            raise ValueError(f"{where}: reset_options must be a mapping (string keys)")
        if not stages and start != 0:
            raise ValueError(f"{where}: the first stage must start at from_iteration 0")
        if stages and start <= stages[-1][0]:
            raise ValueError(f"{where}: from_iteration must increase from stage to stage")
        stages.append((start, dict(options)))
    return stages


def stage_at(stages: list[Stage], call: int) -> tuple[int, dict[str, Any] | None]:
    """(stage index, reset options) for sample call ``call`` (0-based); (-1, None)
    without a curriculum, and None for a stage with no options."""
    index = -1
    for i, (start, _) in enumerate(stages):
        if call >= start:
            index = i
    if index < 0:
        return -1, None
    return index, (stages[index][1] or None)
