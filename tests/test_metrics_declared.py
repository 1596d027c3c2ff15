"""Metrics are declared once (ragen_rllib/records/metrics.py): the learner's
micro-batch reduction, the reduction over learners through RLlib's own merge of the
learners' results, the generated tables in docs/metrics.md and `rllib report`'s
panels all read the declarations; every logging call in the package goes through a
helper that refuses an undeclared key, and what a real run logs is declared."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from conftest import run_script, tiny_dict
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, LEARNER_RESULTS
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from ragen_rllib.learner.loss import minibatch_logs
from ragen_rllib.records.metrics import (
    ENV_RUNNERS,
    LEARNER_METRICS,
    LEARNERS,
    declared_metric,
    learner_log,
    metrics_table,
    run_aggregate,
    run_log,
    run_log_dict,
    run_log_time,
    run_metrics_tables,
)

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "metrics.md"


def _over_learners(per_learner: list[dict[str, float]]) -> dict[str, float]:
    """What the algorithm's result holds after each learner logged ``per_learner[i]``:
    every learner reduces its logger, and the root merges them (as Algorithm does with
    the learner group's results)."""
    results = []
    for values in per_learner:
        learner = MetricsLogger()
        for name, value in values.items():
            learner_log(learner, "default_policy", name, value)
        results.append(learner.reduce())
    root = MetricsLogger(root=True)
    root.aggregate(results, key="learners")
    out = root.reduce()["learners"]["default_policy"]
    return {k: float(v) for k, v in out.items()}


def test_maxima_reduce_as_maxima_over_learners():
    """Two learners with ratio_max 1 and 9 log 9 (their mean, 5, was logged before);
    a share-based term logs the learners' mean of world times their shares."""
    out = _over_learners([
        {"ratio_max": 1.0, "is_weight_max": 1.5, "policy_loss": 0.2},
        {"ratio_max": 9.0, "is_weight_max": 1.1, "policy_loss": 0.6},
    ])  # fmt: skip
    assert out["ratio_max"] == 9.0
    assert out["is_weight_max"] == 1.5
    assert out["policy_loss"] == pytest.approx(0.4)


def test_an_empty_micro_batch_contributes_nothing():
    """A micro-batch with no response token reports is_weight_max 1.0 and ratio_max 0
    by construction; neither may reach the minibatch's figure."""
    empty = {"is_weight_max": torch.tensor(1.0), "ratio_max": torch.tensor(0.0),
             "policy_loss": torch.tensor(0.0), "response_tokens": torch.tensor(0.0)}  # fmt: skip
    full = {"is_weight_max": torch.tensor(0.8), "ratio_max": torch.tensor(1.3),
            "policy_loss": torch.tensor(0.25), "response_tokens": torch.tensor(5.0)}  # fmt: skip
    out = minibatch_logs([empty, full], world=2)
    assert float(out["is_weight_max"]) == pytest.approx(0.8)
    assert float(out["ratio_max"]) == pytest.approx(1.3)
    assert float(out["policy_loss"]) == pytest.approx(0.5)  # shares: summed, times world
    assert float(out["response_tokens"]) == pytest.approx(10.0)
    # a learner whose micro-batches are all empty logs no maximum at all
    assert "is_weight_max" not in minibatch_logs([empty], world=2)


def test_an_undeclared_learner_metric_is_refused_with_where_to_declare_it():
    with pytest.raises(KeyError, match="records/metrics.py"):
        learner_log(MetricsLogger(), "default_policy", "no_such_metric", 1.0)
    with pytest.raises(KeyError, match="no_such_metric"):
        minibatch_logs([{"no_such_metric": torch.tensor(1.0)}], world=1)


def test_the_run_helpers_refuse_an_undeclared_key_with_where_to_declare_it():
    logger = MetricsLogger()
    with pytest.raises(KeyError, match="records/metrics.py"):
        run_log(logger, ("rollout", "no_such_metric"), 1.0)
    with pytest.raises(KeyError, match="env_runners/engine/no_such_count"):
        run_log(logger, ("engine", "no_such_count"), 1, under=ENV_RUNNERS)
    with pytest.raises(KeyError, match="records/metrics.py"):  # declared, but not there
        run_log(logger, "rollout_time_s", 1.0)
    with pytest.raises(KeyError, match="collapse/nested/no_such_metric"):  # a nested leaf
        run_log_dict(logger, {"distinct_1": 0.5, "nested": {"no_such_metric": 1}}, key="collapse")
    with pytest.raises(KeyError, match="timers/no_such_stage"):
        run_log_time(logger, ("timers", "no_such_stage"))
    with pytest.raises(KeyError, match="records/metrics.py"):
        run_aggregate(logger, [{}], key="somewhere_else")
    assert logger.reduce() == {}  # nothing refused was logged


def test_the_run_helpers_log_through_rllibs_logger_with_its_options():
    """Each helper passes RLlib's reduce and window on; keys land as RLlib's own calls
    would put them (a runner's result under env_runners/, merged by the driver)."""
    runner = MetricsLogger()
    run_log(runner, ("engine", "releases"), 1, reduce="sum", under=ENV_RUNNERS)
    run_log(runner, ("engine", "releases"), 1, reduce="sum", under=ENV_RUNNERS)
    run_log(runner, "opponent/snapshots_kept", 2.0, window=1, under=ENV_RUNNERS)
    driver = MetricsLogger(root=True)
    run_aggregate(driver, [runner.reduce()], key=ENV_RUNNERS)
    run_log(driver, ("curriculum", "stage"), 1, window=1)
    run_log(driver, ("curriculum", "stage"), 2, window=1)
    run_log_dict(driver, {"lake": {"success_rate": 0.5}, "pass@4": 1.0}, key="evaluation")
    with run_log_time(driver, ("timers", "evaluation")):
        pass
    out = driver.reduce()
    assert out["env_runners"]["engine"]["releases"] == 2
    assert out["env_runners"]["opponent/snapshots_kept"] == 2.0
    assert out["curriculum"]["stage"] == 2  # window 1: the latest
    assert out["evaluation"]["lake"]["success_rate"] == 0.5
    assert out["timers"]["evaluation"] >= 0.0


def _logger_calls_past_the_helpers() -> list[str]:
    """Every call of a MetricsLogger logging method in the package outside
    records/metrics.py, as "path:line .method"."""
    methods = {"log_value", "log_dict", "log_time", "aggregate", "set_value"}
    found = []
    for path in sorted((ROOT / "ragen_rllib").rglob("*.py")):
        if path.relative_to(ROOT).as_posix() == "ragen_rllib/records/metrics.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            func = getattr(node, "func", None)
            if isinstance(node, ast.Call) and isinstance(func, ast.Attribute):
                if func.attr in methods:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} .{func.attr}")
    return found


