"""ragen-rllib: StarPO / StarPO-S multi-turn RL for LLM agents on Ray RLlib.

``StarPOConfig`` and ``StarPO`` are the entry points; ``register_with_tune()``
makes ``"StarPO"`` usable by name in ``tune.Tuner`` (``rllib train file``
calls it for you).
"""

from __future__ import annotations

__all__ = ["StarPO", "StarPOConfig", "register_with_tune"]


def register_with_tune() -> None:
    from ray import tune

    from .algorithm import StarPO

    tune.register_trainable("StarPO", StarPO)


def __getattr__(name: str):
    # Lazy, so that `import ragen_rllib.context` does not pull in Ray.
    if name == "StarPO":
        from .algorithm import StarPO

        return StarPO
    if name == "StarPOConfig":
        from .config import StarPOConfig

        return StarPOConfig
    raise AttributeError(name)
