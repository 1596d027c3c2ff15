"""Replay the early warning of collapse over a finished trial's results, and plot them.

Reads a trial's ``result.json`` (one JSON result per iteration, as Tune writes
it) and feeds each iteration's in-group reward std, approximate KL of the update
and actor gradient norm to :class:`ragen_rllib.maths.collapse.EarlyWarning`
(the rule training applies live; the same inputs give the same answer), then
prints where it fires against where training success first drops to 0, and
draws the signals with the warning marked.

    python bench/replay_collapse_warning.py ~/ray_results/<experiment>/<trial>/result.json \\
        --plot docs/curves/collapse_warning.png

``--warmup``, ``--ema``, ``--std-drop`` and ``--spike`` change the rule's settings
(defaults: the config's). Needs matplotlib only for ``--plot``.

Beside the PNG go the rows it was drawn from, ``X.png`` -> ``X.rows.jsonl.gz``: a
row per trial and iteration (``results``: the trial's file, ``warning_iteration``,
``iteration``, ``success`` and each signal's EMA). Given in place of the
``result.json`` files, such a file draws the same figure again:

    python bench/replay_collapse_warning.py docs/curves/collapse_warning.rows.jsonl.gz \
        --plot docs/curves/collapse_warning.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from ragen_rllib.algorithms.starpo.config.knobs import STARPO_DEFAULTS
from ragen_rllib.cli.report_rows import SUFFIX, read_rows, rows_path, write_rows
from ragen_rllib.maths.collapse import EarlyWarning


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "results", nargs="+", help=f"result.json of one or more trials, or one figure's *{SUFFIX}"
    )
    parser.add_argument("--warmup", type=int, default=STARPO_DEFAULTS["collapse_warmup"])
    parser.add_argument("--ema", type=float, default=STARPO_DEFAULTS["collapse_ema"])
    parser.add_argument("--std-drop", type=float, default=STARPO_DEFAULTS["collapse_std_drop"])
    parser.add_argument("--spike", type=float, default=STARPO_DEFAULTS["collapse_spike"])
    parser.add_argument(
        "--entropy-spike", type=float, default=STARPO_DEFAULTS["collapse_entropy_spike"]
    )
    parser.add_argument("--plot", default=None, help="write a PNG of the signals")
    args = parser.parse_args(argv)
    if args.results[0].endswith(SUFFIX):  # redraw a figure from its rows
        if len(args.results) > 1 or not args.plot:
            parser.error(f"a *{SUFFIX} file comes alone, with --plot")
        plot(series_from_rows(read_rows(args.results[0])), args.plot)
        return 0
    report, series = [], {}
    for path in args.results:
        warning = EarlyWarning(args.ema, args.std_drop, args.spike, args.warmup, args.entropy_spike)
        rows, fired, reason = [], None, None
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:  # a running trial's line still being written
                    break
                learner = r.get("learners", {}).get("default_policy", {})
                signals = (
                    r["rollout"]["in_group_reward_std"],
                    learner.get("approx_kl", math.nan),
                    learner.get("gradients_actor_global_norm", math.nan),
                    learner.get("entropy", math.nan),
                )
                why = warning.update(*signals)
                if why and fired is None:
                    fired, reason = r["training_iteration"], why
                rows.append(
                    {
                        "iteration": r["training_iteration"],
                        "success": r["rollout"]["success_rate"],
                        **{f"{k}_ema": v for k, v in warning.ema.items()},
                    }
                )
        zero = next((row["iteration"] for row in rows if row["success"] == 0), None)
        low = next((row["iteration"] for row in rows if row["success"] < 0.1), None)
        report.append(
            {
                "results": path,
                "iterations": len(rows),
                "warning_iteration": fired,
                "reason": reason,
                "first_zero_success_iteration": zero,
                "first_success_below_0.1_iteration": low,
                "success_first_20": sum(row["success"] for row in rows[:20])
                / max(1, min(20, len(rows))),
                "success_last_20": sum(row["success"] for row in rows[-20:])
                / max(1, min(20, len(rows))),
            }
        )
        series[path] = (rows, fired)
    json.dump(report, sys.stdout, indent=2)
    print()
    if args.plot:
        plot(series, args.plot)
    return 0


def series_rows(series: dict) -> list[dict]:
    """The figure's rows: per trial, a row per iteration (a bare one for a trial
    without any), with its file and where its warning fired."""
    out = []
    for path, (rows, fired) in series.items():
        head = {"results": path, "warning_iteration": fired}
        out += [{**head, **row} for row in rows] or [head]
    return out


def series_from_rows(rows: list[dict]) -> dict:
    """{file: (rows, warning iteration)} of :func:`series_rows`' rows."""
    series: dict = {}
    for row in rows:
        path, fired = row.pop("results"), row.pop("warning_iteration")
        kept, _ = series.setdefault(path, ([], fired))
        if row:
            kept.append(row)
    return series


def plot(series, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("success", "in_group_reward_std_ema", "step_kl_ema", "grad_norm_ema", "entropy_ema")
    titles = ("training success", "in-group reward std (EMA)", "approx. KL of the update (EMA)",
              "actor gradient norm (EMA)", "entropy (EMA)")  # fmt: skip
    fig, axes = plt.subplots(1, 5, figsize=(22, 3.6))
    for path, (rows, fired) in series.items():
        label = path.split("/")[-2][:60] if "/" in path else path
        its = [row["iteration"] for row in rows]
        for ax, key in zip(axes, keys, strict=True):
            line = ax.plot(its, [row.get(key, math.nan) for row in rows], lw=1, label=label)[0]
            if fired:
                ax.axvline(fired, color=line.get_color(), ls="--", lw=1)
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("early warning of collapse (dashed: where it fires)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    write_rows(rows_path(out), series_rows(series))
    print(f"wrote {out} and the rows it drew, {rows_path(out)}")


if __name__ == "__main__":
    sys.exit(main())
