"""Plot the per-iteration curves that ``bench_train_cpu.py --curve`` writes, as one PNG.

Three panels over the iterations: training success (with a 10-iteration
moving average), the in-group reward std (what the rollout filter ranks
groups by; 0 means every rollout of a group got the same reward, so GRPO has
nothing to learn from) and the policy's token entropy. The success before and
after training on the fixed evaluation states comes from the bench's ``--json``
file when given.

Needs matplotlib (``pip install matplotlib``), which the project itself does not.

    python bench/plot_curves.py /tmp/lake.jsonl --figures /tmp/lake.json \
        --title "FrozenLakeNoSlip" --out docs/curves/frozenlake_noslip_cpu.png

Beside the PNG go the rows it was drawn from, ``X.png`` -> ``X.rows.jsonl.gz``
(gzipped JSON lines): the curve's points as read, then a row per evaluation
marker (``{"eval": "before", "iteration": 0, "success": ..., "eval_states": ...,
"eval_temperature": ...}``, and ``"after"``). Given as the curve, such a file
draws the same figure again (the title is not in it: pass ``--title`` again):

    python bench/plot_curves.py docs/curves/frozenlake_noslip_cpu.rows.jsonl.gz \
        --title "FrozenLakeNoSlip" --out docs/curves/frozenlake_noslip_cpu.png
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

SUFFIX = ".rows.jsonl.gz"


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def rows_path(png: str) -> Path:
    """Where a figure's rows go: ``X.png`` -> ``X.rows.jsonl.gz`` beside it."""
    return Path(png).with_name(Path(png).stem + SUFFIX)


def read_lines(path: str) -> list[dict]:
    """The JSON lines of ``path``, gunzipped when its name ends in ``.gz``."""
    data = Path(path).read_bytes()
    text = (gzip.decompress(data) if path.endswith(".gz") else data).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_rows(path: Path, rows: list[dict]) -> None:
    """``rows`` as gzipped JSON lines, with no timestamp: the same rows, the same bytes."""
    text = "".join(json.dumps(row) + "\n" for row in rows)
    path.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))


def eval_marks(figures: dict, last: int) -> list[dict]:
    """The evaluation before (at iteration 0) and after (at ``last``) training, from
    ``bench_train_cpu.py --json``, as rows."""
    shared = {"eval_states": figures.get("eval_states"),
              "eval_temperature": figures.get("eval_temperature")}  # fmt: skip
    return [
        {"eval": when, "iteration": at, "success": figures[f"success_{when}"], **shared}
        for when, at in (("before", 0), ("after", last))
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "curve", help="JSON lines from bench_train_cpu.py --curve, or a figure's X.rows.jsonl.gz"
    )
    parser.add_argument("--figures", default=None, help="JSON from bench_train_cpu.py --json")
    parser.add_argument("--title", default="")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        parser.error("needs matplotlib: pip install matplotlib")

    rows = read_lines(args.curve)  # a --curve file, or the rows file of an earlier figure
    points = [row for row in rows if "eval" not in row]
    marks = [row for row in rows if "eval" in row]
    if not points:
        parser.error(f"{args.curve} holds no iterations")
    its = [p["iteration"] for p in points]
    if args.figures:
        with open(args.figures) as f:
            marks = eval_marks(json.load(f), its[-1])
    success = [p["success"] or 0.0 for p in points]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(its, success, color="tab:blue", alpha=0.35, label="per iteration")
    axes[0].plot(its, moving_average(success, 10), color="tab:blue", label="10-iteration mean")
    for mark in marks:
        marker = "o" if mark["eval"] == "before" else "s"
        axes[0].scatter([mark["iteration"]], [mark["success"]], color="tab:red", marker=marker,
                        zorder=3)  # fmt: skip
    if marks:
        states, temp = marks[0]["eval_states"], marks[0]["eval_temperature"]
        axes[0].plot([], [], "o", color="tab:red", label=f"eval, {states} states, T={temp}")
    axes[0].set_title("success")
    axes[0].set_ylim(0, 1)
    axes[0].legend(fontsize=8, loc="upper left")
    axes[1].plot(its, [p["in_group_reward_std"] or 0.0 for p in points], color="tab:green")
    axes[1].set_title("in-group reward std")
    axes[2].plot(its, [p["entropy"] for p in points], color="tab:purple")
    axes[2].set_title("token entropy")
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    write_rows(rows_path(args.out), points + marks)
    print(f"wrote {args.out} and the rows it drew, {rows_path(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
