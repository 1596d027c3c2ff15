"""Every figure tool keeps the rows it drew beside its PNG (``X.png`` ->
``X.rows.jsonl.gz``), and the rows alone draw the same figure again: `rllib report`'s
curves and seeds figures, bench/plot_curves.py and bench/replay_collapse_warning.py."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from ragen_rllib.cli import main
from ragen_rllib.cli.report_panels import panel_series, warning_iteration
from ragen_rllib.cli.report_rows import (
    curves_from_rows,
    read_rows,
    redraw,
    rows_path,
    seeds_from_rows,
)

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _result_rows(n: int, lr: float, games: bool) -> list[dict]:
    """``n`` result rows: success rising, an evaluation every 5 iterations, the
    collapse warning at 7, a metric under its old name, a mixture's per-env success and,
    with ``games``, flat game/... keys under rollout/ and a suite's envs."""
    rows = []
    for i in range(1, n + 1):
        row = {
            "training_iteration": i,
            "rollout": {"success_rate": i / n * lr * 1e4, "reward_mean": 0.1 * i,
                        "bandit": {"success_rate": 0.5}, "lake": {"success_rate": 0.25}},
            "filter": {"in_group_std_after": 0.3 - i / 100},  # logged before a rename
            "learners": {"default_policy": {"entropy": 1.0 / i, "policy_loss": -0.01 * i}},
            "collapse": {"warning": 7 if i >= 7 else 0},
            "config": {"not": "drawn"},
        }  # fmt: skip
        if games:
            row["rollout"]["game/win_rate"] = i / (2 * n)
        if i % 5 == 0:
            row["evaluation"] = {"success_rate": 0.4, "bandit": {"rev": {"success_rate": 0.1}}}
            if games:
                row["evaluation"]["ttt"] = {"minimax": {"game/win_rate": 0.0},
                                            "random": {"game/win_rate": i / n}}  # fmt: skip
        rows.append(row)
    rows.append({"training_iteration": n, "evaluation": {"success_rate": 0.5}})  # bench's last
    return rows


def _trial(folder: Path, rows: list[dict], params: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "params.json").write_text(json.dumps(params))


def test_report_keeps_the_rows_of_its_curves_and_they_redraw_the_same_png(tmp_path):
    exp = tmp_path / "exp"
    results = [_result_rows(12, 1e-4, games=False), _result_rows(9, 3e-4, games=True)]
    for i, (rows, lr) in enumerate(zip(results, (1e-4, 3e-4), strict=True)):
        _trial(exp / f"StarPO_x_{i}_2026-11-25_00-00-00", rows, {"lr": lr})
    (exp / "StarPO_x_2_2026-11-25_00-00-00").mkdir()  # crashed before its first row
    (exp / "StarPO_x_2_2026-11-25_00-00-00" / "result.json").write_text("")
    assert main(["report", str(exp)]) == 0
    png = exp / "report" / "curves.png"
    assert rows_path(png) == exp / "report" / "curves.rows.jsonl.gz"
    kept = read_rows(rows_path(png))
    # The drawn values only, flat, one row per result row that drew one.
    assert all("config" not in row and "learners" not in row for row in kept)
    first = [r for r in kept if r["trial"] == "StarPO_x_0_2026-11-25_00-00-00"]
    assert [r["training_iteration"] for r in first] == list(range(1, 13)) + [12]
    logged = [r["rollout"]["success_rate"] for r in results[0][:12]]
    assert [r["rollout/success_rate"] for r in first[:12]] == logged
    assert first[0]["filter/in_group_reward_std_after"] == pytest.approx(0.29)  # its new name
    assert first[4]["evaluation/bandit/rev/success_rate"] == 0.1
    assert first[0]["label"] == "lr=0.0001"
    assert first[-1] == {"trial": first[0]["trial"], "label": "lr=0.0001",
                         "training_iteration": 12, "evaluation/success_rate": 0.5}  # fmt: skip
    second = [r for r in kept if r["trial"] == "StarPO_x_1_2026-11-25_00-00-00"]
    assert second[4]["evaluation/ttt/random/game/win_rate"] == 5 / 9
    assert second[0]["rollout/game/win_rate"] == 1 / 18 and second[0]["collapse/warning"] == 0
    assert kept[-1] == {"trial": "StarPO_x_2_2026-11-25_00-00-00", "label": "lr=null"}
    # The same panels, lines, points and warning: the same figure, byte for byte.
    names, labels, again = curves_from_rows(kept)
    assert len(names) == 3 and labels[:2] == ["lr=0.0001", "lr=0.0003"]
    assert panel_series(again) == panel_series(results + [[]])
    assert [warning_iteration(r) for r in again] == [7, 7, None]
    assert redraw(rows_path(png)) == png.read_bytes()
    assert main(["report", str(exp / "StarPO_x_0_2026-11-25_00-00-00")]) == 0  # one trial
    one = exp / "StarPO_x_0_2026-11-25_00-00-00" / "report" / "curves.png"
    assert redraw(rows_path(one)) == one.read_bytes()