def test_every_metric_is_logged_through_a_checked_helper():
    """The driver, the runners, the connectors and the learners log only through
    run_log, run_log_dict, run_log_time, run_aggregate and learner_log, which refuse
    an undeclared key: a direct MetricsLogger call would skip that check."""
    assert _logger_calls_past_the_helpers() == [], (
        "log through the helpers of ragen_rllib/records/metrics.py"
    )


def test_every_declaration_names_its_reductions():
    for m in LEARNER_METRICS.values():
        assert m.definition and m.over_microbatches in ("share", "max", "min", "once"), m
        assert m.over_learners in ("mean", "max", "min", "sum"), m
        maxima = m.over_microbatches in ("max", "min")
        assert not maxima or m.over_learners == m.over_microbatches, m


#: The project's result families (RLlib's own keys, such as perf/ or
#: fault_tolerance/, are RLlib's to document). learners/ is checked as it is logged:
#: learner_log refuses an undeclared name.
FAMILIES = ("rollout", "filter", "collapse", "dynamic_sampling", "overlong", "counters",
            "timing", "timers", "curriculum", "env_runners", "evaluation")  # fmt: skip


def _blocks() -> dict[str, str]:
    return {"learner-metrics": metrics_table(), "run-metrics": run_metrics_tables()}


def test_docs_metrics_md_holds_the_generated_tables():
    """Regenerate with ``python tests/test_metrics_declared.py``."""
    text = DOC.read_text()
    for marker, table in _blocks().items():
        held = text.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->")[0]
        assert held.strip() == table, "run: python tests/test_metrics_declared.py"


def test_the_report_panels_plot_declared_metrics_labelled_with_their_unit():
    from ragen_rllib.cli.report_panels import PANELS, axis_label

    for title, series in PANELS:
        for _, key in series:
            assert declared_metric(key.replace("*", "x")) is not None, (title, key)
    from ragen_rllib.cli.report_seeds import REASONING

    for _, key in REASONING:  # the seed table's measures, and the warning's marker
        assert declared_metric(key) is not None, key
    assert declared_metric("collapse/warning") is not None
    assert axis_label((("", "collapse/mi"),)) == "nats"
    assert axis_label((("", "rollout/success_rate"),)) == ""
    assert axis_label((("", "learners/default_policy/entropy"),)) == "nats"


