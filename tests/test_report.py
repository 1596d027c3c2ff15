"""`rllib report`: the curves, the trajectory data in report.html, and escaping of model text."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import private_env

from ragen_rllib.algorithms.starpo.rollout_dump import SCHEMA, write_atomic
from ragen_rllib.cli import main
from ragen_rllib.cli.report_seeds import window_means

PLANTED = '</script><script>document.title="pwned"</script><img src=x onerror="alert(1)">'


def _rows(iterations: int, warn_at: int | None) -> list[dict]:
    rows = []
    for i in range(1, iterations + 1):
        row = {
            "training_iteration": i,
            "rollout": {"success_rate": i / iterations, "reward_mean": 0.5,
                        "in_group_reward_std": 0.3, "response_length_mean": 20.0},
            "learners": {"default_policy": {"entropy": 0.9, "approx_kl": 0.01,
                                            "gradients_actor_global_norm": 1.0}},
            "collapse": {"warning": warn_at if warn_at and i >= warn_at else 0},
        }  # fmt: skip
        if i % 5 == 0:
            row["evaluation"] = {"success_rate": 0.4, "bandit": {"rev": {"success_rate": 0.1}}}
        rows.append(row)
    return rows


def _turn(traj: int, turn: int, response: str, observation: str) -> dict:
    row = {name: None for name in SCHEMA.names}
    row.update(run="t", iteration=10, policy_version=9, policy_lag=0, env_id="ragen/Demo-v0",
               seed=100 + traj, group=traj // 2, trajectory=traj, kept=True, turn=turn,
               prompt="p", observation=observation, response=response, actions=["Up"],
               reward=0.5, format_ok=True, valid=True, effective=True, total_reward=1.0,
               success=traj % 2 == 0, end_reason="terminated", num_turns=2, context_tokens=5,
               response_tokens=7, advantage=0.25 - traj)  # fmt: skip
    return row


def make_trial(folder: Path, lr: float, warn_at: int | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(
        "".join(json.dumps(r) + "\n" for r in _rows(20, warn_at)) + '{"half a li'
    )
    (folder / "params.json").write_text(json.dumps({"lr": lr, "env": "ragen/Demo-v0"}))
    turns = [
        _turn(t, k, f"<think>plan {t}</think><answer>Up</answer>" if t else PLANTED,
             "P_G\n_O_" if k == 0 else "<b>grid</b> & more")
        for t in range(4) for k in range(2)
    ]  # fmt: skip
    table = pa.Table.from_pylist(turns, schema=SCHEMA)
    write_atomic(table, folder / "rollouts" / "iter_000010.parquet")
    return folder


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.data: dict[str, str] = {}
        self._open: str | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._open = dict(attrs).get("id") if tag == "script" else None

    def handle_data(self, data):
        if self._open:
            self.data[self._open] = self.data.get(self._open, "") + data


def test_report_of_one_trial_holds_curves_and_trajectories(tmp_path, capsys):
    trial = make_trial(tmp_path / "trial", 1e-4, warn_at=12)
    assert main(["report", str(trial)]) == 0
    out = trial / "report"
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert "wrote" in capsys.readouterr().out
    parser = Tags()
    parser.feed(page)
    scripts = [attrs for tag, attrs in parser.tags if tag == "script"]
    images = [attrs for tag, attrs in parser.tags if tag == "img"]
    # Only the page's own two scripts and the curves; nothing planted became markup.
    assert scripts == [{"type": "application/json", "id": "ragen-data"}, {}]
    assert len(images) == 1 and images[0]["src"].startswith("data:image/png;base64,")
    # In the raw page: the planted tags only as escaped JSON text.
    assert "<b>grid" not in page and page.count("<img") == 1
    assert page.count("</script>") == 2 and '<script>document.title="pwned"' not in page
    assert "http://" not in page and "https://" not in page  # no network fetches
    data = json.loads(parser.data["ragen-data"])
    trajectories = data["trajectories"]
    assert len(trajectories) == 4
    first = trajectories[0]
    assert first["iteration"] == 10 and first["env"] == "ragen/Demo-v0" and first["seed"] == 100
    assert len(first["turns"]) == 2
    observation, think, answer, reward, advantage, valid = first["turns"][0]
    assert answer == PLANTED and think == ""  # the planted text, intact, as data
    assert observation == "P_G\n_O_" and reward == 0.5 and advantage == 0.25 and valid
    assert trajectories[1]["turns"][0][1:3] == ["plan 1", "Up"]
    assert "collapse warning" in page and ">12<" in page  # the summary's warning column
    # The settings table: the trial's params.json, a row per setting it has.
    settings = page.split("<summary>Settings</summary>")[1].split("</details>")[0]
    assert "<th>lr</th><td>0.0001</td>" in settings
    assert "<th>env</th><td>&quot;ragen/Demo-v0&quot;</td>" in settings
    assert "kl_coeff" not in settings  # not in this trial's params


def test_report_of_a_sweep_labels_trials_by_what_differs(tmp_path):
    for i, lr in enumerate((1e-4, 3e-4)):
        make_trial(tmp_path / "exp" / f"StarPO_x_{i}_2026-11-25_00-00-00", lr)
    assert main(["report", str(tmp_path / "exp"), "--max-trajectories", "3"]) == 0
    page = (tmp_path / "exp" / "report" / "report.html").read_text()
    parser = Tags()
    parser.feed(page)
    trajectories = json.loads(parser.data["ragen-data"])["trajectories"]
    assert {t["trial"] for t in trajectories} == {"lr=0.0001", "lr=0.0003"}
    assert len(trajectories) == 6  # 3 per trial


def _seed_trial(folder: Path, params: dict | None, evals: dict[int, float], train: float) -> None:
    folder.mkdir(parents=True)
    rows = _rows(20, None)
    for row in rows:
        row["rollout"]["success_rate"] = train
        row.pop("evaluation", None)
        if row["training_iteration"] in evals:
            row["evaluation"] = {"success_rate": evals[row["training_iteration"]]}
    (folder / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if params is not None:
        (folder / "params.json").write_text(json.dumps(params))


def test_report_of_a_seed_sweep_gives_mean_and_std_per_setting(tmp_path, capsys):
    """Trials differing in `seed` and `filter_keep_ratio`: one row per ratio, a column per
    evaluated iteration, mean +- sample std over the seeds, and the count where a trial
    has no value (one not evaluated at 10, one that crashed before its first row)."""
    trials = [  # (ratio, seed, evaluations, training success)
        (0.5, 0, {10: 0.5, 20: 0.2}, 0.5), (0.5, 1, {10: 0.5, 20: 0.4}, 0.6),
        (0.5, 2, {10: 0.5, 20: 0.6}, 0.7), (1.0, 0, {10: 0.5, 20: 0.1}, 1.0),
        (1.0, 1, {20: 0.3}, 1.1), (1.0, 2, {}, 0.0),
    ]  # fmt: skip
    for n, (ratio, seed, evals, train) in enumerate(trials):
        folder = tmp_path / "exp" / f"StarPO_x_{n}_2026-11-25_00-00-00"
        _seed_trial(folder, {"filter_keep_ratio": ratio, "seed": seed, "env": "D"}, evals, train)
        if n == 5:
            (folder / "result.json").write_text("")  # crashed before its first result
    _seed_trial(tmp_path / "exp" / "StarPO_x_6_old", None, {20: 0.9}, 0.9)  # no params.json
    assert main(["report", str(tmp_path / "exp")]) == 0
    table = (tmp_path / "exp" / "report" / "seeds.md").read_text()
    assert (tmp_path / "exp" / "report" / "seeds.png").read_bytes()[:4] == b"\x89PNG"
    lines = table.splitlines()
    assert lines[0] == "| setting | seeds | eval @10 | train 1-10 | eval @20 | train 1-20 |"
    assert lines[2] == (
        "| filter_keep_ratio=0.5 | 3 | 0.500 +- 0.000 | 0.600 +- 0.100 | 0.400 +- 0.200 "
        "| 0.600 +- 0.100 |"
    )
    assert lines[3] == (
        "| filter_keep_ratio=1.0 | 3 | 0.500 (n=1) | 1.050 +- 0.071 (n=2) "
        "| 0.200 +- 0.141 (n=2) | 1.050 +- 0.071 (n=2) |"
    )
    assert lines[-1] == "left out (no seed in params.json): StarPO_x_6_old"
    assert "seeds.md" in capsys.readouterr().out


def test_a_seed_run_twice_counts_once_as_a_seed(tmp_path):
    for n, seed in enumerate((0, 0, 1)):
        folder = tmp_path / "exp" / f"StarPO_x_{n}_2026-11-25_00-00-00"
        _seed_trial(folder, {"lr": 1e-4, "seed": seed}, {20: 0.1 * n}, 0.5)
    assert main(["report", str(tmp_path / "exp")]) == 0
    row = (tmp_path / "exp" / "report" / "seeds.md").read_text().splitlines()[2]
    assert row == "| all trials | 2 (3 trials) | 0.100 +- 0.100 | 0.500 +- 0.000 |"


def test_trials_of_two_sweeps_with_the_same_setting_are_one_setting(tmp_path):
    """Tune writes an unserialisable value as its repr, whose address differs between
    processes: two sweeps' trials of one setting must still be grouped together."""
    for n, (seed, address) in enumerate(((0, "0x7f2fe1daed40"), (1, "0x7fcaebeced40"))):
        folder = tmp_path / "exp" / f"StarPO_x_{n}_2026-11-25_00-00-00"
        fn = f"<function AlgorithmConfig.DEFAULT_POLICY_MAPPING_FN at {address}>"
        _seed_trial(folder, {"lr": 1e-4, "seed": seed, "policy_mapping_fn": fn}, {20: n}, 0.5)
    assert main(["report", str(tmp_path / "exp")]) == 0
    rows = (tmp_path / "exp" / "report" / "seeds.md").read_text().splitlines()
    assert rows[2] == "| all trials | 2 | 0.500 +- 0.707 | 0.500 +- 0.000 |"


