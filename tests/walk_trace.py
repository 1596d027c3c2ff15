"""The walk of docs/architecture.md, traced from the code: every file of the project
that one training iteration enters from the env's ``reset()`` on, in the order it is
first entered, with the function by which it was entered.

One iteration of FrozenLakeNoSlip (the built-in raw model, one group of two, two
turns) runs in this process (``num_env_runners: 0``, synchronous, one local learner),
under a profile hook that starts recording at the first ``reset`` of an env and stops
when ``train()`` returns. The setup before that (the config, the model's build, the
actors) is left out: it is not the trajectory's way. ``tests/test_walk.py`` runs it
and holds the document to it; after a change of the way, rewrite the table with

    python tests/walk_trace.py --write
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
START, END = "<!-- walk -->", "<!-- /walk -->"
CONFIG = {
    "env": "ragen/FrozenLakeNoSlip-v0",
    "llm": "builtin-raw",
    "model_dtype": "float32",
    "env_groups": 1,
    "group_size": 2,
    "max_turns": 2,
    "max_new_tokens": 8,
    "minibatch_size": 2,
    "filter_keep_ratio": 1.0,
    "advantage_estimator": "grpo",
    "num_env_runners": 0,
    "async_rollouts": False,
    "eval_interval": 0,
}


def trace() -> list[tuple[str, str]]:
    """(file, function) of each project file in the order one iteration first enters
    it, from the first env ``reset`` on; files as ``ragen_rllib/...`` or ``envs/...``.
    On the CPU on every machine (a GPU would take other paths through the runtime)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import ray

    import ragen_envs
    import ragen_rllib
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    roots = ((os.path.dirname(ragen_rllib.__file__), "ragen_rllib"),
             (os.path.dirname(ragen_envs.__file__), "envs"))  # fmt: skip
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    algo = StarPOConfig.from_user_dict(CONFIG).build_algo()
    order: list[tuple[str, str]] = []
    seen: set[str] = set()
    recording = [False]

    def hook(frame, event, arg):
        if event != "call":
            return
        path, name = frame.f_code.co_filename, frame.f_code.co_name
        if not recording[0]:
            if not (path.startswith(roots[1][0]) and name == "reset"):
                return
            recording[0] = True
        for root, label in roots:
            if path.startswith(root + os.sep):
                rel = label + path[len(root) :]
                if rel not in seen:
                    seen.add(rel)
                    order.append((rel, name))

    sys.setprofile(hook)
    threading.setprofile(hook)
    try:
        algo.train()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        algo.stop()
        ray.shutdown()
    return order


def folder(rel: str) -> str:
    """The room of a traced file: ``envs/`` (the env package) or ``ragen_rllib/<folder>/``
    (``ragen_rllib/`` for its top-level files)."""
    parts = rel.split("/")
    return parts[0] + "/" if parts[0] == "envs" or len(parts) == 2 else "/".join(parts[:2]) + "/"


def table(order: list[tuple[str, str]]) -> str:
    folders = {folder(rel) for rel, _ in order}
    moves = sum(folder(a) != folder(b) for (a, _), (b, _) in zip(order, order[1:], strict=False))
    lines = ["| # | file | entered by |", "|---|---|---|"]
    lines += [f"| {i} | `{rel}` | `{name}` |" for i, (rel, name) in enumerate(order, 1)]
    lines += ["", f"{len(order)} files in {len(folders)} folders, {moves} moves between folders."]
    return "\n".join(lines)


def held() -> str:
    return DOC.read_text().split(START, 1)[1].split(END, 1)[0].strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the doc's table")
    parser.add_argument("--json", action="store_true", help="print the trace as JSON")
    args = parser.parse_args()
    order = trace()
    if args.json:
        print(json.dumps(order))
        return
    text = table(order)
    if args.write:
        head, rest = DOC.read_text().split(START, 1)
        DOC.write_text(f"{head}{START}\n{text}\n{END}{rest.split(END, 1)[1]}")
        print(f"wrote the walk of {DOC.relative_to(ROOT)}: {text.splitlines()[-1]}")
    else:
        print(text)


if __name__ == "__main__":
    main()
