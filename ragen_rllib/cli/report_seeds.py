"""Across seeds: mean +- std per setting, for ``rllib report`` of a sweep with a seed axis.

A sweep such as ``rllib train file <ablation.yaml> --config '{"seed": {"grid_search":
[0, 1, 2]}}'`` gives one trial per (setting, seed). :func:`seed_groups` puts the trials
that differ only in ``seed`` together; :func:`seed_table` gives, per setting, the
evaluation success at each evaluated iteration, and the training success over the
``window`` iterations up to it, as mean +- sample std (ddof 1) over the seeds, in
Markdown; a cell over fewer trials than its setting has (one crashed, or still
running) says how many. :func:`reasoning_table` gives, where the trials logged the
collapse metrics, the think length, distinct-2 and token entropy between evaluations
the same way (the question of an ablation such as RAE against no RAE: does the
reasoning shrink or narrow?). :func:`plot_seeds` draws the same as curves with a band
of one std. The report writes both as ``seeds.md`` and ``seeds.png``.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

Series = dict[int, float]  # {iteration: value}

#: (name, key path in a result row) of the reasoning measures :func:`reasoning_table`
#: and :func:`plot_seeds` show across seeds, where the trials logged them.
REASONING = (
    ("think words", "collapse/think_words_mean"),
    ("distinct-2", "collapse/distinct_2"),
    ("token entropy", "learners/default_policy/entropy"),
)


def differing_keys(params: list[dict[str, Any]]) -> list[str]:
    """The config keys, sorted, whose values are not the same in all of ``params``."""
    keys = sorted({k for p in params for k in p})
    return [k for k in keys if len({json.dumps(p.get(k), sort_keys=True) for p in params}) > 1]


def shown_value(value: Any) -> str:
    """A config value as a label shows it: JSON, an absolute file path cut to its file
    name (``"/home/me/agents/bandit_agent.py:run"`` -> ``"bandit_agent.py:run"``)."""
    if isinstance(value, str) and value.startswith("/"):
        value = value.rsplit("/", 1)[1]
    return json.dumps(value)


def seed_groups(params: list[dict[str, Any]]) -> tuple[dict[str, list[int]], list[int]] | None:
    """({label of a setting: indices of its trials}, indices of the trials left out), or
    None when the trials have no seed axis (``seed`` takes one value) or no setting has
    two trials. ``params`` holds each trial's ``params.json`` ({} when unreadable); the
    trials without a ``seed`` in it are left out. The label names the config values,
    other than ``seed``, in which the settings differ; for a dict value such as
    ``env_config``, the entries in which it differs (``env_config.max_actions_per_turn=5``).
    The settings come in the order of their values (numbers by size), whatever the order
    of the trials."""
    used = [i for i, p in enumerate(params) if "seed" in p]
    left_out = [i for i in range(len(params)) if i not in used]
    if len({json.dumps(params[i]["seed"]) for i in used}) < 2:
        return None
    rest = {i: {k: v for k, v in params[i].items() if k != "seed"} for i in used}
    differ = differing_keys(list(rest.values()))
    # A dict value (env_config) is named by the entries that differ inside it.
    inner = {k: differing_keys([p[k] for p in rest.values()]) for k in differ
             if all(isinstance(p.get(k), dict) for p in rest.values())}  # fmt: skip
    groups: dict[str, list[int]] = {}  # by the full values
    order: dict[str, tuple] = {}
    short: dict[str, str] = {}  # the label shown: absolute paths cut to file names
    for i, p in rest.items():
        named = []  # (name, value) of each differing entry
        for k in differ:
            if k in inner:
                named += [(f"{k}.{sub}", p[k].get(sub)) for sub in inner[k]]
            else:
                named.append((k, p.get(k)))
        label = ", ".join(f"{name}={json.dumps(value)}" for name, value in named) or "all trials"
        groups.setdefault(label, []).append(i)
        order[label] = tuple(_sort_key(value) for _, value in named)
        short[label] = ", ".join(f"{name}={shown_value(value)}" for name, value in named)
    if max(len(v) for v in groups.values()) < 2:
        return None
    if len(set(short.values())) < len(short):  # file names alone would merge settings
        short = {label: label for label in short}
    ordered = sorted(groups, key=order.__getitem__)
    return {short[label] or label: groups[label] for label in ordered}, left_out


def _sort_key(value: Any) -> tuple:
    """Numbers by size, before anything else in its JSON text."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, json.dumps(value, sort_keys=True))


