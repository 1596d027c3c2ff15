"""Reference players: what a model is trained against and measured against.

A player is a function ``(game, rng) -> action`` that picks one of
``game.legal()`` for the player to move. :data:`PLAYERS` names them per game:

- ``random``: uniform over the legal actions (every game);
- ``minimax`` (TicTacToe): perfect play by exhaustive search, a draw at worst,
  choosing among the best cells at random;
- ``greedy`` (TicTacToe): one move deep, between the two: completes a line of
  its own when it can, else blocks one of the opponent's, else plays at random
  (:func:`greedy_player`; it loses to a fork);
- ``nash`` (Kuhn Poker): an equilibrium strategy (:func:`nash_policy`; the
  family with parameter ``alpha`` in [0, 1/3], here 1/6). Against it no strategy of the first player
  averages more than -1/18 a hand, none of the second more than +1/18.
- ``trader`` (Simple Negotiation): :func:`trader_player`, a plain trader that
  accepts what raises its own value and proposes what it expects the other
  side to take.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np

from .negotiation import BASE_VALUES, GOODS, SimpleNegotiation, offer_name
from .rules import LINES, KuhnPoker, TicTacToe

Player = Callable[[object, np.random.Generator], str]


def random_player(game, rng: np.random.Generator) -> str:
    legal = game.legal()
    return legal[int(rng.integers(len(legal)))]


@cache
def _value(board: tuple[str, ...], mark: str) -> int:
    """The game's value for the player about to place ``mark`` (+1 win, 0 draw, -1
    loss) under perfect play by both."""
    game = TicTacToe()
    game.board = list(board)
    if game.winner() is not None:
        return -1  # the other player's last mark won
    free = [i for i, m in enumerate(board) if not m]
    if not free:
        return 0
    other = "O" if mark == "X" else "X"
    return max(-_value(board[:i] + (mark,) + board[i + 1 :], other) for i in free)


def minimax_player(game: TicTacToe, rng: np.random.Generator) -> str:
    board, mark = tuple(game.board), game.roles[game.to_move]
    other = "O" if mark == "X" else "X"
    scores = {
        a: -_value(board[: int(a) - 1] + (mark,) + board[int(a) :], other) for a in game.legal()
    }
    best = max(scores.values())
    choices = [a for a, v in scores.items() if v == best]
    return choices[int(rng.integers(len(choices)))]


def _completing(board: list[str], mark: str, free: tuple[str, ...]) -> list[str]:
    """The free cells (as actions) that would complete a line of ``mark``."""
    cells = []
    for action in free:
        i = int(action) - 1
        if any(i in line and sum(board[j] == mark for j in line) == 2 for line in LINES):
            cells.append(action)
    return cells


def greedy_player(game: TicTacToe, rng: np.random.Generator) -> str:
    """A winning cell if there is one, else a cell that blocks the opponent's
    winning cell, else a uniform free cell (ties broken at random)."""
    free, mark = game.legal(), game.roles[game.to_move]
    other = "O" if mark == "X" else "X"
    choices = _completing(game.board, mark, free) or _completing(game.board, other, free)
    choices = choices or list(free)
    return choices[int(rng.integers(len(choices)))]


NASH_ALPHA = 1.0 / 6.0


def nash_policy(game: KuhnPoker, alpha: float = NASH_ALPHA) -> dict[str, float]:
    """Kuhn Poker's equilibrium, as the probability of each legal action: the first
    player bets J with probability alpha and K with 3 alpha, checks Q, and after
    check-bet calls Q with alpha + 1/3, K always, J never; the second player, after a
    check, bets K, bets J with 1/3 and checks Q, and facing a bet calls K, Q with
    1/3, folds J."""
    card = game.cards[game.to_move]  # 0 J, 1 Q, 2 K
    moves = [a for _, a in game.history if a != "nothing"]
    if game.to_move == 0 and not moves:  # opening
        p = (alpha, 0.0, 3 * alpha)[card]
        return {"bet": p, "check": 1 - p}
    if game.to_move == 1 and moves == ["check"]:
        p = (1 / 3, 0.0, 1.0)[card]
        return {"bet": p, "check": 1 - p}
    if game.to_move == 0:  # check, bet: call or fold
        p = (0.0, alpha + 1 / 3, 1.0)[card]
    else:  # facing a bet
        p = (0.0, 1 / 3, 1.0)[card]
    return {"call": p, "fold": 1 - p}


def nash_player(game: KuhnPoker, rng: np.random.Generator) -> str:
    policy = nash_policy(game)
    u, total = float(rng.random()), 0.0
    for action, p in policy.items():
        total += p
        if u < total:
            return action
    return next(reversed(policy))


def trader_player(game: SimpleNegotiation, rng: np.random.Generator) -> str:
    """Accept an offer that raises this player's value (by its own values); else
    propose the trade of one good for one other that gains it the most while the
    other side, valued at the base values, loses nothing (ties drawn at random);
    pass when no such trade exists."""
    me = game.to_move
    values, base = game.values[me], dict(zip(GOODS, BASE_VALUES, strict=True))
    legal = game.legal()
    if "accept" in legal:
        give, good, get, wanted = game.pending  # the proposer gives `good`, wants `wanted`
        if give * values[good] > get * values[wanted]:
            return "accept"
    best, offers = 0, []
    for good in GOODS:
        for wanted in GOODS:
            if wanted == good:
                continue
            for n in range(1, 6):
                for m in range(1, 6):
                    if game.stock[me][good] < n or m * base[wanted] > n * base[good]:
                        continue
                    gain = m * values[wanted] - n * values[good]
                    if gain > best:
                        best, offers = gain, []
                    if gain == best and gain > 0:
                        offers.append(offer_name(n, good, m, wanted))
    if offers:
        return offers[int(rng.integers(len(offers)))]
    return "reject" if "reject" in legal else "pass"


#: game class -> the reference players it can be played against
PLAYERS: dict[type, dict[str, Player]] = {
    TicTacToe: {"random": random_player, "greedy": greedy_player, "minimax": minimax_player},
    KuhnPoker: {"random": random_player, "nash": nash_player},
    SimpleNegotiation: {"random": random_player, "trader": trader_player},
}


#: game class -> the name of its strongest reference player (the demo's planner)
REFERENCE: dict[type, str] = {
    TicTacToe: "minimax",
    KuhnPoker: "nash",
    SimpleNegotiation: "trader",
}


def player_of(game, name: str) -> Player:
    """The reference player ``name`` for ``game``; ValueError naming those it has."""
    players = PLAYERS[type(game)]
    if name not in players:
        raise ValueError(
            f"opponent must be one of {sorted(players)} for {type(game).__name__}, got {name!r}"
        )
    return players[name]
