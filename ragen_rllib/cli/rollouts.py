"""``rllib rollouts <run dir> --to jsonl``: a run's Parquet rollout dumps as chat records.

``<run dir>`` is a trial folder or an experiment folder (every trial's
``rollouts/`` under it). Each trajectory becomes one JSON line with OpenAI-style
``messages`` (system, then user and assistant per turn) and its outcome, for
supervised fine-tuning and for tools that read chat transcripts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ragen_rllib.cli.experiments import UsageError


def rollout_folders(run_dir: Path) -> list[Path]:
    """Every trial's ``rollouts/`` folder at or under ``run_dir``."""
    if not run_dir.is_dir():
        raise UsageError(f"{str(run_dir)!r} is not a directory")
    folders = sorted(p for p in run_dir.rglob("rollouts") if p.is_dir())
    if not folders:
        raise UsageError(
            f"no rollouts/ folder under {str(run_dir)!r}: set rollout_dump_interval >= 1 "
            "in the run's config to dump rollouts"
        )
    return folders


def rollouts(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from ragen_rllib.algorithms.starpo.rollout_dump import read_rollouts, write_jsonl

    run_dir = Path(args.run_dir).expanduser()
    table = pa.concat_tables(
        [read_rollouts(folder) for folder in rollout_folders(run_dir)],
        promote_options="default",
    )
    out = Path(args.output).expanduser() if args.output else run_dir / "rollouts.jsonl"
    count = write_jsonl(table, out)
    print(f"wrote {count} trajectories ({table.num_rows} turns) to {out}")
    return 0
