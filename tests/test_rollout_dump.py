"""Parquet rollout dumps: what a dump holds, who reads it, and what a killed writer leaves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_script, tiny_dict

from ragen_rllib.algorithms.starpo.rollout_dump import (
    SCHEMA,
    SCHEMA_KEY,
    SCHEMA_VERSION,
    dump_due,
    read_rollouts,
    write_atomic,
)
from ragen_rllib.cli import main

TRAIN = """
import json, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False)
algo = StarPOConfig.from_user_dict(CONFIG).build_algo()
rows = []
for _ in range(2):
    r = algo.train()
    rows.append({"turns": r["counters"]["num_turns_lifetime"],
                 "dump_s": r["timers"].get("rollout_dump")})
print(json.dumps({"dir": algo.trial_dir, "rows": rows}))
algo.stop()
"""


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dump")
    config = tiny_dict(
        env="ragen/FrozenLakeNoSlip-v0",
        max_turns=3,
        env_groups=4,
        filter_keep_ratio=0.5,
        rollout_dump_interval=1,
        prompt_style="compact",
        env_config={"instructions": "compact"},
    )
    out = run_script(TRAIN, tmp, define={"CONFIG": config})
    return tmp, Path(out["dir"]), out["rows"]


@pytest.mark.slow
def test_a_dump_has_one_row_per_turn_and_the_documented_schema(dumped):
    _, trial, rows = dumped
    files = sorted((trial / "rollouts").glob("*.parquet"))
    assert [f.name for f in files] == ["iter_000001.parquet", "iter_000002.parquet"]
    table = read_rollouts(trial / "rollouts")
    assert table.schema.equals(SCHEMA, check_metadata=False)
    assert pq.read_schema(files[0]).metadata[SCHEMA_KEY] == str(SCHEMA_VERSION).encode()
    assert table.num_rows == rows[-1]["turns"]  # every turn sampled, filtered ones too
    assert all(r["dump_s"] is not None and r["dump_s"] >= 0 for r in rows)
    turns = table.to_pylist()
    # The filter kept half the groups: both kinds are there, and only kept turns
    # have advantages (GRPO's, set in the driver).
    assert {t["kept"] for t in turns} == {True, False}
    assert all((t["advantage"] is not None) == t["kept"] for t in turns)
    for t in turns:
        assert t["env_id"] == "ragen/FrozenLakeNoSlip-v0" and t["run"] == "default"
        assert t["response_tokens"] > 0 and t["context_tokens"] > 0
        assert t["policy_lag"] == 0 and t["iteration"] in (1, 2)
        assert t["observation"] in t["prompt"]
        assert t["format_ok"] in (True, False) and t["actions"] is not None
    by_traj = {}
    for t in turns:
        by_traj.setdefault((t["iteration"], t["trajectory"]), []).append(t)
    for traj in by_traj.values():
        assert [t["turn"] for t in traj] == list(range(traj[0]["num_turns"]))
        assert sum(t["reward"] for t in traj) == pytest.approx(traj[0]["total_reward"])
        assert "Reach the goal" in traj[0]["prompt"]  # the instructions open turn 0


@pytest.mark.slow
def test_pandas_and_duckdb_read_the_dumps_as_they_are(dumped):
    import duckdb
    import pandas as pd

    _, trial, rows = dumped
    frame = pd.read_parquet(trial / "rollouts")
    assert len(frame) == rows[-1]["turns"]
    glob = str(trial / "rollouts" / "*.parquet")
    per_iter = duckdb.sql(
        f"SELECT iteration, count(*) AS n FROM '{glob}' GROUP BY iteration ORDER BY iteration"
    ).fetchall()
    assert sum(n for _, n in per_iter) == len(frame)
    assert [i for i, _ in per_iter] == [1, 2]


@pytest.mark.slow
def test_tensorboard_gets_sample_trajectories(dumped):
    _, trial, _ = dumped
    events = list(trial.glob("events.out.tfevents.*.rollouts"))
    assert len(events) == 1
    blob = events[0].read_bytes()
    assert b"rollouts/sample_0" in blob and b"ragen/FrozenLakeNoSlip-v0 seed" in blob


@pytest.mark.slow
def test_rollouts_command_writes_chat_records(dumped, capsys):
    tmp, trial, _ = dumped
    table = read_rollouts(trial / "rollouts")
    out = tmp / "chats.jsonl"
    assert main(["rollouts", str(trial), "--to", "jsonl", "--output", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    trajectories = {(r["iteration"], r["trajectory"]) for r in table.to_pylist()}
    assert len(records) == len(trajectories)
    assert f"wrote {len(records)} trajectories" in capsys.readouterr().out
    for record in records:
        roles = [m["role"] for m in record["messages"]]
        # compact prompt style: no system message; then user/assistant per turn.
        assert roles == ["user", "assistant"] * (len(roles) // 2) and roles
        assert all(isinstance(m["content"], str) for m in record["messages"])
        assert set(record) >= {"env_id", "seed", "total_reward", "success"}


def test_rollouts_command_names_a_run_without_dumps(tmp_path, capsys):
    assert main(["rollouts", str(tmp_path)]) == 2
    assert "rollout_dump_interval" in capsys.readouterr().err


def _table(n: int) -> pa.Table:
    """n rows of the dump schema with long texts (a file that takes a while to write)."""
    text = "x" * 2000
    cols = {}
    for field in SCHEMA:
        if pa.types.is_string(field.type):
            cols[field.name] = [f"{text}{i}" for i in range(n)]
        elif pa.types.is_list(field.type):
            cols[field.name] = [["Up"]] * n
        elif pa.types.is_boolean(field.type):
            cols[field.name] = [bool(i % 2) for i in range(n)]
        else:
            cols[field.name] = list(range(n))
    return pa.Table.from_pydict(cols, schema=SCHEMA)


def test_a_newer_schema_version_is_refused(tmp_path):
    table = _table(3).replace_schema_metadata({SCHEMA_KEY: str(SCHEMA_VERSION + 1).encode()})
    write_atomic(table, tmp_path / "iter_000001.parquet")
    with pytest.raises(ValueError, match=f"schema version {SCHEMA_VERSION + 1}"):
        read_rollouts(tmp_path)


WRITER = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_rollout_dump import _table
from ragen_rllib.algorithms.starpo.rollout_dump import write_atomic
table = _table(20000)
print("ready", flush=True)
for i in range(1, 10**6):
    write_atomic(table, Path({folder!r}) / f"iter_{{i:06d}}.parquet")
"""