def test_a_key_matches_its_declaration_and_an_unknown_one_none():
    assert declared_metric("rollout/lake/success_rate").name == "rollout/*/success_rate"
    assert declared_metric("evaluation/suite/lake/pass@4").unit == ""
    assert declared_metric("counters/num_turns_lifetime") is not None
    assert declared_metric("rollout/no_such_metric") is None
    assert declared_metric("learners/default_policy/no_such_metric") is None
    # the driver's own families beside the trajectory statistics
    assert declared_metric("env_runners/engine/sleeps_skipped").unit == "releases"
    assert declared_metric("env_runners/opponent/snapshot_version_mean").unit == "updates"
    assert declared_metric("curriculum/stage") is not None
    assert declared_metric("timers/engine_release").unit == "s"
    assert declared_metric("timers/no_such_stage") is None
    assert declared_metric("learners/__all_modules__/num_module_steps_trained") is not None
    assert (ENV_RUNNERS, LEARNERS) == (ENV_RUNNER_RESULTS, LEARNER_RESULTS)


def _rllib_timer(key: str) -> bool:
    """One of RLlib's own timers of every Algorithm (``timers/training_iteration``, ...),
    RLlib's to document; the ones the training step opens are declared."""
    import ray.rllib.utils.metrics as rllib_metrics

    names = {v for k, v in vars(rllib_metrics).items() if k.endswith("_TIMER")}
    parts = key.split("/")
    return len(parts) == 2 and parts[0] == "timers" and parts[1] in names


_RUNS_SCRIPT = """
import json, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
def flat(d, p=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from flat(v, p + k + "/")
        else:
            yield p + k
keys = []
for config, iterations in RUNS:
    algo = StarPOConfig.from_user_dict(config).build_algo()
    rows = [algo.train() for _ in range(iterations)]
    algo.stop()
    keys.append(sorted({k for r in rows for k in flat(r)}))
print(json.dumps(keys))
"""


@pytest.mark.slow
def test_every_metric_a_run_logs_is_declared(tmp_path):
    """Three short runs in one process, with every metric source on between them: an
    env mixture with the rollout filter, dynamic sampling, the overlong penalty, the
    collapse metrics and evaluation; a curriculum with the engine's release for the
    update (engine_sleep_level 1, which a CPU skips and counts: both counters); a game
    against past snapshots. Each key they log in the project's families is declared."""
    mixture = tiny_dict(
        env_mix=[{"env": "ragen/FrozenLakeNoSlip-v0", "groups": 1, "name": "lake"},
                 {"env": "ragen/Bandit-v0", "groups": 1, "name": "bandit"}],
        max_turns=2, filter_keep_ratio=0.5, dynamic_sampling_groups=1,
        dynamic_sampling_spread="reward", overlong="penalty", overlong_buffer=4,
        collapse_metrics_interval=1, eval_interval=2, eval_num_states=2,
    )  # fmt: skip
    mixture.pop("env")
    curriculum = tiny_dict(
        env="ragen/SimpleSokoban-v0",
        curriculum=[{"from_iteration": 0, "reset_options": {"max_solution_length": 2}}],
        engine_sleep_level=1,
    )
    game = tiny_dict(
        env="ragen/TicTacToe-v0", self_play=True, group_size=4, env_groups=1, max_turns=6,
        policies=["main", "past"], policies_to_train=["main"], policy_mapping_fn="alternate",
        opponent_snapshot_interval=1, opponent_pool_size=2, minibatch_size=2,
    )  # fmt: skip
    runs = [(mixture, 2), (curriculum, 2), (game, 1)]
    keys = run_script(_RUNS_SCRIPT, tmp_path, define={"RUNS": runs})
    ours = [[k for k in run if k.split("/")[0] in FAMILIES] for run in keys]
    mixed = {k.split("/")[0] for k in ours[0]}
    assert mixed == set(FAMILIES) - {"curriculum"}, mixed  # every source logged something
    assert "curriculum/stage" in ours[1]
    assert {"env_runners/engine/releases", "env_runners/engine/sleeps_skipped"} <= set(ours[1])
    assert {"env_runners/opponent/snapshots_kept",
            "env_runners/opponent/snapshot_version_mean"} <= set(ours[2])  # fmt: skip
    undeclared = [k for run in ours for k in run if declared_metric(k) is None]
    assert [k for k in undeclared if not _rllib_timer(k)] == []


if __name__ == "__main__":
    text = DOC.read_text()
    for marker, table in _blocks().items():
        head, rest = text.split(f"<!-- {marker} -->", 1)
        tail = rest.split(f"<!-- /{marker} -->", 1)[1]
        text = f"{head}<!-- {marker} -->\n{table}\n<!-- /{marker} -->{tail}"
    DOC.write_text(text)
    print(f"wrote the metrics tables of {DOC}")
