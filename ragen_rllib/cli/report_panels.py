"""The curves figure of ``rllib report``: its panels, how they read result rows, the PNG.

:data:`PANELS` names each panel's metrics by their key path in a result row;
:func:`lookup` reads one (under its old name in a run logged before a rename),
:func:`expand` finds the concrete paths of a "*" path (a mixture's envs, a suite and
its envs), :func:`panel_series` gives every line a panel draws and
:func:`plot_curves` draws them as one PNG.
"""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path
from typing import Any

from ragen_rllib.records.metrics import declared_metric

#: (title, [(label, key path in a result row)]), one panel each. A path with "*"
#: stands for every key found there in the rows (a mixture's env, a suite and its env).
#: Every path is a declared metric (ragen_rllib/records/metrics.py), whose unit
#: labels the panel's axis.
PANELS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("success", (("train", "rollout/success_rate"), ("eval", "evaluation/success_rate"))),
    ("train success per env (env_mix)", (("", "rollout/*/success_rate"),)),
    ("eval success per env (env_mix) and suite env",
     (("", "evaluation/*/success_rate"), ("", "evaluation/*/*/success_rate"))),
    ("reward", (("", "rollout/reward_mean"),)),
    ("game outcomes (train)", (("win", "rollout/game/win_rate"),
                               ("draw", "rollout/game/draw_rate"),
                               ("loss", "rollout/game/loss_rate"))),
    ("eval win rate per opponent (suite env)", (("", "evaluation/*/*/game/win_rate"),)),
    ("eval draw rate per opponent (suite env)", (("", "evaluation/*/*/game/draw_rate"),)),
    ("eval payoff per opponent (suite env)", (("", "evaluation/*/*/game/payoff_mean"),)),
    ("in-group reward std", (("sampled", "rollout/in_group_reward_std"),
                             ("kept by the filter", "filter/in_group_reward_std_after"))),
    ("entropy", (("", "learners/default_policy/entropy"),)),
    ("gradient norm (actor)", (("", "learners/default_policy/gradients_actor_global_norm"),)),
    ("response length", (("", "rollout/response_length_mean"),)),
    ("KL to behaviour (approx.)", (("", "learners/default_policy/approx_kl"),)),
    ("policy loss", (("", "learners/default_policy/policy_loss"),)),
    ("clipped share of tokens", (("all", "learners/default_policy/clip_frac"),
                                 ("low", "learners/default_policy/clip_frac_low"),
                                 ("high", "learners/default_policy/clip_frac_high"))),
    ("KL to reference", (("", "learners/default_policy/kl_to_reference"),)),
    ("learning rate (actor)", (("", "learners/default_policy/actor_learning_rate"),)),
    ("think length", (("", "collapse/think_words_mean"),)),
    ("reasoning diversity", (("distinct-1", "collapse/distinct_1"),
                             ("distinct-2", "collapse/distinct_2"),
                             ("template repetition", "collapse/template_repetition"))),
    ("MI(prompt; reasoning)", (("", "collapse/mi"),)),
    ("MI z-score", (("", "collapse/mi_zscore"),)),
    ("H(reasoning | prompt) per token", (("", "collapse/conditional_entropy"),)),
    ("retrieval acc@1 (vs chance)", (("acc@1", "collapse/retrieval_acc_at_1"),
                                     ("chance", "collapse/retrieval_chance"))),
)  # fmt: skip
ITERATION = "training_iteration"


def axis_label(series: tuple[tuple[str, str], ...]) -> str:
    """A panel's y-axis label: the declared unit of its metrics (the units, joined by
    " / ", where they differ; empty for shares and unitless figures)."""
    units = []
    for _, path in series:
        metric = declared_metric(path.replace("*", "x"))
        if metric is None:
            raise KeyError(f"panel metric {path!r} is not declared in records/metrics.py")
        if metric.unit and metric.unit not in units:
            units.append(metric.unit)
    return " / ".join(units)


#: Metric names that changed, new -> old: runs logged before the change read the same.
#: (docs/changelog.md lists them.)
OLD_NAMES = {
    "rollout/batch_reward_std": "rollout/reward_std",
    "filter/in_group_reward_std_before": "filter/in_group_std_before",
    "filter/in_group_reward_std_after": "filter/in_group_std_after",
    "collapse/in_group_reward_std_ema": "collapse/in_group_std_ema",
}


def lookup(row: dict[str, Any], path: str) -> float:
    """The number at ``path`` ("a/b/c") in a result row (under its old name in a row
    logged before a rename: :data:`OLD_NAMES`); NaN when absent."""
    node: Any = row
    parts = path.split("/")
    for i, part in enumerate(parts):
        rest = "/".join(parts[i:])  # a flat key with slashes ("game/win_rate")
        if isinstance(node, dict) and part not in node and rest in node:
            node = node[rest]
            break
        if not isinstance(node, dict) or part not in node:
            return lookup(row, OLD_NAMES[path]) if path in OLD_NAMES else math.nan
        node = node[part]
    return float(node) if isinstance(node, int | float) else math.nan


def series(rows: list[dict[str, Any]], path: str) -> dict[int, float]:
    """{iteration: value} of ``path`` over the rows that logged it."""
    points = ((row.get(ITERATION), lookup(row, path)) for row in rows)
    return {int(i): v for i, v in points if i is not None and v == v}


