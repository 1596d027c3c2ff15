"""Across seeds: mean +- std per setting, for ``rllib report`` of a sweep with a seed axis.

A sweep such as ``rllib train file <ablation.yaml> --config '{"seed": {"grid_search":
[0, 1, 2]}}'`` gives one trial per (setting, seed). :func:`seed_groups` puts the trials
that differ only in ``seed`` together; :func:`seed_table` gives, per setting, the
evaluation success at each iteration where every seed was evaluated, and the training
success over the last ``window`` iterations before it, as mean +- sample std (ddof 1)
over the seeds, in Markdown. :func:`plot_seeds` draws the same as curves with a band of
one std. The report writes both as ``seeds.md`` and ``seeds.png``.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

Series = dict[int, float]  # {iteration: value}


def _params(trial: Path) -> dict[str, Any]:
    try:
        return json.loads((trial / "params.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def seed_groups(trials: list[Path]) -> dict[str, list[int]] | None:
    """{label of a setting: indices of its trials}, or None when the trials have no seed
    axis (``seed`` takes one value) or no setting has two seeds. The label names the
    config values, other than ``seed``, in which the settings differ."""
    params = [_params(t) for t in trials]
    if len({json.dumps(p.get("seed")) for p in params}) < 2:
        return None
    rest = [{k: v for k, v in p.items() if k != "seed"} for p in params]
    keys = sorted({k for p in rest for k in p})
    differ = [k for k in keys if len({json.dumps(p.get(k), sort_keys=True) for p in rest}) > 1]
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(rest):
        label = ", ".join(f"{k}={json.dumps(p.get(k))}" for k in differ) or "all trials"
        groups.setdefault(label, []).append(i)
    return groups if max(len(v) for v in groups.values()) >= 2 else None


def _stat(values: list[float]) -> str:
    if not values:
        return "-"
    mean = float(np.mean(values))
    std = float(np.std(values, ddof=1)) if len(values) > 1 else math.nan
    return f"{mean:.3f} +- {std:.3f}" if std == std else f"{mean:.3f}"


def seed_table(
    groups: dict[str, list[int]], evals: list[Series], trains: list[Series], window: int = 20
) -> str:
    """Markdown: one row per setting, a column per evaluated iteration common to all
    trials. ``evals`` and ``trains`` hold each trial's evaluation and training success."""
    common = sorted(set.intersection(*(set(e) for e in evals))) if evals else []
    head = ["setting", "seeds"]
    for it in common:
        head += [f"eval @{it}", f"train {max(1, it - window + 1)}-{it}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, members in groups.items():
        cells = [label, str(len(members))]
        for it in common:
            cells.append(_stat([evals[i][it] for i in members]))
            blocks = []
            for i in members:
                span = [v for k, v in trains[i].items() if it - window < k <= it]
                if span:
                    blocks.append(float(np.mean(span)))
            cells.append(_stat(blocks))
        lines.append("| " + " | ".join(cells) + " |")
    note = (f"mean +- sample std over the seeds; training success is the mean over the "
            f"{window} iterations ending at the evaluation")  # fmt: skip
    return "\n".join(lines) + f"\n\n{note}\n"


def plot_seeds(
    groups: dict[str, list[int]], evals: list[Series], trains: list[Series], window: int = 20
) -> bytes:
    """Training success (a running mean over ``window`` iterations) and evaluation success
    per setting: the mean over seeds as a line, one std as a band (PNG bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for g, (label, members) in enumerate(groups.items()):
        colour = colours[g % len(colours)]
        for ax, by_trial, smooth in ((axes[0], trains, True), (axes[1], evals, False)):
            series = [by_trial[i] for i in members]
            xs = sorted(set.intersection(*(set(s) for s in series)))
            if not xs:
                continue
            ys = np.array([[s[x] for x in xs] for s in series])
            if smooth and len(xs) >= window:
                kernel = np.ones(window) / window
                ys = np.array([np.convolve(y, kernel, mode="valid") for y in ys])
                xs = xs[window - 1 :]
            mean, std = ys.mean(axis=0), ys.std(axis=0, ddof=1) if len(ys) > 1 else 0 * ys[0]
            ax.plot(xs, mean, color=colour, lw=1.4, marker="o" if len(xs) < 12 else None,
                    ms=3, label=f"{label} (n={len(members)})")  # fmt: skip
            ax.fill_between(xs, mean - std, mean + std, color=colour, alpha=0.18, lw=0)
    for ax, title in zip(axes, (f"training success ({window}-iteration mean)",
                                "evaluation success"), strict=True):  # fmt: skip
        ax.set_title(f"{title}, mean +- std over seeds", fontsize=10)
        ax.set_xlabel("iteration", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
