"""StarPO's watch for collapse: the indicators logged every iteration, and the guard.

Every fresh rollout batch gives the reasoning-diversity indicators
(:mod:`ragen_rllib.maths.collapse`: distinct-1/2 of the think texts within the
groups and over the batch, and template repetition). Every update gives the
signals of :class:`~ragen_rllib.maths.collapse.EarlyWarning` (the in-group reward
std, the approximate KL of the update's step, the actor's gradient norm), whose
EMAs are logged too. When the warning fires, ``collapse/warning`` holds its
iteration from then on, the reason is logged, and ``collapse_guard`` acts:
``off`` does nothing more, ``checkpoint`` saves a checkpoint at once (in the
trial's folder, ``checkpoint_collapse_warning_<iteration>``), ``stop`` ends the
trial after this iteration (its periodic checkpoints from before the warning
stay where Tune keeps them).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from ragen_rllib.env_runner.trajectory import Trajectory
from ragen_rllib.maths.collapse import (
    EarlyWarning,
    distinct_n,
    distinct_n_within_groups,
    template_repetition,
    think_text,
)

GUARDS = ("off", "stop", "checkpoint")


def diversity_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """The think texts' diversity over a batch: every answer of every trajectory."""
    start = time.perf_counter()
    texts, groups = [], []
    for t in trajectories:
        for answer in t.answers:
            texts.append(think_text(answer))
            groups.append(t.group)
    out = {
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": distinct_n(texts, 2),
        "distinct_1_in_group": distinct_n_within_groups(texts, groups, 1),
        "distinct_2_in_group": distinct_n_within_groups(texts, groups, 2),
        "template_repetition": template_repetition(texts),
    }
    out["diversity_s"] = time.perf_counter() - start
    return out


class CollapseWatch:
    """The early warning over a run's iterations, its state kept in checkpoints."""

    def __init__(self, config: Any):
        self.guard = config.collapse_guard
        self.warning = EarlyWarning(
            alpha=config.collapse_ema,
            std_drop=config.collapse_std_drop,
            spike=config.collapse_spike,
            warmup=config.collapse_warmup,
        )
        self.stop_requested = False

    def observe(
        self, in_group_std: float, step_kl: float, grad_norm: float
    ) -> tuple[dict[str, float], str | None]:
        """One iteration's signals -> (the metrics to log, the reason if it fired now)."""
        reason = self.warning.update(in_group_std, step_kl, grad_norm)
        if reason is not None and self.guard == "stop":
            self.stop_requested = True
        metrics = {f"{k}_ema": v for k, v in self.warning.ema.items()}
        metrics["warning"] = self.warning.fired_at or 0
        return metrics, reason

    def get_state(self) -> dict[str, Any]:
        return asdict(self.warning)

    def set_state(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self.warning, key, value)
