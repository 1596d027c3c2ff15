"""``rllib evaluate <checkpoint>``: success and pass@k on fixed initial states, as JSON.

The states, temperature and seeds default to the checkpoint's own evaluation
settings (``eval_num_states``, ``eval_temperature``, ``eval_seed``: the paper's
256 states at temperature 0.5 unless the run changed them). ``--suite NAME``
(repeatable) evaluates an evaluation suite instead of the training env: a
built-in suite, or one the run configured in ``eval_suites``; the JSON is then
suite -> env -> metrics. ``--samples-per-state`` and ``--pass-k`` set how many
answers each state gets and which pass@k are reported.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragen_rllib.algorithms.starpo.checkpoint import CorruptCheckpointError, verify_checkpoint
from ragen_rllib.cli.experiments import UsageError
from ragen_rllib.env_runner.eval_suites import suite_entries


def evaluate(args: argparse.Namespace) -> int:
    path = Path(args.checkpoint).expanduser()
    if not path.is_dir():
        raise UsageError(f"checkpoint {str(path)!r} is not a directory")
    try:
        verify_checkpoint(path)
    except CorruptCheckpointError as err:
        raise UsageError(str(err)) from err

    import ray

    from ragen_rllib import register_with_tune
    from ragen_rllib.algorithms.starpo.starpo import StarPO

    register_with_tune()
    if not ray.is_initialized():
        ray.init(include_dashboard=False, num_cpus=args.num_cpus)
    algo = StarPO.from_checkpoint(str(path.resolve()))
    try:
        overrides = {
            "max_turns": args.max_turns,
            "eval_samples_per_state": args.samples_per_state,
            "eval_pass_k": args.pass_k,
        }
        _override(algo, {key: value for key, value in overrides.items() if value is not None})
        kwargs = {"num_states": args.num_states, "temperature": args.temperature}
        kwargs["first_seed"] = args.seed
        if args.suite:
            suites = _suites(algo.config, args.suite)
            metrics = algo.evaluate_suites(suites, **kwargs)
        else:
            metrics = algo.evaluate_success(**kwargs)
    finally:
        algo.stop()
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


def _override(algo, values: dict) -> None:
    """Evaluation settings given on the command line, in the driver's config and in
    every env runner's."""
    if not values:
        return

    def apply(config) -> None:
        config._is_frozen = False
        for key, value in values.items():
            setattr(config, key, value)

    apply(algo.config)
    algo.config.check_values()  # e.g. a k above the samples per state names its key
    algo.env_runner_group.foreach_env_runner(lambda runner: apply(runner.config))


def _suites(config, names: list[str]) -> dict:
    """The suites called ``names``: the run's own (``eval_suites``) first, then the
    built-in ones."""
    from ragen_rllib.env_runner.eval_suites import BUILTIN_SUITES, resolve_suites

    configured = dict(suite_entries(config.eval_suites))
    unknown = [n for n in names if n not in configured and n not in BUILTIN_SUITES]
    if unknown:
        raise UsageError(
            f"--suite {unknown}: not a suite of this run ({sorted(configured)}) nor a "
            f"built-in suite ({sorted(BUILTIN_SUITES)})"
        )
    own = config.eval_suites if isinstance(config.eval_suites, dict) else {}
    return resolve_suites(config, {name: own.get(name, name) for name in names})
