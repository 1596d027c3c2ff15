"""The learner's metrics are declared once (ragen_rllib/records/metrics.py): the
micro-batch reduction, the reduction over learners through RLlib's own merge of the
learners' results, and the generated table in docs/metrics.md all read it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from ragen_rllib.learner.loss import minibatch_logs
from ragen_rllib.records.metrics import LEARNER_METRICS, learner_log, metrics_table

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


def test_docs_metrics_md_holds_the_generated_table():
    """Regenerate with ``python tests/test_metrics_declared.py``."""
    text = DOC.read_text()
    held = text.split("<!-- learner-metrics -->", 1)[1].split("<!-- /learner-metrics -->")[0]
    assert held.strip() == metrics_table(), "run: python tests/test_metrics_declared.py"


if __name__ == "__main__":
    head, rest = DOC.read_text().split("<!-- learner-metrics -->", 1)
    tail = rest.split("<!-- /learner-metrics -->", 1)[1]
    block = f"<!-- learner-metrics -->\n{metrics_table()}\n<!-- /learner-metrics -->"
    DOC.write_text(f"{head}{block}{tail}")
    print(f"wrote the learner metrics table of {DOC}")
