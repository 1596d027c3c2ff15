"""StarPO / StarPO-S: the algorithm with its config, the config's knobs and checks,
the driver's sampling, the rollout buffer and the checkpoint manifest."""

from ragen_rllib.algorithms.starpo.starpo import StarPO, StarPOConfig

__all__ = ["StarPO", "StarPOConfig"]
