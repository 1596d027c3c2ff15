"""StarPO / StarPO-S: the algorithm and its mixins (sampling, metrics, evaluation,
checkpoint state), the config (``config/``), the rollout buffer, rollout dumps and
the checkpoint manifest."""

from ragen_rllib.algorithms.starpo.starpo import StarPO, StarPOConfig

__all__ = ["StarPO", "StarPOConfig"]
