"""Across seeds: mean +- std per setting, for ``rllib report`` of a sweep with a seed axis.

A sweep such as ``rllib train file <ablation.yaml> --config '{"seed": {"grid_search":
[0, 1, 2]}}'`` gives one trial per (setting, seed). :func:`seed_groups` puts the trials
that differ only in ``seed`` together; :func:`seed_table` gives, per setting, the
evaluation success at each evaluated iteration, and the training success over the
``window`` iterations up to it, as mean +- sample std (ddof 1) over the seeds, in
Markdown; a cell over fewer trials than its setting has (one crashed, or still
running) says how many. :func:`plot_seeds` draws the same as curves with a band of
one std. The report writes both as ``seeds.md`` and ``seeds.png``.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

Series = dict[int, float]  # {iteration: value}


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
    members = [i for group in groups.values() for i in group]
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
            blocks = []
            for i in group:
                span = [v for k, v in trains[i].items() if it - window < k <= it]
                if span:
                    blocks.append(float(np.mean(span)))
            cells.append(_stat(blocks, len(group)))
        lines.append("| " + " | ".join(cells) + " |")
    note = (
        "mean +- sample std over the trials of a setting (one per seed); training success "
        f"is the mean over the {window} iterations that end at the evaluation"
    )
    return "\n".join(lines) + f"\n\n{note}\n"


def plot_seeds(
    groups: dict[str, list[int]], evals: list[Series], trains: list[Series], window: int = 20
) -> bytes:
    """Training success (:func:`window_means` over ``window`` iterations) and evaluation success
    per setting: the mean over seeds as a line, one std as a band (PNG bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for g, (label, members) in enumerate(groups.items()):
        colour = colours[g % len(colours)]
        for ax, by_trial, smooth in ((axes[0], trains, True), (axes[1], evals, False)):
            series = [by_trial[i] for i in members if by_trial[i]]  # not a trial without data
            if smooth:  # a run shorter than the window is drawn as it is
                smoothed = [window_means(s, window) for s in series]
                series = smoothed if all(smoothed) else series
            xs = sorted(set.intersection(*(set(s) for s in series))) if series else []
            if not xs:
                continue
            ys = np.array([[s[x] for x in xs] for s in series])
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