def _stat(values: list[float], of: int) -> str:
    """mean +- sample std; "(n=k)" when only k of the setting's ``of`` trials gave a value."""
    if not values:
        return "-"
    mean = float(np.mean(values))
    text = f"{mean:.3f} +- {np.std(values, ddof=1):.3f}" if len(values) > 1 else f"{mean:.3f}"
    return text if len(values) == of else f"{text} (n={len(values)})"


def _members(groups: dict[str, list[int]]) -> list[int]:
    """The indices of every grouped trial."""
    return [i for group in groups.values() for i in group]


def _span_stat(by_trial: list[Series], group: list[int], lo: int, hi: int) -> str:
    """:func:`_stat` over the ``group``'s trials of each one's mean over the iterations
    in (lo, hi]; a trial with no value there is not counted."""
    blocks = []
    for i in group:
        span = [v for k, v in by_trial[i].items() if lo < k <= hi]
        if span:
            blocks.append(float(np.mean(span)))
    return _stat(blocks, len(group))


def window_means(series: Series, window: int) -> Series:
    """{iteration: the mean of the values at the iterations in (iteration - window,
    iteration]}, at every iteration of ``series`` from ``window`` on. The window is in
    iterations, not values: a run that samples every k-th iteration (``online_k: k``)
    averages the window // k values its window holds, and its curve starts where a
    run that samples every iteration starts."""
    its = np.array(sorted(series), dtype=np.int64)
    if not len(its):
        return {}
    sums = np.concatenate([[0.0], np.cumsum([series[int(i)] for i in its])])
    out: Series = {}
    for j, it in enumerate(its):
        if it < window:
            continue
        first = int(np.searchsorted(its, it - window, side="right"))
        out[int(it)] = float((sums[j + 1] - sums[first]) / (j + 1 - first))
    return out


