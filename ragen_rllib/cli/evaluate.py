"""``rllib evaluate <checkpoint>``: success and pass@k on fixed initial states, as JSON.

The states, temperature and seeds default to the checkpoint's own evaluation
settings (``eval_num_states``, ``eval_temperature``, ``eval_seed``: the paper's
256 states at temperature 0.5 unless the run changed them). ``--suite NAME``
(repeatable) evaluates an evaluation suite instead of the training env: a
built-in suite, or one the run configured in ``eval_suites``; the JSON is then
suite -> env -> metrics. ``--samples-per-state`` and ``--pass-k`` set how many
answers each state gets and which pass@k are reported. ``--trajectories PATH``
keeps every evaluation trajectory as Parquet, one row per turn, in the schema of
the training runs' rollout dumps (read it with pandas, DuckDB or pyarrow).
Progress goes to stderr; the JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ragen_rllib.algorithms.starpo.checkpoint import CorruptCheckpointError, verify_checkpoint
from ragen_rllib.cli.experiments import UsageError
from ragen_rllib.env_choice.eval_suites import suite_entries


def evaluate(args: argparse.Namespace) -> int:
    path = Path(args.checkpoint).expanduser()
    if not path.is_dir():
        raise UsageError(f"checkpoint {str(path)!r} is not a directory")
    try:
        verify_checkpoint(path)
    except CorruptCheckpointError as err:
        raise UsageError(str(err)) from err

    start = time.perf_counter()

    def say(text: str) -> None:
        print(f"rllib evaluate: {text} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)

    import ray

    from ragen_rllib import register_with_tune
    from ragen_rllib.algorithms.starpo.starpo import StarPO

    say(f"starting Ray and loading {path}")
    register_with_tune()
    if not ray.is_initialized():
        ray.init(include_dashboard=False, num_cpus=args.num_cpus)
    algo = StarPO.from_checkpoint(str(path.resolve()))
    trajectories: list | None = [] if args.trajectories else None
    try:
        overrides = {
            "max_turns": args.max_turns,
            "eval_samples_per_state": args.samples_per_state,
            "eval_pass_k": args.pass_k,
        }
        _override(algo, {key: value for key, value in overrides.items() if value is not None})
        kwargs = {"num_states": args.num_states, "temperature": args.temperature}
        kwargs["first_seed"] = args.seed
        kwargs["trajectories"] = trajectories
        cfg = algo.config
        temperature = cfg.eval_temperature if args.temperature is None else args.temperature
        say(
            f"evaluating {args.num_states or cfg.eval_num_states} states x "
            f"{cfg.eval_samples_per_state} answer(s) at temperature {temperature:g}, up to "
            f"{cfg.max_turns} turn(s) each, on "
            + (f"suite(s) {', '.join(args.suite)}" if args.suite else cfg.env)
        )
        if args.suite:
            suites = _suites(algo.config, args.suite)
            metrics = algo.evaluate_suites(suites, **kwargs)
        else:
            metrics = algo.evaluate_success(**kwargs)
    finally:
        algo.stop()
    say("done")
    if trajectories is not None:
        _write_trajectories(trajectories, Path(args.trajectories).expanduser(), path, algo)
    text = json.dumps(metrics, indent=2, sort_keys=True)
    print(text)
    if args.output:
        Path(args.output).expanduser().write_text(text + "\n")
    states = args.num_states or algo.config.eval_num_states
    samples = algo.config.eval_samples_per_state
    where = f"{states} fixed initial states x {samples} answer(s)"
    rows = (
        [(f"{suite}/{env}", m) for suite, envs in metrics.items() for env, m in envs.items()]
        if args.suite
        else [(algo.config.env, metrics)]
    )
    for name, m in rows:
        passes = " ".join(f"{k} {v:.2%}" for k, v in sorted(m.items()) if k.startswith("pass@"))
        print(f"{name}: success {m.get('success_rate', float('nan')):.2%} {passes} ({where})")
    return 0


def _write_trajectories(trajectories: list, out: Path, checkpoint: Path, algo) -> None:
    from ragen_rllib.algorithms.starpo.rollout_dump import turn_rows, write_atomic
    from ragen_rllib.env_choice.env_mix import format_of, mix_entries

    table = turn_rows(
        trajectories,
        trajectories,
        run=f"evaluate {checkpoint}",
        iteration=algo.iteration,
        policy_version=max((t.policy_version for t in trajectories), default=0),
        system=format_of(mix_entries(algo.config)[0], algo.config).system,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(table, out)
    print(
        f"rllib evaluate: {len(trajectories)} trajectories ({table.num_rows} turns) in {out}",
        file=sys.stderr,
    )


def _override(algo, values: dict) -> None:
    """Evaluation settings given on the command line, in the driver's config and in
    every env runner's."""
    if not values:
        return

    def apply(holder) -> None:  # a frozen config is replaced by an edited copy
        config = holder.config.copy(copy_frozen=False)
        for key, value in values.items():
            setattr(config, key, value)
        config.freeze()
        holder.config = config

    apply(algo)
    algo.config.check_values()  # e.g. a k above the samples per state names its key
    algo.env_runner_group.foreach_env_runner(apply)


def _suites(config, names: list[str]) -> dict:
    """The suites called ``names``: the run's own (``eval_suites``) first, then the
    built-in ones."""
    from ragen_rllib.env_choice.eval_suites import BUILTIN_SUITES, resolve_suites

    configured = dict(suite_entries(config.eval_suites))
    unknown = [n for n in names if n not in configured and n not in BUILTIN_SUITES]
    if unknown:
        raise UsageError(
            f"--suite {unknown}: not a suite of this run ({sorted(configured)}) nor a "
            f"built-in suite ({sorted(BUILTIN_SUITES)})"
        )
    own = config.eval_suites if isinstance(config.eval_suites, dict) else {}
    return resolve_suites(config, {name: own.get(name, name) for name in names})
