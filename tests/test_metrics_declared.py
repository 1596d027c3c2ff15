"""Metrics are declared once (ragen_rllib/records/metrics.py): the learner's
micro-batch reduction, the reduction over learners through RLlib's own merge of the
learners' results, the generated tables in docs/metrics.md and `rllib report`'s
panels all read the declarations, and what a real run logs is declared."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_script, tiny_dict
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from ragen_rllib.learner.loss import minibatch_logs
from ragen_rllib.records.metrics import (
    LEARNER_METRICS,
    declared_metric,
    learner_log,
    metrics_table,
    run_metrics_tables,
)

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


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
            "timing", "timers", "env_runners", "evaluation")  # fmt: skip


def _blocks() -> dict[str, str]:
    return {"learner-metrics": metrics_table(), "run-metrics": run_metrics_tables()}


def test_docs_metrics_md_holds_the_generated_tables():
    """Regenerate with ``python tests/test_metrics_declared.py``."""
    text = DOC.read_text()
    for marker, table in _blocks().items():
        held = text.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->")[0]
        assert held.strip() == table, "run: python tests/test_metrics_declared.py"


def test_the_report_panels_plot_declared_metrics_labelled_with_their_unit():
    from ragen_rllib.cli.report import PANELS, axis_label

    for title, series in PANELS:
        for _, key in series:
            assert declared_metric(key.replace("*", "x")) is not None, (title, key)
    assert axis_label((("", "collapse/mi"),)) == "nats"
    assert axis_label((("", "rollout/success_rate"),)) == ""
    assert axis_label((("", "learners/default_policy/entropy"),)) == "nats"


def test_a_key_matches_its_declaration_and_an_unknown_one_none():
    assert declared_metric("rollout/lake/success_rate").name == "rollout/*/success_rate"
    assert declared_metric("evaluation/suite/lake/pass@4").unit == ""
    assert declared_metric("counters/num_turns_lifetime") is not None
    assert declared_metric("rollout/no_such_metric") is None
    assert declared_metric("learners/default_policy/no_such_metric") is None


@pytest.mark.slow
def test_every_metric_a_run_logs_is_declared(tmp_path):
    """A run with most metric sources on (an env mixture, the rollout filter, dynamic
    sampling, the overlong penalty, the collapse metrics, evaluation): each key it
    logs in the project's families has a declaration."""
    config = tiny_dict(
        env_mix=[{"env": "ragen/FrozenLakeNoSlip-v0", "groups": 1, "name": "lake"},
                 {"env": "ragen/Bandit-v0", "groups": 1, "name": "bandit"}],
        max_turns=2, filter_keep_ratio=0.5, dynamic_sampling_groups=1,
        dynamic_sampling_spread="reward", overlong="penalty", overlong_buffer=4,
        collapse_metrics_interval=1, eval_interval=2, eval_num_states=2,
    )  # fmt: skip
    config.pop("env")
    script = """
import json, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
algo = StarPOConfig.from_user_dict(CONFIG).build_algo()
rows = [algo.train() for _ in range(2)]
algo.stop()
def flat(d, p=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from flat(v, p + k + "/")
        else:
            yield p + k
print(json.dumps(sorted({k for r in rows for k in flat(r)})))
"""
    keys = run_script(script, tmp_path, define={"CONFIG": config})
    ours = [k for k in keys if k.split("/")[0] in FAMILIES]
    families = {k.split("/")[0] for k in ours}
    assert families == set(FAMILIES), families  # every source logged something
    assert [k for k in ours if declared_metric(k) is None] == []


if __name__ == "__main__":
    text = DOC.read_text()
    for marker, table in _blocks().items():
        head, rest = text.split(f"<!-- {marker} -->", 1)
        tail = rest.split(f"<!-- /{marker} -->", 1)[1]
        text = f"{head}<!-- {marker} -->\n{table}\n<!-- /{marker} -->{tail}"
    DOC.write_text(text)
    print(f"wrote the metrics tables of {DOC}")