def test_report_keeps_the_rows_of_its_seeds_figure_and_they_redraw_the_same_png(tmp_path):
    exp = tmp_path / "exp"
    for n, (estimator, seed) in enumerate([("rae", 0), ("rae", 1), ("grpo", 0), ("grpo", 1)]):
        rows = _result_rows(20, 1e-4, games=False)
        for row in rows[:-1]:
            row["collapse"]["think_words_mean"] = 30.0 + seed - (estimator == "grpo") * n
        params = {"advantage_estimator": estimator, "seed": seed, "eval_interval": 5}
        _trial(exp / f"StarPO_x_{n}_2026-11-25_00-00-00", rows, params)
    crashed = exp / "StarPO_x_4_2026-11-25_00-00-00"  # a third grpo seed, no rows yet
    _trial(crashed, [], {"advantage_estimator": "grpo", "seed": 2, "eval_interval": 5})
    assert main(["report", str(exp)]) == 0
    png = exp / "report" / "seeds.png"
    kept = read_rows(rows_path(png))
    grpo, rae = 'advantage_estimator="grpo"', 'advantage_estimator="rae"'
    assert {r["setting"] for r in kept} == {grpo, rae}
    assert {"setting": grpo, "trial": crashed.name, "seed": 2} in kept
    at10 = [r for r in kept if r.get("training_iteration") == 10 and r["seed"] == 1]
    assert [r["evaluation/success_rate"] for r in at10] == [0.4, 0.4]
    assert {r["collapse/think_words_mean"] for r in at10} == {31.0, 28.0}
    groups, evals, trains, measures = seeds_from_rows(kept)
    assert [len(m) for m in groups.values()] == [3, 2]  # grpo (3 trials, one empty), rae
    logged = {r["training_iteration"]: r["rollout"]["success_rate"] for r in rows[:-1]}
    assert trains[0] == logged  # every trial logged the same training success
    assert evals[0] == {5: 0.4, 10: 0.4, 15: 0.4, 20: 0.5}  # the last row's evaluation wins
    assert measures["token entropy"][0][4] == 0.25 and evals[2] == {}
    assert redraw(rows_path(png)) == png.read_bytes()


def _bench(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))


def test_plot_curves_keeps_its_points_and_eval_markers_and_redraws_from_them(tmp_path):
    plot_curves = _bench("plot_curves")
    points = [{"iteration": i, "wall_s": 0.3 * i, "success": None if i == 1 else i / 30,
               "in_group_reward_std": 0.2, "entropy": 1.0 - i / 60, "timing/rollout_s": 0.1}
              for i in range(1, 31)]  # fmt: skip
    (tmp_path / "curve.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    figures = {"success_before": 0.566, "success_after": 1.0, "eval_states": 256,
               "eval_temperature": 0.5, "iterations": 30}  # fmt: skip
    (tmp_path / "figures.json").write_text(json.dumps(figures))
    out = tmp_path / "bandit_cpu.png"
    args = ["--figures", str(tmp_path / "figures.json"), "--title", "Bandit", "--out", str(out)]
    assert plot_curves.main([str(tmp_path / "curve.jsonl"), *args]) == 0
    rows_file = tmp_path / "bandit_cpu.rows.jsonl.gz"
    rows = [json.loads(line) for line in gzip.decompress(rows_file.read_bytes()).splitlines()]
    assert rows[:30] == points  # every point, every column, as read
    assert rows[30:] == [
        {"eval": "before", "iteration": 0, "success": 0.566, "eval_states": 256,
         "eval_temperature": 0.5},
        {"eval": "after", "iteration": 30, "success": 1.0, "eval_states": 256,
         "eval_temperature": 0.5},
    ]  # fmt: skip
    again = tmp_path / "again.png"
    assert plot_curves.main([str(rows_file), "--title", "Bandit", "--out", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()
    assert (tmp_path / "again.rows.jsonl.gz").read_bytes() == rows_file.read_bytes()


def test_replayed_collapse_warning_keeps_its_rows_and_redraws_from_them(tmp_path, capsys):
    replay = _bench("replay_collapse_warning")
    paths = []
    for t, drop in enumerate((30, 1000)):
        trial = tmp_path / f"trial_{t}"
        trial.mkdir()
        lines = []
        for i in range(1, 61):
            std, kl = (0.5, 0.01) if i < drop else (0.01, 1.0)  # the spread falls, KL jumps
            learner = {"approx_kl": kl, "entropy": 1.0, "gradients_actor_global_norm": 1.0}
            lines.append({"training_iteration": i,
                          "rollout": {"in_group_reward_std": std, "success_rate": std},
                          "learners": {"default_policy": learner}})  # fmt: skip
        (trial / "result.json").write_text("".join(json.dumps(r) + "\n" for r in lines))
        paths.append(str(trial / "result.json"))
    out = tmp_path / "collapse_warning.png"
    assert replay.main([*paths, "--warmup", "10", "--plot", str(out)]) == 0
    report = json.loads(capsys.readouterr().out.split("\nwrote")[0])
    rows = read_rows(rows_path(out))
    assert len(rows) == 120 and [r["results"] for r in rows[::60]] == paths
    assert rows[0]["warning_iteration"] == report[0]["warning_iteration"] is not None
    assert rows[60]["warning_iteration"] is None
    assert [r["success"] for r in rows[:60]] == [0.5] * 29 + [0.01] * 31
    again = tmp_path / "again.png"
    assert replay.main([str(rows_path(out)), "--plot", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()
