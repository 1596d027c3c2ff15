"""The env_runner room's knobs (``env_runner/``): the shape of a rollout batch (P groups of
N rollouts, K turns of a bounded answer each), how much of a trajectory's history the
model sees, the curriculum of reset options, and self-play, where one policy plays both
seats of a two-player game against snapshots of itself (``env_runner/self_play/``)."""

from __future__ import annotations

from ragen_rllib.algorithms.starpo.config.knob import RLLIB_OWN, Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import checked_elsewhere, custom, integer

K = Knob

ROLLOUT = knobs(
    "rollout",
    K("env_groups", 8, integer(1), "P: initial states per iteration (paper 8)", cross=True),
    K("group_size", 16, integer(1), "N: rollouts per initial state (paper 16)", cross=True),
    K("max_turns", 5, integer(1), "K: turns per trajectory at most (paper 5)", cross=True),
    K("max_new_tokens", 100, integer(1), "tokens generated per turn at most", cross=True),
    K(
        "max_context_tokens",
        4096,
        integer(1),
        "a trajectory that would outgrow this ends (context_overflow); at most the "
        "model's max_position_embeddings",
        cross=True,
    ),
    K(
        "context_window",
        None,
        integer(0, none_ok=True, null="the whole history", why=" (turns of history kept)"),
        "null: the whole history in context, one sequence per trajectory; k: the "
        "instructions and the last k turns, one sequence per turn",
        cross=True,
    ),
    K(
        "curriculum",
        None,
        checked_elsewhere(
            "must be null or a list of {from_iteration, reset_options} stages, the first from 0"
        ),
        "reset options of the training envs by iteration: {from_iteration, "
        "reset_options} stages (docs/training.md)",
    ),
)

SELF_PLAY = knobs(
    "self-play",
    K(
        "self_play",
        None,
        custom(
            lambda v: v is None or isinstance(v, bool),
            "must be null (on when env names a PettingZoo AEC env's factory, else off), "
            "true, or false (not with such an env: it has no other way to play)",
        ),
        "one policy plays both seats of a two-player game (ragen/TicTacToe-v0, "
        "ragen/KuhnPoker-v0, a PettingZoo AEC env named by its factory): a group's rollouts "
        "pair up, seat 0 and seat 1 of one game, each seat's turns its own trajectory "
        "(docs/self_play.md)",
        cross=True,
    ),
    K(
        "policies",
        RLLIB_OWN,
        custom(
            lambda v: (
                isinstance(v, list | tuple | set | frozenset | dict)
                and bool(v)
                and all(isinstance(i, str) and i for i in v)
            ),
            "must be a list of policy ids (RLlib's multi_agent); besides the trained one, "
            "opponents for self_play",
        ),
        "self_play: the policies that may sit at a seat; those not trained play "
        "snapshots of the trained one (docs/self_play.md)",
        rllib=True,
        cross=True,
    ),
    K(
        "policies_to_train",
        RLLIB_OWN,
        custom(
            lambda v: (
                v is None
                or (isinstance(v, list | tuple | set) and all(isinstance(i, str) for i in v))
            ),
            "must be null or a list naming exactly one of policies",
        ),
        "the one policy the learner trains (the others are its snapshots)",
        rllib=True,
        cross=True,
    ),
    K(
        "policy_mapping_fn",
        RLLIB_OWN,
        custom(
            lambda v: callable(v) or (isinstance(v, str) and bool(v)),
            "must be 'alternate', 'module:function' or a callable (agent_id, episode) -> policy id",
        ),
        "which policy plays each seat (agent ids player_0, player_1) of each game",
        rllib=True,
        cross=True,
    ),
    K(
        "opponent_snapshot_interval",
        0,
        integer(0),
        "opponents play a snapshot of the trained policy taken every this many weight "
        "updates (0: the weights at the start, a frozen copy)",
        cross=True,
    ),
    K(
        "opponent_pool_size",
        1,
        integer(1),
        "snapshots kept; each sample's opponents play one drawn from them (1: the latest)",
        cross=True,
    ),
)

ALL = ROLLOUT + SELF_PLAY
