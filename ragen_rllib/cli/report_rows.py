"""The rows a figure of ``rllib report`` was drawn from, kept beside it, and its redraw.

Each PNG the report writes gets a gzipped JSON-lines file beside it, ``X.png`` ->
``X.rows.jsonl.gz`` (:func:`rows_path`), one JSON object a row:

* ``curves.rows.jsonl.gz``: a row per result row of each trial that holds a value
  the curves drew, with ``trial`` (its folder's name), ``label`` (its label in the
  legend), ``training_iteration``, each drawn metric under its key path
  (``"rollout/success_rate"``; a "*" panel's paths as found, ``"evaluation/
  tictactoe/random/game/win_rate"``) and ``collapse/warning`` where it was logged; a
  trial with nothing drawn keeps one row of ``trial`` and ``label`` alone;
* ``seeds.rows.jsonl.gz``: a row per (trial, iteration) of the trials grouped by
  setting, with ``setting``, ``trial``, ``seed``, ``training_iteration`` and the
  evaluation success, training success and reasoning measures
  (:data:`~ragen_rllib.cli.report_seeds.REASONING`) logged at that iteration.

:func:`redraw` (``python -m ragen_rllib.cli.report_rows X.rows.jsonl.gz``) draws the
PNG again from its rows alone: the same figure, as the report drew it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

from ragen_rllib.cli.report_panels import (
    ITERATION,
    PANELS,
    concrete_series,
    lookup,
    plot_curves,
)
from ragen_rllib.cli.report_seeds import REASONING, plot_seeds

SUFFIX = ".rows.jsonl.gz"
WARNING = "collapse/warning"
EVAL, TRAIN = "evaluation/success_rate", "rollout/success_rate"


def rows_path(png: str | Path) -> Path:
    """Where a figure's rows go: ``X.png`` -> ``X.rows.jsonl.gz`` beside it."""
    png = Path(png)
    return png.with_name(png.stem + SUFFIX)


def write_rows(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """``rows`` as gzipped JSON lines (no timestamp in the header: the same rows give
    the same bytes)."""
    text = "".join(json.dumps(row) + "\n" for row in rows)
    Path(path).write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows :func:`write_rows` wrote."""
    text = gzip.decompress(Path(path).read_bytes()).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def drawn_paths(rows: list[dict[str, Any]]) -> list[str]:
    """The key paths of every series the curves panels draw from a trial's ``rows``."""
    return sorted({path for _, series in PANELS for _, path in concrete_series(series, rows)})


def curve_rows(
    names: list[str], labels: list[str], results: list[list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """The rows of ``curves.png``: per trial (its folder's ``names``, its ``labels``
    and its result rows), what :func:`~ragen_rllib.cli.report_panels.plot_curves` draws."""
    out: list[dict[str, Any]] = []
    for name, label, rows in zip(names, labels, results, strict=True):
        paths, before = drawn_paths(rows), len(out)
        for row in rows:
            values = {}
            if ITERATION in row:  # the panels draw rows with an iteration only
                values = {p: v for p in paths if (v := lookup(row, p)) == v}
            warned = lookup(row, WARNING)
            values.update({WARNING: warned} if warned == warned else {})
            if values:
                at = {ITERATION: row[ITERATION]} if ITERATION in row else {}
                out.append({"trial": name, "label": label, **at, **values})
        if len(out) == before:
            out.append({"trial": name, "label": label})
    return out


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    """A flat row's "a/b/c" keys as nested dicts again, as a result row holds them."""
    row: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split("/")
        node = row
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return row


def curves_from_rows(
    rows: list[dict[str, Any]],
) -> tuple[list[str], list[str], list[list[dict[str, Any]]]]:
    """(names, labels, result rows) of the trials in ``curves.png``'s rows, for
    :func:`~ragen_rllib.cli.report_panels.plot_curves`."""
    trials: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for row in rows:
        _, results = trials.setdefault(row["trial"], (row["label"], []))
        values = {k: v for k, v in row.items() if k not in ("trial", "label")}
        if values:
            results.append(_nested(values))
    names = list(trials)
    return names, [trials[n][0] for n in names], [trials[n][1] for n in names]


def seed_rows(
    groups: dict[str, list[int]],
    names: list[str],
    seeds: list[Any],
    evals: list[dict[int, float]],
    trains: list[dict[int, float]],
    measures: dict[str, list[dict[int, float]]],
) -> list[dict[str, Any]]:
    """The rows of ``seeds.png``: per setting of ``groups``, per trial (index into
    ``names``, ``seeds`` and each series list), a row per iteration at which it
    logged one of the drawn series; a trial with none keeps a row without one."""
    out: list[dict[str, Any]] = []
    for setting, members in groups.items():
        for i in members:
            columns = {EVAL: evals[i], TRAIN: trains[i]}
            columns.update({path: measures[name][i] for name, path in REASONING
                            if name in measures})  # fmt: skip
            base = {"setting": setting, "trial": names[i], "seed": seeds[i]}
            its = sorted({it for series in columns.values() for it in series})
            out += [base] if not its else []
            for it in its:
                values = {p: s[it] for p, s in columns.items() if it in s}
                out.append({**base, ITERATION: it, **values})
    return out


def seeds_from_rows(rows: list[dict[str, Any]]) -> tuple[dict[str, list[int]], list, list, dict]:
    """(groups, evals, trains, measures) of ``seeds.png``'s rows, for
    :func:`~ragen_rllib.cli.report_seeds.plot_seeds`."""
    groups: dict[str, list[int]] = {}
    index: dict[str, int] = {}
    evals: list[dict[int, float]] = []
    trains: list[dict[int, float]] = []
    measures: dict[str, list[dict[int, float]]] = {name: [] for name, _ in REASONING}
    columns = [(EVAL, evals), (TRAIN, trains)]
    columns += [(path, measures[name]) for name, path in REASONING]
    for row in rows:
        if row["trial"] not in index:
            index[row["trial"]] = len(evals)
            groups.setdefault(row["setting"], []).append(len(evals))
            for _, by_trial in columns:
                by_trial.append({})
        i = index[row["trial"]]
        for path, by_trial in columns:
            if ITERATION in row and path in row:
                by_trial[i][row[ITERATION]] = row[path]
    return groups, evals, trains, measures


def redraw(rows_file: str | Path) -> bytes:
    """The PNG (bytes) that a report's rows file was drawn as: ``seeds.png`` from rows
    with a ``setting``, ``curves.png`` from the others."""
    rows = read_rows(rows_file)
    if rows and all("setting" in row for row in rows):
        groups, evals, trains, measures = seeds_from_rows(rows)
        return plot_seeds(groups, evals, trains, measures=measures)
    names, labels, results = curves_from_rows(rows)
    return plot_curves([Path(n) for n in names], labels, results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ragen_rllib.cli.report_rows",
        description="redraw a figure of `rllib report` from its rows (X.rows.jsonl.gz)",
    )
    parser.add_argument("rows", nargs="+", help="X.rows.jsonl.gz files")
    parser.add_argument("--out", help="the PNG (one rows file only); default: X.png beside it")
    args = parser.parse_args(argv)
    if args.out and len(args.rows) > 1:
        parser.error("--out takes one rows file")
    for path in args.rows:
        if not path.endswith(SUFFIX):
            parser.error(f"{path}: not a rows file (*{SUFFIX})")
        out = Path(args.out or path[: -len(SUFFIX)] + ".png")
        out.write_bytes(redraw(path))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
