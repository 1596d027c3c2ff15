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
"""

from __future__ import annotations

import argparse
import json
import sys


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("curve", help="JSON lines from bench_train_cpu.py --curve")
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

    with open(args.curve) as f:
        points = [json.loads(line) for line in f if line.strip()]
    if not points:
        parser.error(f"{args.curve} holds no iterations")
    its = [p["iteration"] for p in points]
    success = [p["success"] or 0.0 for p in points]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(its, success, color="tab:blue", alpha=0.35, label="per iteration")
    axes[0].plot(its, moving_average(success, 10), color="tab:blue", label="10-iteration mean")
    if args.figures:
        with open(args.figures) as f:
            figures = json.load(f)
        temp, states = figures.get("eval_temperature"), figures.get("eval_states")
        for key, x, marker in (("success_before", 0, "o"), ("success_after", its[-1], "s")):
            axes[0].scatter([x], [figures[key]], color="tab:red", marker=marker, zorder=3)
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
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