def expand(path: str, rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``path`` with its "*" parts replaced by every key found in ``rows``:
    (the matched parts joined by "/", the concrete path)."""
    if "*" not in path:
        return [("", path)]
    found: dict[str, str] = {}
    parts = path.split("/")

    def walk(node: Any, i: int, picked: list[str], concrete: list[str]) -> None:
        if i == len(parts):
            found.setdefault("/".join(picked), "/".join(concrete))
            return
        if not isinstance(node, dict):
            return
        rest = "/".join(parts[i:])
        if "*" not in rest and rest in node:  # a flat key with slashes ("game/win_rate")
            found.setdefault("/".join(picked), "/".join(concrete + [rest]))
            return
        keys = [k for k in node if isinstance(node[k], dict)] if parts[i] == "*" else [parts[i]]
        for key in keys:
            if key in node:
                star = parts[i] == "*"
                walk(node[key], i + 1, picked + [key] * star, concrete + [key])

    for row in rows:
        walk(row, 0, [], [])
    return sorted(found.items())


def warning_iteration(rows: list[dict[str, Any]]) -> int | None:
    """The iteration at which the collapse warning fired, if it did."""
    fired = [lookup(r, "collapse/warning") for r in rows]
    fired = [int(v) for v in fired if v == v and v > 0]
    return fired[0] if fired else None


def smoothed(ys: list[float], points: int = 30) -> list[float]:
    """An exponential moving average whose span is about a ``points``-th of the series,
    so a long run's curve reads through its iteration-to-iteration noise."""
    alpha = min(1.0, points / max(1, len(ys)))
    out, level = [], ys[0]
    for y in ys:
        level = alpha * y + (1 - alpha) * level
        out.append(level)
    return out


def concrete_series(series: tuple[tuple[str, str], ...], rows: list[dict]) -> list[tuple[str, str]]:
    """A panel's ``series`` with each "*" path :func:`expand`-ed over ``rows``:
    (name, concrete key path) of every line the panel can draw from them."""
    out = []
    for name, path in series:
        out += [(name, path)] if "*" not in path else expand(path, rows)
    return out


def panel_series(results: list[list[dict]]) -> list[tuple[str, list[list[tuple]]]]:
    """The panels of :data:`PANELS` that some trial logged: per panel, per trial, its
    (name, xs, ys) series. A panel nothing logged (a single env's per-env panels, the
    MI of a run that does not measure it) is left out."""
    out = []
    for title, series in PANELS:
        per_trial = []
        for rows in results:
            lines = []
            for name, path in concrete_series(series, rows):
                points = [(r[ITERATION], lookup(r, path)) for r in rows if ITERATION in r]
                points = [(x, y) for x, y in points if y == y]  # some are logged every n
                if points:
                    xs, ys = zip(*points, strict=True)
                    lines.append((name, list(xs), list(ys)))
            per_trial.append(lines)
        if any(per_trial):
            out.append((title, per_trial))
    return out


def plot_curves(trials: list[Path], labels: list[str], results: list[list[dict]]) -> bytes:
    """The logged panels of :data:`PANELS` as one PNG (bytes). A series of more than 60
    points is drawn faint, with its moving average (:func:`smoothed`) over it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = panel_series(results)
    cols = 3
    rows_n = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows_n, cols, figsize=(5.2 * cols, 3.3 * rows_n), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ("-", "--", ":", "-.")
    single = len(results) == 1
    for ax, (title, per_trial) in zip(axes.flat, panels, strict=False):
        for t, lines in enumerate(per_trial):
            for s, (name, xs, ys) in enumerate(lines):
                # One trial: a colour per series; a sweep: a colour per trial, a line
                # style per series.
                colour = colours[(s if single else t) % len(colours)]
                style = "-" if single else styles[s % len(styles)]
                label = " ".join(x for x in ("" if single else labels[t], name) if x)
                long = len(xs) > 60
                ax.plot(xs, ys, style, color=colour, marker="o" if len(xs) < 12 else None,
                        ms=3, lw=0.8 if long else 1.3, alpha=0.3 if long else 1.0,
                        label=None if long else (label or None))  # fmt: skip
                if long:
                    ax.plot(xs, smoothed(ys), style, color=colour, lw=1.5, label=label or None)
            warned = warning_iteration(results[t])
            if warned is not None and lines:  # an empty panel gets no marker
                ax.axvline(warned, color="red" if single else colours[t % len(colours)],
                           ls=":", lw=1.2)  # fmt: skip
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("iteration", fontsize=8)
        ax.set_ylabel(axis_label(dict(PANELS)[title]), fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if any(line.get_label() and not line.get_label().startswith("_")
               for line in ax.get_lines()):  # fmt: skip
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    notes = [f"{lab}: collapse warning at {w}" for lab, rows in zip(labels, results, strict=True)
             if (w := warning_iteration(rows)) is not None]  # fmt: skip
    fig.suptitle("; ".join(notes) or " ", fontsize=10)
    with warnings.catch_warnings():  # long legends: the layout does what it can, quietly
        warnings.filterwarnings("ignore", message="Tight layout not applied")
        fig.tight_layout(rect=(0, 0, 1, 0.98))  # room for the title above the first row
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
