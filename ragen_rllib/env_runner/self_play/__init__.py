"""Self-play: one policy plays both seats of a two-player game (the env runner's part).

- ``seats.py``: who plays each seat; RLlib's multi-agent settings (``policies``,
  ``policies_to_train``, ``policy_mapping_fn``) read for StarPO and checked
  before Ray starts.
- ``games.py``: pairing a group's envs into games and playing them round by
  round, the zero-sum payoff settled on both seats.
- ``snapshots.py``: the opponent policies' snapshots of the trained policy and
  their engines.
- ``player.py``: the self-play player, one of the runner's three
  (:mod:`ragen_rllib.env_runner.players`).

The games themselves (TicTacToe, Kuhn poker, PettingZoo AEC seats) are envs,
in the env package's ``games/``.
"""