def test_a_killed_writer_leaves_only_whole_files(tmp_path):
    import pandas as pd

    folder = tmp_path / "rollouts"
    code = WRITER.format(tests=str(Path(__file__).parent), folder=str(folder))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.time() + 60
    while len(list(folder.glob("iter_*.parquet"))) < 2 and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.137)  # most likely inside a write
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    whole = sorted(folder.glob("iter_*.parquet"))
    assert len(whole) >= 2
    # Every visible file is complete; readers skip the hidden temporary file.
    assert read_rollouts(folder).num_rows == 20000 * len(whole)
    assert len(pd.read_parquet(folder)) == 20000 * len(whole)


@pytest.mark.parametrize("online_k", [1, 2, 3, 5, 7, 10])
@pytest.mark.parametrize("interval", [1, 3, 10])
def test_reused_batches_are_dumped_once_per_interval(interval, online_k):
    # A batch is sampled every online_k iterations and serves that many; the one
    # serving each multiple of the interval is dumped, and no other.
    sampled_at = range(1, 200, online_k)
    dumped = [i for i in sampled_at if dump_due(i, interval, online_k)]
    served = {i: range(i, i + online_k) for i in sampled_at}
    multiples = range(interval, sampled_at[-1] + online_k, interval)  # all served
    assert dumped == sorted({i for i in sampled_at for m in multiples if m in served[i]})
    assert dumped and all(any(m in served[i] for i in dumped) for m in multiples)
    assert not dump_due(5, 0, online_k)  # interval 0: off


def test_without_reuse_the_dump_is_every_nth_iteration():
    assert [i for i in range(1, 31) if dump_due(i, 10)] == [10, 20, 30]
    # online_k 5, interval 10: the batches sampled at 6, 16, 26 serve 10, 20, 30.
    assert [i for i in range(1, 31, 5) if dump_due(i, 10, 5)] == [6, 16, 26]
