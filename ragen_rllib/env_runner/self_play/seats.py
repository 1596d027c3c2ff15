"""Who plays each seat of a self-play game: RLlib's multi-agent settings, read for StarPO.

A self-play run (``self_play: true``) plays both seats with the trained policy
unless the config names other policies, the way any RLlib multi-agent setup
does::

    config.multi_agent(
        policies={"main", "past"},
        policy_mapping_fn=lambda agent_id, episode, **kw: ...,  # -> "main" or "past"
        policies_to_train=["main"],
    )

or in an experiment file ``policies: [main, past]``, ``policies_to_train:
[main]`` and ``policy_mapping_fn: alternate`` (or ``module:function``).

- The policy in ``policies_to_train`` (exactly one) is the learner's model:
  its trajectories train it.
- Every other policy is an opponent that plays a snapshot of it: the weights
  the runners held at the start (``opponent_snapshot_interval: 0``, a frozen
  copy), or one of the last ``opponent_pool_size`` snapshots taken every
  ``opponent_snapshot_interval`` weight updates (a pool of its past selves;
  size 1: a copy refreshed at that interval). Its trajectories play the game
  and are not trained on.
- ``policy_mapping_fn(agent_id, episode, **kwargs)`` maps each seat of each game
  to a policy, as RLlib's does: ``agent_id`` is ``"player_0"`` or ``"player_1"``
  (PettingZoo's names for the seats) and ``episode`` a :class:`GameRef` with the
  game's number (``id_``: group g's j-th game is g * games per group + j, the
  groups numbered across the iteration's runners) and its initial state's
  seed. The built-in ``alternate`` seats the trained policy at seat ``id_ % 2``
  and an opponent at the other, so both seat orders are played equally often.

The learner keeps one model either way: two policies trained at once are not
supported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

#: RLlib's id of the one policy of a single-agent config
DEFAULT_POLICY_ID = "default_policy"
#: the agent ids of the two seats, as a policy_mapping_fn receives them
AGENT_IDS = ("player_0", "player_1")
#: games the config check maps with the user's function
CHECKED_GAMES = 8


@dataclass(frozen=True)
class GameRef:
    """What a ``policy_mapping_fn`` receives as its ``episode``: one game of a batch."""

    id_: int  # the game's number: group * games per group + its index in the group
    seed: int  # the seed of its initial state


@dataclass(frozen=True)
class OpponentSetup:
    """The trained policy, its opponents and the function that seats them."""

    trained: str
    opponents: tuple[str, ...]
    mapping: Any  # "alternate", "module:function", or a callable

    def mapping_fn(self) -> Callable[..., str]:
        if self.mapping == "alternate":
            return self._alternate
        if isinstance(self.mapping, str):
            module, _, name = self.mapping.partition(":")
            return getattr(importlib.import_module(module), name)
        return self.mapping

    def _alternate(self, agent_id: str, episode: GameRef, **kwargs: Any) -> str:
        if AGENT_IDS.index(agent_id) == episode.id_ % 2:
            return self.trained
        return self.opponents[(episode.id_ // 2) % len(self.opponents)]

    def seat(self, game: GameRef) -> tuple[str, str]:
        """The policy of each seat of ``game``."""
        fn = self.mapping_fn()
        # worker=None: RLlib's older mapping functions take (agent_id, episode, worker)
        return tuple(str(fn(agent, game, worker=None)) for agent in AGENT_IDS)  # type: ignore

    def trained_seats(self, groups: int, group_size: int) -> list[tuple[int, int]]:
        """How many rollouts the trained policy plays at seat 0 and at seat 1 of each
        group (the others are not trained on)."""
        games = group_size // 2
        out = []
        for g in range(groups):
            pairs = [self.seat(GameRef(game_number(g, j, games), 0)) for j in range(games)]
            out.append(tuple(sum(p[seat] == self.trained for p in pairs) for seat in (0, 1)))
        return out  # type: ignore[return-value]

    def trained_per_group(self, groups: int, group_size: int) -> list[int]:
        """How many of each group's rollouts the trained policy plays."""
        return [a + b for a, b in self.trained_seats(groups, group_size)]


def game_number(group: int, index: int, games_per_group: int) -> int:
    """A game's ``id_``: group ``group``'s ``index``-th game, the groups numbered across
    the iteration's runners."""
    return group * games_per_group + index


def uses_opponents(config) -> bool:
    """Whether the config names policies besides RLlib's single default one."""
    return set(_ids(config.policies)) != {DEFAULT_POLICY_ID}


def _ids(policies: Any) -> list[str]:
    if isinstance(policies, dict | list | tuple | set | frozenset):
        return list(policies)
    raise ValueError(
        f"config policies={policies!r} is invalid: must be a list of policy ids (or RLlib's "
        "mapping of id -> PolicySpec)"
    )