def test_a_setting_that_differs_inside_env_config_is_named_by_that_entry(tmp_path):
    # The trial folders come 5, 10, 1 (two sweeps gathered in one folder); the rows
    # are in the order of the values, numbers by size (10 after 5, not after 1).
    for n, (moves, seed) in enumerate(((5, 0), (5, 1), (10, 0), (10, 1), (1, 0), (1, 1))):
        folder = tmp_path / "exp" / f"StarPO_x_{n}_2026-11-25_00-00-00"
        env_config = {"instructions": "compact", "max_actions_per_turn": moves}
        _seed_trial(folder, {"env_config": env_config, "seed": seed}, {20: 0.05 * moves}, 0.5)
    assert main(["report", str(tmp_path / "exp")]) == 0
    rows = (tmp_path / "exp" / "report" / "seeds.md").read_text().splitlines()
    assert rows[2].startswith("| env_config.max_actions_per_turn=1 | 2 | 0.050 +- 0.000 |")
    assert rows[3].startswith("| env_config.max_actions_per_turn=5 | 2 | 0.250 +- 0.000 |")
    assert rows[4].startswith("| env_config.max_actions_per_turn=10 | 2 | 0.500 +- 0.000 |")


def test_training_curve_window_is_in_iterations_so_reuse_runs_start_with_the_rest():
    """A run that samples every 5th iteration (online_k 5) has 4 values in a 20-iteration
    window: its curve starts at its first iteration from 20 on (21), as a run that samples
    every iteration starts at 20, not once 20 values have come (iteration 96); each point
    is the mean of the values inside (it - 20, it]."""
    every = {it: float(it) for it in range(1, 41)}
    fifth = {it: float(it) for it in range(1, 41, 5)}  # 1, 6, 11, ..., 36
    assert min(window_means(every, 20)) == 20 and min(window_means(fifth, 20)) == 21
    assert window_means(every, 20)[40] == pytest.approx(sum(range(21, 41)) / 20)
    assert window_means(fifth, 20) == {
        21: (6 + 11 + 16 + 21) / 4, 26: (11 + 16 + 21 + 26) / 4,
        31: (16 + 21 + 26 + 31) / 4, 36: (21 + 26 + 31 + 36) / 4,
    }  # fmt: skip
    assert window_means({5: 1.0}, 20) == {} and window_means({}, 20) == {}


