"""Rollout dumps: the sampled batch as Parquet, one row per turn.

Every ``rollout_dump_interval`` iterations the driver writes the batch that
iteration trains on (filtered-out groups included, with ``kept`` false) to
``<trial dir>/rollouts/iter_<iteration>.parquet`` through pyarrow, the file
named by the iteration that sampled it (:func:`dump_due`: with ``online_k`` > 1
a batch is sampled every k iterations only). Each file is
written under a hidden temporary name and renamed into place, so a killed run
leaves complete files only, and readers that skip hidden files (pyarrow
datasets, pandas, DuckDB) never see a partial one::

    import pandas as pd
    turns = pd.read_parquet("~/ray_results/exp/trial/rollouts")
    # duckdb: SELECT * FROM 'rollouts/*.parquet'

The schema (:data:`SCHEMA`, version :data:`SCHEMA_VERSION` in every file's
metadata under ``ragen_rllib.schema_version``) describes each column. A change
that renames, retypes or removes a column raises the version; added columns do
not. Model text is stored as it came: whoever displays it must escape it.

Every dump also sends a few trajectories as text to TensorBoard (the
``rollouts`` text tab), as indented blocks, which TensorBoard's markdown shows
verbatim.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ragen_rllib.records.trajectory import Trajectory, env_name

SCHEMA_VERSION = 1
SCHEMA_KEY = b"ragen_rllib.schema_version"
#: How many trajectories each dump shows in TensorBoard.
TENSORBOARD_SAMPLES = 3

_COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("run", pa.string(), 'the Tune trial name ("default" outside Tune)'),
    ("iteration", pa.int64(), "training iteration that sampled the batch (from 1)"),
    ("policy_version", pa.int64(), "learner updates behind the weights that sampled it"),
    ("policy_lag", pa.int64(), "the learner's policy version at sampling time minus that"),
    ("env_id", pa.string(), "Gymnasium id of the env"),
    ("env_name", pa.string(), "the env's name in the run's mixture (env_mix)"),
    ("seed", pa.int64(), "the initial state's seed"),
    ("group", pa.int64(), "group (initial state) index within the batch"),
    ("trajectory", pa.int64(), "trajectory index within the batch"),
    ("kept", pa.bool_(), "whether the rollout filter kept its group for training"),
    ("turn", pa.int64(), "turn index within the trajectory (from 0)"),
    ("system", pa.string(), "the system message (null: none)"),
    ("prompt", pa.string(), "the user message of the turn, instructions included at turn 0"),
    ("observation", pa.string(), "the env's observation the turn answered"),
    ("response", pa.string(), "the model's answer text (untrusted)"),
    ("actions", pa.list_(pa.string()), "actions the env executed (null if not reported)"),
    ("reward", pa.float64(), "the turn's reward (env reward plus format penalty)"),
    ("format_ok", pa.bool_(), "the answer had the required format (null if not reported)"),
    ("valid", pa.bool_(), "every action was valid (null if not reported)"),
    ("effective", pa.bool_(), "every action changed the state (null if not reported)"),
    ("total_reward", pa.float64(), "the trajectory's summed reward"),
    ("success", pa.bool_(), "the trajectory's success"),
    ("end_reason", pa.string(), "why the trajectory ended"),
    ("num_turns", pa.int64(), "turns in the trajectory"),
    ("context_tokens", pa.int64(), "tokens before this turn's answer in its sequence"),
    ("response_tokens", pa.int64(), "tokens of this turn's answer"),
    ("advantage", pa.float64(), "the turn's advantage (null: the learner computes it)"),
)
SCHEMA = pa.schema(
    [pa.field(name, kind, metadata={"doc": doc}) for name, kind, doc in _COLUMNS],
    metadata={SCHEMA_KEY: str(SCHEMA_VERSION).encode()},
)


def _flag(info: dict[str, Any], key: str) -> bool | None:
    return bool(info[key]) if key in info else None


def turn_rows(
    sampled: Sequence[Trajectory],
    kept: Sequence[Trajectory],
    *,
    run: str,
    iteration: int,
    policy_version: int,
    system: str | None,
) -> pa.Table:
    """The rows of one batch: one per turn of every trajectory in ``sampled``."""
    kept_ids = {id(t) for t in kept}
    rows: dict[str, list[Any]] = {name: [] for name, _, _ in _COLUMNS}
    for index, traj in enumerate(sampled):
        for turn in range(traj.num_turns):
            info = traj.turn_infos[turn]
            seg, start, end = traj.turn_spans[turn]
            executed = info.get("executed_actions")
            advantages = traj.turn_advantages
            row = {
                "run": run,
                "iteration": iteration,
                "policy_version": traj.policy_version,
                "policy_lag": policy_version - traj.policy_version,
                "env_id": traj.env_id,
                "env_name": env_name(traj),
                "seed": traj.seed,
                "group": traj.group,
                "trajectory": index,
                "kept": id(traj) in kept_ids,
                "turn": turn,
                "system": system,
                "prompt": traj.turn_prompts[turn] if turn < len(traj.turn_prompts) else None,
                "observation": traj.turn_observations[turn],
                "response": traj.answers[turn],
                "actions": None if executed is None else [str(a) for a in executed],
                "reward": traj.turn_rewards[turn],
                "format_ok": _flag(info, "format_ok"),
                "valid": _flag(info, "action_is_valid"),
                "effective": _flag(info, "action_is_effective"),
                "total_reward": traj.total_reward,
                "success": bool(traj.success),
                "end_reason": traj.end_reason,
                "num_turns": traj.num_turns,
                "context_tokens": start,
                "response_tokens": end - start,
                "advantage": float(advantages[turn]) if turn < len(advantages) else None,
            }
            for name, value in row.items():
                rows[name].append(value)
    return pa.Table.from_pydict(rows, schema=SCHEMA)


@contextlib.contextmanager
def _atomic(path: Path) -> Iterator[Path]:
    """A hidden temporary path beside ``path``, renamed onto it when the block ends
    without an error, removed otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` through a hidden temporary file in the same folder
    and an atomic rename."""
    with _atomic(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_rollouts(folder: str | os.PathLike) -> pa.Table:
    """Every dump under ``folder`` (a trial's ``rollouts/``), in iteration order;
    raises ValueError for a file of a newer schema version."""
    files = sorted(Path(folder).glob("iter_*.parquet"))
    if not files:
        raise FileNotFoundError(f"no rollout dumps (iter_*.parquet) in {str(folder)!r}")
    tables = []
    for file in files:
        meta = pq.read_schema(file).metadata or {}
        version = int(meta.get(SCHEMA_KEY, b"0"))
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"{file} has rollout schema version {version}; this ragen-rllib reads "
                f"versions up to {SCHEMA_VERSION} (upgrade it)"
            )
        tables.append(pq.read_table(file))
    return pa.concat_tables(tables, promote_options="default")


def trajectory_text(rows: list[dict[str, Any]]) -> str:
    """One trajectory's turns as plain text, for TensorBoard (indented: shown verbatim)."""
    first = rows[0]
    lines = [
        f"{first['env_id']} seed {first['seed']}: reward {first['total_reward']:.3g}, "
        f"success {first['success']}, {first['end_reason']}",
        "",
    ]
    for row in rows:
        advantage = "-" if row["advantage"] is None else f"{row['advantage']:+.3f}"
        lines += [f"turn {row['turn']}: reward {row['reward']:.3g}, advantage {advantage}"]
        lines += ["    " + line for line in row["observation"].splitlines()]
        lines += ["    > " + line for line in (row["response"] or "").splitlines() or [""]]
        lines.append("")
    return "\n".join(lines)


def dump_due(iteration: int, interval: int, online_k: int = 1) -> bool:
    """Whether the batch sampled at ``iteration`` (from 1) is dumped: it serves
    ``iteration`` .. ``iteration + online_k - 1``, and is dumped when one of
    those is a multiple of ``interval``. Tested on the sampling iteration alone,
    ``iteration % interval`` would skip every dump when reuse never lands a
    sample on a multiple (online_k 5 samples at 1, 6, 11, ...; interval 10)."""
    if interval < 1:
        return False
    return (iteration + online_k - 1) // interval > (iteration - 1) // interval


class RolloutDumper:
    """Writes one Parquet file per dumped iteration under ``folder`` and a few
    trajectories to TensorBoard's text tab."""

    def __init__(self, folder: str | os.PathLike, run: str, system: str | None, seed: int):
        self.folder = Path(folder)
        self.run = run
        self.system = system
        self._rng = np.random.default_rng(seed)
        self._writer = None

    def dump(
        self,
        sampled: Sequence[Trajectory],
        kept: Sequence[Trajectory],
        iteration: int,
        policy_version: int,
    ) -> Path:
        table = turn_rows(
            sampled,
            kept,
            run=self.run,
            iteration=iteration,
            policy_version=policy_version,
            system=self.system,
        )
        path = self.folder / f"iter_{iteration:06d}.parquet"
        write_atomic(table, path)
        self._to_tensorboard(table, iteration)
        return path

    def _to_tensorboard(self, table: pa.Table, iteration: int) -> None:
        if table.num_rows == 0:
            return
        if self._writer is None:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(str(self.folder.parent), filename_suffix=".rollouts")
        rows = table.to_pylist()
        ids = sorted({row["trajectory"] for row in rows})
        picks = self._rng.choice(ids, size=min(TENSORBOARD_SAMPLES, len(ids)), replace=False)
        for slot, pick in enumerate(sorted(int(p) for p in picks)):
            turns = [row for row in rows if row["trajectory"] == pick]
            self._writer.add_text(f"rollouts/sample_{slot}", trajectory_text(turns), iteration)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def to_messages(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One trajectory (its rows in turn order) as an OpenAI-style chat record:
    ``messages`` (system, then user/assistant per turn) and its outcome."""
    first = rows[0]
    messages = [{"role": "system", "content": first["system"]}] if first["system"] else []
    for row in rows:
        messages.append({"role": "user", "content": row["prompt"] or row["observation"]})
        messages.append({"role": "assistant", "content": row["response"]})
    keys = ("run", "iteration", "env_id", "seed", "group", "total_reward", "success")
    return {"messages": messages, **{key: first[key] for key in keys}}


def write_jsonl(table: pa.Table, path: str | os.PathLike) -> int:
    """Every trajectory of ``table`` as one JSON line (:func:`to_messages`); returns
    the number written. The file is written atomically."""
    order = [(key, "ascending") for key in ("run", "iteration", "trajectory", "turn")]
    rows = table.sort_by(order).to_pylist()
    count = 0
    with _atomic(Path(path)) as tmp, tmp.open("w", encoding="utf-8") as fh:
        start = 0
        for end in range(1, len(rows) + 1):
            if end == len(rows) or _traj_key(rows[end]) != _traj_key(rows[start]):
                fh.write(json.dumps(to_messages(rows[start:end]), ensure_ascii=False) + "\n")
                count += 1
                start = end
    return count


def _traj_key(row: dict[str, Any]) -> tuple[str, int, int]:
    return row["run"], row["iteration"], row["trajectory"]
