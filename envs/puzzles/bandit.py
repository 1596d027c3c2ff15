"""Multi-armed bandit as a one-turn text environment.

The agent sees the arms by name (their order is drawn per seed), pulls one, and
is paid a reward drawn from that arm's payout distribution. Success means it
chose the arm with the highest expected payout. The names carry meaning: in
the paper's setup one arm is "low-risk" (0.1 always) and the other "high-risk"
(1.0 with p=0.25, else 0; the better arm on average), and the question is
whether the model's prior about names such as "Librarian" or "Trader" helps or
hurts. The reversed presets give the risky payout to the safe-sounding name.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.base import TextEnv

LOW_RISK_PAYOUTS = ((0.1, 1.0),)
HIGH_RISK_PAYOUTS = ((1.0, 0.25), (0.0, 0.75))

#: preset -> (low-risk name, high-risk name). Names follow intuition (the
#: risky-sounding name is the risky arm) except in the ``*_rev`` presets.
PRESETS: dict[str, tuple[str, str]] = {
    "phoenix_dragon": ("Phoenix", "Dragon"),
    "teacher_engineer": ("Teacher", "Engineer"),
    "librarian_trader": ("Librarian", "Trader"),
    "librarian_trader_rev": ("Trader", "Librarian"),
}


@dataclass(frozen=True)
class Arm:
    """One arm: a name and a discrete payout distribution of (value, probability) pairs."""

    name: str
    payouts: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or "|" in self.name:
            raise ValueError(f"arm name must be a non-blank str without '|', got {self.name!r}")
        if not self.payouts:
            raise ValueError(f"arm {self.name!r} needs at least one (value, probability) pair")
        probs = [p for _, p in self.payouts]
        if any(p < 0 for p in probs) or abs(sum(probs) - 1.0) > 1e-9:
            raise ValueError(f"arm {self.name!r}: probabilities {probs} must be >= 0 and sum to 1")

    @property
    def mean(self) -> float:
        return float(sum(v * p for v, p in self.payouts))


def preset_arms(preset: str) -> tuple[Arm, Arm]:
    """The two arms of a named preset: (low-risk arm, high-risk arm)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown bandit preset {preset!r}; choose one of {sorted(PRESETS)}")
    low, high = PRESETS[preset]
    return Arm(low, LOW_RISK_PAYOUTS), Arm(high, HIGH_RISK_PAYOUTS)


def _to_arm(spec: Arm | Mapping[str, Any]) -> Arm:
    if isinstance(spec, Arm):
        return spec
    if not isinstance(spec, Mapping) or set(spec) != {"name", "payouts"}:
        raise ValueError(
            f"an arm is {{'name': str, 'payouts': [[value, prob], ...]}}, got {spec!r}"
        )
    return Arm(spec["name"], tuple((float(v), float(p)) for v, p in spec["payouts"]))


class BanditEnv(TextEnv):
    """A bandit with named arms, played in one turn.

    Args:
        preset: one of :data:`PRESETS` (ignored when ``arms`` is given).
        arms: explicit arms, each an :class:`Arm` or
            ``{"name": ..., "payouts": [[value, probability], ...]}``.
        **kwargs: passed to :class:`TextEnv`; the action budget defaults to 1, so
            the episode ends at the first pull. A turn without a valid pull
            leaves it open (set ``max_turns=1`` for a strict single turn).
    """

    obs_charset = string.ascii_letters + string.digits + " ,:.-'\n"
    obs_max_length = 512

    def __init__(
        self,
        preset: str = "phoenix_dragon",
        arms: Sequence[Arm | Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        self.arms = tuple(_to_arm(a) for a in arms) if arms is not None else preset_arms(preset)
        names = [a.name.lower() for a in self.arms]
        if len(self.arms) < 2 or len(set(names)) != len(names):
            raise ValueError(f"need at least two arms with distinct names, got {names}")
        bad = {c for a in self.arms for c in a.name} - set(self.obs_charset)
        if bad:
            raise ValueError(f"arm names may not contain {sorted(bad)}")
        kwargs.setdefault("action_budget", 1)
        super().__init__(**kwargs)
        self.best_mean = max(a.mean for a in self.arms)
        self._order = tuple(range(len(self.arms)))
        self._chosen: Arm | None = None

    @property
    def action_names(self) -> tuple[str, ...]:
        return tuple(self.arms[i].name for i in self._order)

    def _new_episode(self) -> None:
        self._order = tuple(int(i) for i in self.np_random.permutation(len(self.arms)))
        self._chosen = None

    def _execute(self, action: str) -> tuple[float, bool, bool]:
        arm = next(a for a in self.arms if a.name == action)
        values = np.array([v for v, _ in arm.payouts])
        probs = np.array([p for _, p in arm.payouts])
        self._chosen = arm
        return float(self.np_random.choice(values, p=probs)), True, True

    def _is_success(self) -> bool:
        return self._chosen is not None and self._chosen.mean >= self.best_mean - 1e-12

    def _extra_info(self) -> dict[str, Any]:
        return {"chosen_arm": self._chosen.name if self._chosen else None}

    def _render_text(self) -> str:
        if self._chosen is None:
            return "Arms: " + ", ".join(self.action_names)
        return f"You pulled {self._chosen.name}."

    def _compact_instructions(self) -> str:
        names = ", ".join(self.action_names)
        return f"Pull one of the arms: {names}. Answer with exactly one arm name."

    def _full_instructions(self) -> str:
        names = self.action_names
        return (
            f"You face {len(names)} slot-machine arms: {', '.join(names)}. Each pays a reward "
            "drawn from its own payout distribution, which you are not told. Pull the arm "
            "you expect to pay the most on average.\n"
            f"Actions: the arm names ({', '.join(names)}). Answer with exactly one arm name. "
            f"You have {self.action_budget} action in total."
        )