def seed_table(
    groups: dict[str, list[int]],
    evals: list[Series],
    trains: list[Series],
    seeds: list[Any],
    window: int = 20,
) -> str:
    """Markdown: one row per setting, a column per iteration at which any trial was
    evaluated. ``evals``, ``trains`` and ``seeds`` hold each trial's evaluation and
    training success and its seed. A cell is over the setting's trials that have the
    value, and says how many when that is not all of them (a crashed or running trial)."""
    members = _members(groups)
    evaluated = sorted({it for i in members for it in evals[i]})
    head = ["setting", "seeds"]
    for it in evaluated:
        head += [f"eval @{it}", f"train {max(1, it - window + 1)}-{it}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, group in groups.items():
        distinct = len({json.dumps(seeds[i]) for i in group})
        count = str(distinct) if distinct == len(group) else f"{distinct} ({len(group)} trials)"
        cells = [label, count]
        for it in evaluated:
            cells.append(_stat([evals[i][it] for i in group if it in evals[i]], len(group)))
            cells.append(_span_stat(trains, group, it - window, it))
        lines.append("| " + " | ".join(cells) + " |")
    note = (
        "mean +- sample std over the trials of a setting (one per seed); training success "
        f"is the mean over the {window} iterations that end at the evaluation"
    )
    return "\n".join(lines) + f"\n\n{note}\n"


def span_width(
    groups: dict[str, list[int]], params: list[dict[str, Any]], evals: list[Series]
) -> int:
    """The length in iterations of :func:`reasoning_table`'s spans: the grouped trials'
    smallest ``eval_interval`` (from their params), else the smallest gap between two
    evaluations of one trial not counting its last (a run cut by time evaluates once
    more when it stops), else 0 (one span: the whole run)."""
    members = _members(groups)
    intervals = [params[i].get("eval_interval") for i in members]
    intervals = [v for v in intervals if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    if intervals:
        return min(intervals)
    gaps = []
    for i in members:
        marks = sorted(it for it in evals[i] if it >= 1)[:-1]  # not its last evaluation
        gaps += [b - a for a, b in zip([0, *marks], marks, strict=False)]
    return min(gaps, default=0)


def reasoning_table(
    groups: dict[str, list[int]],
    measures: dict[str, list[Series]],
    width: int,
    max_spans: int = 12,
) -> str:
    """Markdown: a row per (setting, measure) that any of the setting's trials logged, a
    column per span of ``width`` iterations (1-10, 11-20, ...; 0: the whole run) up to
    the last iteration a grouped trial logged, at most ``max_spans`` of them (wider
    spans when there would be more), each cell the mean over the span of each trial, as
    mean +- std over the setting's trials. Runs cut at different lengths share the
    spans. ``measures`` holds {name: each trial's series}; "" when no grouped trial
    logged any of them."""
    members = _members(groups)
    last = max((it for ss in measures.values() for i in members for it in ss[i]), default=0)
    if last < 1:
        return ""
    width = width if width >= 1 else last
    width = max(width, -(-last // max_spans))  # ceil: at most max_spans spans
    spans = [(lo, min(lo + width, last)) for lo in range(0, last, width)]
    head = ["setting", "measure"] + [f"{lo + 1}-{hi}" for lo, hi in spans]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, group in groups.items():
        for name, by_trial in measures.items():
            if not any(by_trial[i] for i in group):
                continue  # not logged by this setting's trials
            cells = [label, name] + [_span_stat(by_trial, group, lo, hi) for lo, hi in spans]
            lines.append("| " + " | ".join(cells) + " |")
    note = (
        "mean +- sample std over the trials of a setting of each trial's mean over the "
        "iterations of the span (think words: the words between <think> and </think>; "
        "distinct-2: distinct word pairs over all pairs in the batch's think texts; token "
        "entropy: the learner's, in nats)"
    )
    return "\n".join(lines) + f"\n\n{note}\n"


def plot_seeds(
    groups: dict[str, list[int]],
    evals: list[Series],
    trains: list[Series],
    window: int = 20,
    measures: dict[str, list[Series]] | None = None,
) -> bytes:
    """Training success (:func:`window_means` over ``window`` iterations) and evaluation success
    per setting, and a panel per reasoning measure that any trial logged (``measures``, as
    in :func:`reasoning_table`, smoothed over ``window // 4`` iterations): the mean over
    seeds as a line, one std as a band (PNG bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grouped = _members(groups)
    logged = {k: v for k, v in (measures or {}).items() if any(v[i] for i in grouped)}
    # (title, each trial's series, smoothing window in iterations; 0: drawn as logged).
    # The reasoning measures move within a few iterations: a shorter window.
    panels = [("training success", trains, window), ("evaluation success", evals, 0)]
    panels += [(name, by_trial, max(1, window // 4)) for name, by_trial in logged.items()]
    rows = (len(panels) + 1) // 2
    fig, grid = plt.subplots(rows, 2, figsize=(11, 3.8 * rows), squeeze=False)
    axes = grid.ravel()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for g, (label, members) in enumerate(groups.items()):
        colour = colours[g % len(colours)]
        for ax, (_, by_trial, smooth) in zip(axes, panels, strict=False):
            series = [by_trial[i] for i in members if by_trial[i]]  # not a trial without data
            if smooth:  # a run shorter than the window is drawn as it is
                smoothed = [window_means(s, smooth) for s in series]
                series = smoothed if all(smoothed) else series
            xs = sorted(set.intersection(*(set(s) for s in series))) if series else []
            if not xs:
                continue
            ys = np.array([[s[x] for x in xs] for s in series])
            mean, std = ys.mean(axis=0), ys.std(axis=0, ddof=1) if len(ys) > 1 else 0 * ys[0]
            ax.plot(xs, mean, color=colour, lw=1.4, marker="o" if len(xs) < 12 else None,
                    ms=3, label=f"{label} (n={len(members)})")  # fmt: skip
            ax.fill_between(xs, mean - std, mean + std, color=colour, alpha=0.18, lw=0)
    for ax, (title, _, smooth) in zip(axes, panels, strict=False):
        title += f" ({smooth}-iteration mean)" if smooth else ""
        ax.set_title(f"{title}, mean +- std over seeds", fontsize=10)
        ax.set_xlabel("iteration", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    for ax in axes[len(panels) :]:  # an odd number of panels leaves one empty
        ax.set_visible(False)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
