"""``rllib report <run dir>``: training curves as PNG and a self-contained report.html.

``<run dir>`` is a trial folder (with ``result.json``) or an experiment folder
(a sweep: one line per trial in every panel, labelled by the settings the
trials differ in). The report goes to ``<run dir>/report/``:

* ``curves.png``: success (training, and evaluation per suite env), reward,
  in-group reward std, entropy, gradient norm, response length, KL to the
  behaviour policy and the mutual-information metrics, each against the
  iteration, with the collapse warning marked where it fired, see
  :mod:`ragen_rllib.cli.report_panels`;
* ``report.html``: one file, no network fetches, that holds the curves and a
  trajectory browser over the rollout dumps (``rollout_dump_interval``), see
  :mod:`ragen_rllib.cli.report_html`;
* for a sweep with a seed axis (trials that differ in ``seed``, and maybe in
  other settings), ``seeds.md`` and ``seeds.png``: each setting's success as
  mean +- std over its seeds, see :mod:`ragen_rllib.cli.report_seeds`;
* beside each PNG, the rows it was drawn from (``curves.rows.jsonl.gz``,
  ``seeds.rows.jsonl.gz``), from which ``python -m ragen_rllib.cli.report_rows``
  draws it again, see :mod:`ragen_rllib.cli.report_rows`.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from ragen_rllib.cli.experiments import UsageError
from ragen_rllib.cli.report_panels import plot_curves, series
from ragen_rllib.cli.report_seeds import differing_keys, shown_value

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # in a repr such as <function f at 0x7f...>


def find_trials(run_dir: Path) -> list[Path]:
    """The trial folders (those with a ``result.json``) at or under ``run_dir``."""
    if not run_dir.is_dir():
        raise UsageError(f"{str(run_dir)!r} is not a directory")
    if (run_dir / "result.json").is_file():
        return [run_dir]
    trials = sorted(p.parent for p in run_dir.glob("*/result.json"))
    if not trials:
        raise UsageError(
            f"no result.json in {str(run_dir)!r} or its subfolders: give a trial folder or "
            "an experiment folder of `rllib train file`"
        )
    return trials


def read_results(trial: Path) -> list[dict[str, Any]]:
    """A trial's result rows; a half-written last line (a run still going) is skipped."""
    rows = []
    for line in (trial / "result.json").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_params(trial: Path) -> dict[str, Any]:
    """A trial's ``params.json`` ({} when it is missing or unreadable).

    Tune writes a value it cannot serialise as its repr, e.g. RLlib's default
    ``policy_mapping_fn`` as ``"<function ... at 0x7f...>"``. The address differs
    from one process to the next, so it is cut out: trials of two sweeps with the
    same settings then compare equal."""
    try:
        return _without_addresses(json.loads((trial / "params.json").read_text()))
    except (OSError, json.JSONDecodeError):
        return {}


def _without_addresses(value: Any) -> Any:
    if isinstance(value, str):
        return _ADDRESS.sub("", value)
    if isinstance(value, dict):
        return {k: _without_addresses(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_addresses(v) for v in value]
    return value


def trial_labels(trials: list[Path], params: list[dict[str, Any]]) -> list[str]:
    """Each trial's label: the config values (``params``, one per trial) in which the
    trials differ."""
    if len(trials) == 1:
        return [re.sub(r"_\d{4}-\d\d-\d\d.*$", "", trials[0].name)]
    differ = differing_keys(params)
    labels = []
    for trial, p in zip(trials, params, strict=True):
        shown = ", ".join(f"{k}={shown_value(p.get(k))}" for k in differ[:3])
        labels.append(shown or re.sub(r"_\d{4}-\d\d-\d\d.*$", "", trial.name))
    return labels


#: How to get what `rllib report` draws its curves with.
REPORT_EXTRA_INSTALL = 'pip install -e ".[report]" (from a checkout) or pip install matplotlib'


def report(args: argparse.Namespace) -> int:
    import importlib.util

    from tqdm import tqdm

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(f"rllib report draws its curves with matplotlib: {REPORT_EXTRA_INSTALL}")

    from ragen_rllib.cli.report_html import collect_trajectories, render_html

    # Here, not at the top: `python -m ragen_rllib.cli.report_rows` (the redraw)
    # would find itself imported by the package before it runs.
    from ragen_rllib.cli.report_rows import curve_rows, rows_path, write_rows

    run_dir = Path(args.run_dir).expanduser().resolve()
    trials = find_trials(run_dir)
    out = Path(args.output).expanduser() if args.output else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    with tqdm(total=len(trials) * 2 + 2, desc="rllib report", unit="step") as bar:
        results = []
        for trial in trials:
            results.append(read_results(trial))
            bar.update()
        params = [read_params(trial) for trial in trials]
        labels = trial_labels(trials, params)
        png = plot_curves(trials, labels, results)
        (out / "curves.png").write_bytes(png)
        names = [trial.name for trial in trials]
        write_rows(rows_path(out / "curves.png"), curve_rows(names, labels, results))
        bar.update()
        trajectories = []
        for trial, label in zip(trials, labels, strict=True):
            trajectories += collect_trajectories(trial, label, args.max_trajectories)
            bar.update()
        html = render_html(run_dir.name, labels, results, png, trajectories, params)
        (out / "report.html").write_text(html, encoding="utf-8")
        bar.update()
    by_seed = seed_report(out, trials, params, results)
    seeds = " and seeds.md/seeds.png (mean +- std over seeds)" if by_seed else ""
    print(f"wrote {out / 'curves.png'} and {out / 'report.html'}{seeds}, each PNG with the "
          f"rows it drew beside it (*.rows.jsonl.gz) ({len(trials)} trial(s), "
          f"{len(trajectories)} trajectories)")  # fmt: skip
    return 0


def seed_report(
    out: Path, trials: list[Path], params: list[dict[str, Any]], results: list[list[dict]]
) -> bool:
    """For a sweep with a seed axis, ``seeds.md`` (printed too), ``seeds.png`` and its
    rows in ``out``: each setting's success, and reasoning measures where logged, as
    mean +- std over its seeds. Whether the sweep had one."""
    from ragen_rllib.cli.report_rows import rows_path, seed_rows, write_rows
    from ragen_rllib.cli.report_seeds import (
        REASONING,
        plot_seeds,
        reasoning_table,
        seed_groups,
        seed_table,
        span_width,
    )

    by_seed = seed_groups(params)
    if by_seed is None:
        return False
    groups, left_out = by_seed
    evals = [series(rows, "evaluation/success_rate") for rows in results]
    trains = [series(rows, "rollout/success_rate") for rows in results]
    seeds = [p.get("seed") for p in params]
    table = seed_table(groups, evals, trains, seeds)
    measures = {name: [series(rows, path) for rows in results] for name, path in REASONING}
    reasoning = reasoning_table(groups, measures, span_width(groups, params, evals))
    table += f"\n{reasoning}" if reasoning else ""
    if left_out:
        unseeded = ", ".join(trials[i].name for i in left_out)
        table += f"\nleft out (no seed in params.json): {unseeded}\n"
    (out / "seeds.md").write_text(table, encoding="utf-8")
    (out / "seeds.png").write_bytes(plot_seeds(groups, evals, trains, measures=measures))
    names = [trial.name for trial in trials]
    kept = seed_rows(groups, names, seeds, evals, trains, measures)
    write_rows(rows_path(out / "seeds.png"), kept)
    print(table, end="")
    return True
