"""ragen-rllib: StarPO / StarPO-S multi-turn RL for LLM agents on Ray RLlib.

``StarPOConfig`` and ``StarPO`` are the entry points; ``register_with_tune()``
makes ``"StarPO"`` usable by name in ``tune.Tuner`` (``rllib train file``
calls it for you). The package is laid out by RLlib role: ``algorithms/starpo``,
``connectors``, ``learner``, ``rl_module``, ``env_runner``, ``engines``,
``distributed``, ``models`` and the pure ``maths``.
"""

from __future__ import annotations

__all__ = ["StarPO", "StarPOConfig", "register_with_tune"]


def register_with_tune() -> None:
    from ray import tune

    from ragen_rllib.algorithms.starpo.starpo import StarPO

    tune.register_trainable("StarPO", StarPO)


def __getattr__(name: str):
    # Lazy, so that `import ragen_rllib.maths` does not pull in Ray.
    if name in ("StarPO", "StarPOConfig"):
        from ragen_rllib.algorithms.starpo import starpo

        return getattr(starpo, name)
    raise AttributeError(name)
