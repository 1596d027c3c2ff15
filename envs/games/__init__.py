"""Two-player zero-sum text games: their rules, reference players, and the
one-agent env that plays a game against a fixed opponent."""

from .negotiation import SimpleNegotiation
from .players import (
    PLAYERS,
    greedy_player,
    minimax_player,
    nash_player,
    nash_policy,
    player_of,
    random_player,
    trader_player,
)
from .rules import Game, KuhnPoker, TicTacToe
from .versus import GAMES, INVALID_MOVES, VersusEnv

__all__ = [
    "GAMES", "INVALID_MOVES", "PLAYERS", "Game", "KuhnPoker", "SimpleNegotiation",
    "TicTacToe", "VersusEnv", "greedy_player", "minimax_player", "nash_player", "nash_policy",
    "player_of", "random_player", "trader_player",
]  # fmt: skip