def test_report_of_a_sweep_without_a_seed_axis_writes_no_seed_table(tmp_path):
    for i, lr in enumerate((1e-4, 3e-4)):
        make_trial(tmp_path / "exp" / f"StarPO_x_{i}_2026-11-25_00-00-00", lr)
    assert main(["report", str(tmp_path / "exp"), "--max-trajectories", "1"]) == 0
    assert not (tmp_path / "exp" / "report" / "seeds.md").exists()


def test_report_names_a_folder_without_results(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "result.json" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
def test_chromium_renders_the_planted_answer_as_text(tmp_path):
    trial = make_trial(tmp_path / "trial", 1e-4)
    assert main(["report", str(trial)]) == 0
    page = (trial / "report" / "report.html").as_uri()
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    # The page's script ran: the list and the first trajectory's turns are in the DOM,
    # the planted answer as escaped text, and the title untouched.
    assert "4 matching trajectories" in dom
    assert "&lt;/script&gt;&lt;script&gt;document.title" in dom
    assert "<title>ragen-rllib report: trial</title>" in dom
    assert dom.count("<img") == 1 and "&lt;img src=x onerror" in dom  # text, not an element


def test_report_of_a_bench_train_cpu_run(tmp_path):
    """bench/bench_train_cpu.py leaves a result.json that `rllib report` reads: the
    evaluation before training as iteration 0, one row per iteration, the evaluation
    after training as a last row, and the run's rollout dumps beside it."""
    bench = Path(__file__).resolve().parents[1] / "bench" / "bench_train_cpu.py"
    config = json.dumps({"rollout_dump_interval": 1, "eval_num_states": 8})
    proc = subprocess.run(
        [sys.executable, str(bench), "tuned_examples/bandit_cpu.yaml", "--iterations", "2",
         "--threads", "1", "--config", config],
        cwd=bench.parents[1], env=private_env(tmp_path), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    trial = Path(proc.stdout.split("result.json and rollouts in ", 1)[1].splitlines()[0])
    assert trial.is_relative_to(tmp_path / "home")
    rows = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == [0, 1, 2, 2]
    after = rows[-1]["evaluation"]["success_rate"]  # and the console says it
    assert f"after 2 iterations, eval success {after:.3f}" in proc.stdout
    # Its settings as a trial's params.json, so a folder of these runs groups by seed.
    params = json.loads((trial / "params.json").read_text())
    assert params["env"] == "ragen/Bandit-v0" and params["eval_num_states"] == 8
    assert params["rollout_dump_interval"] == 1 and "lr" in params
    figures = json.loads(proc.stdout[proc.stdout.rindex("{\n") :])
    assert rows[0]["evaluation"]["success_rate"] == figures["success_before"]
    assert rows[-1]["evaluation"]["success_rate"] == figures["success_after"]
    assert rows[1]["rollout"]["success_rate"] >= 0 and "evaluation" not in rows[1]
    assert main(["report", str(trial)]) == 0
    assert (trial / "report" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (trial / "report" / "report.html").read_text()
    assert '"trajectories"' in page and "Bandit" in page


def test_panels_show_what_was_logged_with_the_loss_terms_and_smooth_long_series():
    from ragen_rllib.cli.report_panels import panel_series, smoothed

    rows = []
    for i in range(1, 101):
        learner = {"policy_loss": (-1) ** i * 0.1, "clip_frac": 0.1, "clip_frac_low": 0.04,
                   "clip_frac_high": 0.06, "kl_to_reference": 0.01 * i,
                   "actor_learning_rate": 1e-4}  # fmt: skip
        rows.append({"training_iteration": i, "rollout": {"success_rate": 0.5},
                     "learners": {"default_policy": learner}})  # fmt: skip
    titles = {title: lines for title, (lines,) in panel_series([rows])}
    # A single env logs no per-env success: no empty env_mix panels.
    assert not [t for t in titles if "per env" in t]
    assert {"policy loss", "KL to reference", "learning rate (actor)"} <= set(titles)
    assert [name for name, _, _ in titles["clipped share of tokens"]] == ["all", "low", "high"]
    # The moving average reads through alternating noise: its swing is far smaller.
    _, _, loss = titles["policy loss"][0]
    tail = smoothed(loss)[50:]
    assert max(tail) - min(tail) < 0.2 * (max(loss) - min(loss))


def test_runs_logged_under_the_old_metric_names_read_the_same():
    from ragen_rllib.cli.report_panels import OLD_NAMES, lookup

    old = {"rollout": {"reward_std": 0.4}, "filter": {"in_group_std_after": 0.3}}
    assert lookup(old, "rollout/batch_reward_std") == 0.4
    assert lookup(old, "filter/in_group_reward_std_after") == 0.3
    new = {"rollout": {"batch_reward_std": 0.5, "reward_std": 0.4}}
    assert lookup(new, "rollout/batch_reward_std") == 0.5  # the new name first
    assert all(lookup({}, name) != lookup({}, name) for name in OLD_NAMES)  # NaN, no loop


def test_flat_keys_with_slashes_are_found_under_their_family():
    """Metrics such as game/win_rate are logged as one key under rollout/ or an
    evaluation suite's env: the panels' paths find them, "*" parts included."""
    from ragen_rllib.cli.report_panels import expand, lookup

    row = {
        "training_iteration": 1,
        "rollout": {"game/win_rate": 0.25},
        "evaluation": {"tictactoe": {"minimax": {"game/win_rate": 0.0},
                                     "random": {"game/win_rate": 0.75}}},
    }  # fmt: skip
    assert lookup(row, "rollout/game/win_rate") == 0.25
    assert math.isnan(lookup(row, "rollout/game/draw_rate"))
    assert expand("evaluation/*/*/game/win_rate", [row]) == [
        ("tictactoe/minimax", "evaluation/tictactoe/minimax/game/win_rate"),
        ("tictactoe/random", "evaluation/tictactoe/random/game/win_rate"),
    ]
    assert lookup(row, "evaluation/tictactoe/random/game/win_rate") == 0.75


def _png_height(png: bytes) -> int:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(png[20:24], "big")  # IHDR: width, then height


def test_seed_report_shows_think_length_and_diversity_per_setting_between_evaluations(tmp_path):
    """An ablation's question (RAE against no RAE): does the reasoning shrink? The seed
    table gains, per setting, the think length, distinct-2 and token entropy averaged
    over each span of the evaluation interval, as mean +- std over seeds."""
    for n, (estimator, seed) in enumerate((("rae", 0), ("rae", 1), ("grpo", 0), ("grpo", 1))):
        folder = tmp_path / "exp" / f"StarPO_x_{n}_2026-11-25_00-00-00"
        params = {"advantage_estimator": estimator, "seed": seed, "eval_interval": 10}
        _seed_trial(folder, params, {10: 0.5, 20: 0.5}, 0.5)
        rows = [json.loads(line) for line in (folder / "result.json").read_text().splitlines()]
        for row in rows:
            i = row["training_iteration"]
            shrink = 0.0 if estimator == "rae" else 1.0  # no RAE: one word fewer an iteration
            row["collapse"]["think_words_mean"] = 30.0 + seed - shrink * i
            if i % 2 == 0:  # logged every other iteration: 2, 4, ..., 20
                row["collapse"]["distinct_2"] = i / 100 if estimator == "rae" else 0.1
        (folder / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(tmp_path / "exp")]) == 0
    table = (tmp_path / "exp" / "report" / "seeds.md").read_text()
    second = table.split("\n\n")[2].splitlines()
    assert second[0] == "| setting | measure | 1-10 | 11-20 |"
    assert second[2:] == [
        '| advantage_estimator="grpo" | think words | 25.000 +- 0.707 | 15.000 +- 0.707 |',
        '| advantage_estimator="grpo" | distinct-2 | 0.100 +- 0.000 | 0.100 +- 0.000 |',
        '| advantage_estimator="grpo" | token entropy | 0.900 +- 0.000 | 0.900 +- 0.000 |',
        '| advantage_estimator="rae" | think words | 30.500 +- 0.707 | 30.500 +- 0.707 |',
        '| advantage_estimator="rae" | distinct-2 | 0.060 +- 0.000 | 0.160 +- 0.000 |',
        '| advantage_estimator="rae" | token entropy | 0.900 +- 0.000 | 0.900 +- 0.000 |',
    ]
    # Five panels (two success, three reasoning) take three rows of the figure; a
    # sweep with no reasoning measures keeps the one row of two.
    with_measures = _png_height((tmp_path / "exp" / "report" / "seeds.png").read_bytes())
    from ragen_rllib.cli.report_seeds import plot_seeds

    plain = _png_height(plot_seeds({"a": [0, 1]}, [{10: 0.5}, {10: 0.5}], [{}, {}]))
    assert with_measures > 2.5 * plain


def test_reasoning_spans_follow_the_evaluation_interval_not_a_cut_run():
    from ragen_rllib.cli.report_seeds import reasoning_table, span_width

    groups = {"a": [0, 1]}
    assert reasoning_table(groups, {"think words": [{}, {}]}, 10) == ""
    one = reasoning_table(groups, {"think words": [{5: 1.0, 15: 3.0}, {}]}, 10)
    assert one.splitlines()[2] == "| a | think words | 1.000 (n=1) | 3.000 (n=1) |"
    # A measure none of the setting's trials logged has no row.
    assert len(reasoning_table(groups, {"x": [{5: 1.0}, {}], "y": [{}, {}]}, 10).splitlines()) == 5
    # Runs cut at different lengths (their last evaluation at 21 and 7) share the spans
    # of the evaluation interval, up to the last iteration logged.
    cut = reasoning_table(groups, {"think words": [{5: 1.0, 21: 2.0}, {7: 4.0}]}, 10)
    assert cut.splitlines()[0] == "| setting | measure | 1-10 | 11-20 | 21-21 |"
    assert cut.splitlines()[2] == "| a | think words | 2.500 +- 2.121 | - | 2.000 (n=1) |"
    evals = [{0: 0.5, 10: 0.5, 20: 0.5, 21: 0.5}, {0: 0.5, 7: 0.5}]
    assert span_width(groups, [{"eval_interval": 10}, {"eval_interval": 10}], evals) == 10
    assert span_width(groups, [{}, {}], evals) == 10  # not 7 (a cut run's last) nor 1
    assert span_width(groups, [{}, {}], [{0: 0.5, 30: 0.5}, {}]) == 0  # one span
    whole = reasoning_table(groups, {"think words": [{5: 1.0, 30: 3.0}, {}]}, 0)
    assert whole.splitlines()[0] == "| setting | measure | 1-30 |"
    # Evaluated every iteration: spans widen to at most max_spans columns.
    many = reasoning_table(groups, {"e": [{i: 1.0 for i in range(1, 101)}, {}]}, 1)
    head = many.splitlines()[0]
    assert head.count("|") - 3 == 12 and "| 1-9 |" in head and head.endswith("| 100-100 |")
