"""The ``rllib`` command: ``rllib train file <yaml>``, ``rllib plan <yaml>``,
``rllib evaluate <checkpoint>``, ``rllib export <checkpoint> <dir>``,
``rllib rollouts <run dir>`` and ``rllib report <run dir>``.

Ray 2.60 ships no ``rllib`` console script, so the project provides one for the
classic experiment YAML format (:mod:`ragen_rllib.cli.experiments`); training
runs through Ray Tune (:mod:`ragen_rllib.cli.train`), evaluation loads a
checkpoint (:mod:`ragen_rllib.cli.evaluate`), and export writes its actor as a
Hugging Face model (:mod:`ragen_rllib.cli.export`).
"""

from __future__ import annotations

import argparse
import logging
import sys

from ragen_rllib.cli.evaluate import evaluate
from ragen_rllib.cli.experiments import UsageError
from ragen_rllib.cli.export import export
from ragen_rllib.cli.plan import add_hardware_flags, plan_command
from ragen_rllib.cli.report import report
from ragen_rllib.cli.rollouts import rollouts
from ragen_rllib.cli.train import train
from ragen_rllib.env_choice.eval_suites import BUILTIN_SUITES


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ragen-rllib")
    except metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The `rllib` command's arguments, every one with its help."""
    parser = argparse.ArgumentParser(prog="rllib", description="ragen-rllib command line")
    parser.add_argument("--version", action="version", version=f"ragen-rllib {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_train = sub.add_parser("train", help="train from an experiment YAML file")
    train_sub = p_train.add_subparsers(dest="source", required=True)
    p_file = train_sub.add_parser("file", help="rllib train file <experiment.yaml>")
    p_file.add_argument("file", help="an experiment YAML file (tuned_examples/ holds examples)")
    p_file.add_argument("--stop", help="JSON object merged into every experiment's stop")
    p_file.add_argument("--config", help="JSON object merged into every experiment's config")
    p_file.add_argument("--storage-path", help="where Tune writes results (default ~/ray_results)")
    p_file.add_argument(
        "--num-cpus", type=int, default=None, help="CPUs Ray may use (default: all of them)"
    )
    p_file.add_argument("--dashboard", action="store_true", help="start the Ray dashboard")
    p_file.add_argument(
        "--wandb",
        metavar="PROJECT",
        help="also log every trial to Weights & Biases (Tune's WandbLoggerCallback; "
        "WANDB_MODE=offline writes to disk)",
    )
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
        "it asks for), print each one's placement and memory plan (as rllib plan) and "
        "exit, without starting Ray",
    )
    add_hardware_flags(p_file)
    p_plan = sub.add_parser(
        "plan",
        help="where each piece of each experiment runs and the memory of every device, "
        "from the model's config.json (no weights, no Ray)",
    )
    p_plan.add_argument("file", help="an experiment YAML file")
    p_plan.add_argument("--config", help="JSON object merged into every experiment's config")
    add_hardware_flags(p_plan)
    p_eval = sub.add_parser("evaluate", help="evaluate a checkpoint on fixed initial states")
    p_eval.add_argument("checkpoint", help="a checkpoint folder of a StarPO run")
    p_eval.add_argument(
        "--num-states", type=int, default=None, help="default: the run's eval_num_states"
    )
    p_eval.add_argument(
        "--temperature", type=float, default=None, help="default: the run's eval_temperature"
    )
    p_eval.add_argument("--max-turns", type=int, default=None, help="default: the run's max_turns")
    p_eval.add_argument(
        "--seed", type=int, default=None, help="first evaluation seed (default: eval_seed)"
    )
    p_eval.add_argument(
        "--suite",
        action="append",
        help="an evaluation suite (the run's eval_suites, or built-in: "
        f"{', '.join(BUILTIN_SUITES)}) instead of the training env; may be given several times",
    )
    p_eval.add_argument(
        "--samples-per-state",
        type=int,
        default=None,
        help="answers per state (default: the run's eval_samples_per_state)",
    )
    p_eval.add_argument(
        "--pass-k", type=int, nargs="+", default=None, help="default: the run's eval_pass_k"
    )
    p_eval.add_argument("--output", help="also write the JSON to this file")
    p_eval.add_argument(
        "--trajectories",
        metavar="PATH",
        help="keep every evaluation trajectory in this Parquet file (one row per turn)",
    )
    p_eval.add_argument(
        "--num-cpus", type=int, default=None, help="CPUs Ray may use (default: all of them)"
    )
    p_export = sub.add_parser(
        "export", help="write a checkpoint's actor as a Hugging Face model directory"
    )
    p_export.add_argument("checkpoint", help="a checkpoint folder of a StarPO run")
    p_export.add_argument("dir", help="a new (or empty) folder for the model")
    p_export.add_argument(
        "--with-critic", action="store_true", help="also write the critic to <dir>/critic"
    )
    p_export.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the weights' dtype in the folder (default: float32)",
    )
    p_rollouts = sub.add_parser(
        "rollouts", help="convert a run's Parquet rollout dumps (rollout_dump_interval)"
    )
    p_rollouts.add_argument("run_dir", help="a trial folder or an experiment folder")
    p_rollouts.add_argument(
        "--to", choices=("jsonl",), default="jsonl", help="the output format (JSON lines)"
    )
    p_rollouts.add_argument("--output", help="default: <run_dir>/rollouts.jsonl")
    p_report = sub.add_parser(
        "report", help="PNG curves and a self-contained report.html of a run or a sweep"
    )
    p_report.add_argument("run_dir", help="a trial folder or an experiment folder")
    p_report.add_argument("--output", help="default: <run_dir>/report")
    p_report.add_argument(
        "--max-trajectories",
        type=int,
        default=5000,
        help="trajectories per trial in the browser, spread over the dumps (default 5000)",
    )
    sub.add_parser(
        "keys",
        help="every config key with its default, what it does and what it may be "
        "(markdown; docs/config.md)",
    )
    return parser


def keys(args: argparse.Namespace) -> int:
    from ragen_rllib.algorithms.starpo.config.knobs import knob_table

    print(knob_table(), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Our own progress (e.g. the built-in model's first build) on stderr.
    log = logging.getLogger("ragen_rllib")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("ragen_rllib: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    try:
        commands = {
            "train": train,
            "evaluate": evaluate,
            "export": export,
            "rollouts": rollouts,
            "report": report,
            "plan": plan_command,
            "keys": keys,
        }
        return commands[args.command](args)
    except UsageError as err:
        print(f"rllib: error: {err}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as err:
        print(f"rllib: invalid configuration: {err}", file=sys.stderr)
        return 2
