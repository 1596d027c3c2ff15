"""``rllib evaluate <checkpoint>``: success on fixed initial states, as JSON.

The states, temperature and seeds default to the checkpoint's own evaluation
settings (``eval_num_states``, ``eval_temperature``, ``eval_seed``: the paper's
256 states at temperature 0.5 unless the run changed them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragen_rllib.algorithms.starpo.checkpoint import CorruptCheckpointError, verify_checkpoint
from ragen_rllib.cli.experiments import UsageError


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
        if args.max_turns is not None:
            algo.config._is_frozen = False
            algo.config.max_turns = args.max_turns
            if algo.env_runner is not None:
                algo.env_runner.config.max_turns = args.max_turns
        metrics = algo.evaluate_success(args.num_states, args.temperature, args.seed)
    finally:
        algo.stop()
    print(json.dumps(metrics, indent=2, sort_keys=True))
    states = args.num_states or algo.config.eval_num_states
    print(f"success on {states} fixed initial states: {metrics['success_rate']:.2%}")
    return 0
