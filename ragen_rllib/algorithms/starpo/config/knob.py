"""One knob: its name, default, rule and one line saying what it does.

Every knob an experiment may set is one :class:`Knob` in ``knobs_<room>.py``; the
config's defaults, its value checks, the unknown-key listing, the docs' knob
table (``docs/config.md``) and the config fuzzer are all read from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragen_rllib.algorithms.starpo.config.rules import Rule


class _RLlibOwn:
    """The default of an RLlib setting that StarPO leaves as RLlib has it."""

    def __repr__(self) -> str:
        return "RLlib's"


RLLIB_OWN: Any = _RLlibOwn()


@dataclass(frozen=True)
class Knob:
    """``rllib``: an attribute RLlib's AlgorithmConfig already has (its default is set
    by StarPOConfig's constructor unless it is :data:`RLLIB_OWN`). ``cross``: other
    keys may still reject a value its rule allows. ``group``: its heading in the
    knob table. ``yaml``: its spelling in an experiment file, where that differs."""

    name: str
    default: Any
    rule: Rule
    doc: str
    group: str = ""
    rllib: bool = False
    cross: bool = False
    yaml: str = ""

    @property
    def key(self) -> str:
        """The key an experiment file writes."""
        return self.yaml or self.name


def knobs(group: str, *items: Knob) -> list[Knob]:
    """The knobs of one table group."""
    return [Knob(**{**k.__dict__, "group": group}) for k in items]