def read_setup(config) -> OpponentSetup:
    """The config's multi-agent settings as an :class:`OpponentSetup`; ValueError naming
    the key for anything StarPO cannot play."""
    ids = _ids(config.policies)
    if not all(isinstance(i, str) and i for i in ids):
        raise ValueError(f"config policies={ids!r} is invalid: policy ids must be strings")
    if not config.self_play_used:
        raise ValueError(
            f"config policies={sorted(ids)} is invalid without self_play: other policies play "
            "the other seat of a two-player game; set self_play: true"
        )
    if config.engine != "hf":
        raise ValueError(
            f"config engine={config.engine!r} is invalid with opponent policies: an opponent "
            "plays on a second engine in each runner, which only the hf engine makes yet"
        )
    trained = config.policies_to_train
    if callable(trained) or trained is None or len(list(trained)) != 1:
        raise ValueError(
            f"config policies_to_train={trained!r} is invalid: must name exactly one of the "
            f"policies {sorted(ids)} (the learner trains one model; the others play snapshots "
            "of it)"
        )
    (trained,) = list(trained)
    if trained not in ids:
        raise ValueError(
            f"config policies_to_train=[{trained!r}] is invalid: not one of the policies "
            f"{sorted(ids)}"
        )
    mapping = _check_mapping_fn(config.policy_mapping_fn)
    setup = OpponentSetup(trained, tuple(sorted(i for i in ids if i != trained)), mapping)
    if not setup.opponents:
        raise ValueError(
            f"config policies={ids!r} is invalid: with self_play one policy plays both seats "
            "already; name an opponent policy beside the trained one, or drop policies"
        )
    _check_seating(setup, ids, config)
    return setup


def _check_mapping_fn(mapping: Any) -> Any:
    """``policy_mapping_fn`` as set (``alternate``, ``module:function`` importable here,
    or a callable); ValueError naming it otherwise."""
    if mapping is AlgorithmConfig.DEFAULT_POLICY_MAPPING_FN:
        raise ValueError(
            "config policy_mapping_fn is not set: with opponent policies it says which "
            "policy plays each seat; use 'alternate' (the trained policy at one seat, an "
            "opponent at the other, seats alternating by game), 'module:function' or a "
            "callable"
        )
    if isinstance(mapping, str) and mapping != "alternate":
        module, colon, name = mapping.partition(":")
        try:
            found = getattr(importlib.import_module(module), name) if colon else None
        except (ImportError, AttributeError) as err:
            found, why = None, f" ({type(err).__name__}: {err})"
        else:
            why = ""
        if not callable(found):
            raise ValueError(
                f"config policy_mapping_fn={mapping!r} is invalid: must be 'alternate', "
                f"'module:function' naming a function importable here, or a callable{why}"
            )
    elif not (mapping == "alternate" or callable(mapping)):
        raise ValueError(
            f"config policy_mapping_fn={mapping!r} is invalid: must be 'alternate', "
            "'module:function' or a callable"
        )
    return mapping


def _check_seating(setup: OpponentSetup, ids: list[str], config) -> None:
    """The mapping seats known policies, the trained one among them, and leaves every
    group at least two trained rollouts to compare."""
    mapping, trained = setup.mapping, setup.trained
    seats = []
    for k in range(CHECKED_GAMES):
        try:
            seats.append(setup.seat(GameRef(k, k)))
        except Exception as err:  # noqa: BLE001 - the user's function: name it
            raise ValueError(
                f"config policy_mapping_fn={mapping!r} raised on agent ids {AGENT_IDS} "
                f"(game {k}): {type(err).__name__}: {err}"
            ) from err
    odd = sorted({p for pair in seats for p in pair} - set(ids))
    if odd:
        raise ValueError(
            f"config policy_mapping_fn={mapping!r} is invalid: it returned {odd}, which are "
            f"not among the policies {sorted(ids)}"
        )
    if not any(trained in pair for pair in seats):
        raise ValueError(
            f"config policy_mapping_fn={mapping!r} is invalid: it never seats the trained "
            f"policy {trained!r} in the first {CHECKED_GAMES} games; nothing would train"
        )
    per_group = setup.trained_per_group(config.env_groups, config.group_size)
    if min(per_group) < 2:
        raise ValueError(
            f"config group_size={config.group_size} is invalid with opponent policies: the "
            f"trained policy plays {min(per_group)} rollout(s) of some group (of each group: "
            f"{per_group}), and the group's advantages compare at least 2; raise group_size "
            "(4 with 'alternate')"
        )


def check_unused(config) -> None:
    """The opponent settings refused where no opponent plays."""
    if config.opponent_setup is None:
        for key, default in (("opponent_snapshot_interval", 0), ("opponent_pool_size", 1)):
            if getattr(config, key) != default:
                raise ValueError(
                    f"config {key}={getattr(config, key)!r} is invalid without opponent "
                    "policies: set policies, policies_to_train and policy_mapping_fn (or "
                    f"leave {key} at {default})"
                )
    elif config.opponent_pool_size > 1 and config.opponent_snapshot_interval == 0:
        raise ValueError(
            f"config opponent_pool_size={config.opponent_pool_size} is invalid with "
            "opponent_snapshot_interval=0: only the start's weights are ever kept; set an "
            "interval, or a pool size of 1"
        )
