"""The newest weights, where a runner can look for them between two turns.

Partial rollouts (``partial_rollouts``): after every update the driver posts the
new weights' object-store reference here, stamped with their policy version,
while the weights also queue behind the runners' current sample as usual. A
runner asks for the newest version at every turn boundary of a sample (one small
call) and, when it is newer than its engine's, loads it there, mid-trajectory;
the weights queued behind the sample are then not loaded a second time.

The reference travels inside a list, so that Ray hands it over as a reference
and the mailbox never holds the weights' bytes itself. Imports nothing of the
project.
"""

from __future__ import annotations

from typing import Any

import ray


@ray.remote(num_cpus=0)
class WeightMailbox:
    """The newest (policy version, [weights reference]) posted."""

    def __init__(self) -> None:
        self.version = -1
        self.weights: list[Any] = []

    def post(self, version: int, weights: list[Any]) -> None:
        if version > self.version:
            self.version, self.weights = version, weights

    def newer_than(self, version: int) -> tuple[int, list[Any]]:
        """(the newest version, its reference in a list) if newer than ``version``;
        else (``version``, [])."""
        if self.version > version:
            return self.version, self.weights
        return version, []
