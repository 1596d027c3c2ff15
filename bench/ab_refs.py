"""Run one benchmark on an earlier commit and on this working tree, interleaved, and
print their figures side by side.

    python bench/ab_refs.py --before d3922f9 --rounds 2 -- bench/bench_learner.py --repeats 3
    python bench/ab_refs.py --before d3922f9 --patch fix.diff -- bench/bench_rollout.py

``bench/patches/`` keeps the patches that the docs' before/after tables name.

Each round runs the benchmark once in the earlier commit's tree (a temporary git
worktree) and once here, alternating, so slow drift of the machine's load falls on
both sides alike. Each side runs its own copy of the benchmark script against its
own package (``ragen_rllib`` and ``ragen_envs`` from that tree, ahead of the
installed ones on ``PYTHONPATH``), from the caller's directory: the script is named
as a path inside this repository, the other arguments as the caller sees them. The
benchmark must end its output with a JSON object (every ``bench/`` script that
prints figures does); each numeric figure is shown as the median over the rounds,
before and after, with their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def last_json(text: str) -> dict:
    """The JSON object that ends a benchmark's output."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("{"):
            try:
                return json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                continue
    raise ValueError("the benchmark printed no JSON object at its end")


def flatten(obj, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(obj, int | float) and not isinstance(obj, bool):
        out[prefix.rstrip(".")] = float(obj)
    return out


def run_side(tree: Path, paths: Path, bench: list[str]) -> dict[str, float]:
    """One run of the benchmark on ``tree``: that tree's copy of the script, from the
    caller's directory, so that the arguments' relative paths (a config written
    beside the caller, say) mean what they mean to the caller on both sides."""
    env = {**os.environ, "PYTHONPATH": str(paths)}
    script = tree / Path(bench[0]).resolve().relative_to(ROOT)
    cmd = [sys.executable, str(script), *bench[1:]]
    done = subprocess.run(cmd, cwd=os.getcwd(), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return flatten(last_json(done.stdout))


def import_paths(tree: Path, where: Path) -> Path:
    """A folder that puts ``tree``'s two packages first on the import path."""
    where.mkdir()
    (where / "ragen_rllib").symlink_to(tree / "ragen_rllib")
    (where / "ragen_envs").symlink_to(tree / "envs")
    return where


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the earlier commit (any git ref)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per side, interleaved")
    parser.add_argument(
        "--patch",
        help="a diff applied to the earlier tree first (git apply), e.g. a fix of the "
        "benchmark script itself that came after that commit",
    )
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- bench/script.py [args]")
    args = parser.parse_args()
    bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    if not bench:
        parser.error("name the benchmark after --")
    with tempfile.TemporaryDirectory(prefix="ab_refs_") as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                        str(before), args.before], check=True)  # fmt: skip
        try:
            if args.patch:
                subprocess.run(["git", "-C", str(before), "apply", os.path.abspath(args.patch)],
                               check=True)  # fmt: skip
            sides = {
                "before": (before, import_paths(before, Path(tmp) / "paths_before")),
                "after": (ROOT, import_paths(ROOT, Path(tmp) / "paths_after")),
            }
            runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for round_ in range(args.rounds):
                for side, (tree, paths) in sides.items():
                    print(f"round {round_ + 1}/{args.rounds}: {side}", file=sys.stderr)
                    runs[side].append(run_side(tree, paths, bench))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(before)], check=False)  # fmt: skip
    keys = [k for k in runs["after"][0] if all(k in r for r in runs["before"] + runs["after"])]
    width = max(map(len, keys), default=10)
    print(f"{' '.join(bench)}: median of {args.rounds} run(s) a side, {args.before} vs this tree")
    print(f"{'figure':<{width}}  {'before':>12}  {'after':>12}  {'after/before':>12}")
    figures = {}
    for key in keys:
        b = statistics.median(r[key] for r in runs["before"])
        a = statistics.median(r[key] for r in runs["after"])
        ratio = a / b if b else None
        figures[key] = {"before": b, "after": a, "ratio": ratio}
        shown = f"{ratio:>12.3f}" if ratio is not None else f"{'-':>12}"
        print(f"{key:<{width}}  {b:>12.4g}  {a:>12.4g}  {shown}")
    print(json.dumps({"before": args.before, "rounds": args.rounds, "figures": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
