"""docs/architecture.md's walk is the code's: one iteration traced from the env's
``reset()`` enters the files its table lists, in that order (tests/walk_trace.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import walk_trace

HERE = Path(__file__).parent


def test_the_architecture_walk_is_the_traced_one(tmp_path):
    out = subprocess.run(
        [sys.executable, str(HERE / "walk_trace.py"), "--json"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    order = [tuple(step) for step in json.loads(out.stdout.strip().splitlines()[-1])]
    # the trace followed the trajectory: the env, the engine, the loss, the weights back
    files = [rel for rel, _ in order]
    needed = ("envs/core/base.py", "ragen_rllib/engines/hf_engine.py",
              "ragen_rllib/learner/loss_terms.py", "ragen_rllib/distributed/wire.py")  # fmt: skip
    assert set(needed) <= set(files), (needed, files)
    assert files.index("envs/core/base.py") < files.index("ragen_rllib/learner/loss_terms.py")
    assert walk_trace.held() == walk_trace.table(order), "run: python tests/walk_trace.py --write"


def test_the_walk_table_counts_files_folders_and_moves():
    order = [("envs/a.py", "reset"), ("ragen_rllib/x/b.py", "f"), ("ragen_rllib/x/c.py", "g"),
             ("ragen_rllib/y/d.py", "h")]  # fmt: skip
    last = walk_trace.table(order).splitlines()[-1]
    assert last == "4 files in 3 folders, 2 moves between folders."
