"""Two-player zero-sum games as plain rules: no text, no parsing, no gymnasium.

A :class:`Game` holds one game's state: whose turn it is (``to_move``, 0 or 1),
the actions that player may take (:meth:`Game.legal`), what an action does
(:meth:`Game.play`), the payoffs once it is over (:meth:`Game.payoffs`, one
per player, summing to zero) and what each player sees (:meth:`Game.view`).
The text envs (:mod:`.versus`) and the reference players (:mod:`.players`)
are written against this interface only.

- :class:`TicTacToe`: 3x3, X (player 0) moves first, cells named 1 to 9 row by
  row; three in a row wins (+1 / -1), a full board is a draw.
- :class:`KuhnPoker`: one hand of the three-card poker (J < Q < K); both ante
  1; player 0 acts first (check or bet 1), a bet is called or folded; at
  showdown the higher card takes the pot. Payoffs +-1 or +-2; the game's
  value is -1/18 for player 0 under optimal play.
"""

from __future__ import annotations

import numpy as np

#: the eight lines of three cells (0-based) that win at TicTacToe
LINES = (
    (0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6),
)  # fmt: skip


class Game:
    """One two-player zero-sum game (see the module docstring)."""

    #: the two players' names in prompts, player 0's first
    roles: tuple[str, str] = ("first player", "second player")
    #: actions one player takes in a game at most (its turns' budget)
    max_moves: int = 1
    #: every action's name (those legal at some point)
    vocabulary: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.to_move = 0
        self.history: list[tuple[int, str]] = []  # (player, action), in order
        self.resigned: int | None = None  # the player who lost by resigning

    def reset(self, rng: np.random.Generator) -> None:
        self.to_move = 0
        self.history = []
        self.resigned = None

    def resign(self, player: int) -> None:
        """``player`` loses the game now (payoff -1, the other +1)."""
        self.resigned = player

    def payoffs(self) -> tuple[float, float] | None:
        """Each player's payoff once the game is over (they sum to zero), else None."""
        if self.resigned is not None:
            return (-1.0, 1.0) if self.resigned == 0 else (1.0, -1.0)
        return self._outcome()

    def _outcome(self) -> tuple[float, float] | None:
        """The payoffs the rules give (no resignation), or None while playing."""
        raise NotImplementedError

    def legal(self) -> tuple[str, ...]:
        raise NotImplementedError

    def play(self, action: str) -> None:
        """The player to move takes ``action`` (one of :meth:`legal`)."""
        raise NotImplementedError

    def forfeit_turn(self) -> None:
        """The player to move loses its turn: the other player moves next."""
        self.history.append((self.to_move, "nothing"))
        self.to_move = 1 - self.to_move

    def view(self, player: int) -> str:
        """The state as ``player`` sees it."""
        raise NotImplementedError

    #: the game's name in prompts
    title: str = ""

    def rules_text(self, role: str) -> str:
        """The rules and the reward, for the player whose role is ``role``."""
        raise NotImplementedError

    def legal_text(self) -> str:
        """The actions the player to move may take, as the prompt lists them."""
        return ", ".join(self.legal())

    def notes(self, player: int) -> str | None:
        """A few true sentences about the state as ``player`` sees it, deciding nothing
        (what a format warm-up's think text reads off the state), or None."""
        return None


class TicTacToe(Game):
    roles = ("X", "O")
    max_moves = 5
    vocabulary = tuple(str(i) for i in range(1, 10))

    def __init__(self) -> None:
        super().__init__()
        self.board = [""] * 9

    def reset(self, rng: np.random.Generator) -> None:
        super().reset(rng)
        self.board = [""] * 9

    def legal(self) -> tuple[str, ...]:
        if self.payoffs() is not None:
            return ()
        return tuple(str(i + 1) for i, mark in enumerate(self.board) if not mark)

    def play(self, action: str) -> None:
        cell = int(action) - 1
        if self.board[cell]:
            raise ValueError(f"cell {action} is taken")
        self.board[cell] = self.roles[self.to_move]
        self.history.append((self.to_move, action))
        self.to_move = 1 - self.to_move

    def winner(self) -> int | None:
        for a, b, c in LINES:
            if self.board[a] and self.board[a] == self.board[b] == self.board[c]:
                return self.roles.index(self.board[a])
        return None

    def _outcome(self) -> tuple[float, float] | None:
        won = self.winner()
        if won is not None:
            return (1.0, -1.0) if won == 0 else (-1.0, 1.0)
        return (0.0, 0.0) if all(self.board) else None

    def view(self, player: int) -> str:
        rows = [
            " ".join(self.board[r * 3 + c] or str(r * 3 + c + 1) for c in range(3))
            for r in range(3)
        ]
        lines = [f"You play {self.roles[player]}."]
        moved = [(p, a) for p, a in self.history if p != player]
        if moved:
            p, a = moved[-1]
            lines.append(
                f"Your opponent ({self.roles[p]}) "
                + ("lost its turn." if a == "nothing" else f"took cell {a}.")
            )
        lines += ["Board:", *rows]
        return "\n".join(lines)

    title = "TicTacToe"

    def notes(self, player: int) -> str | None:
        mine = [str(i + 1) for i, m in enumerate(self.board) if m == self.roles[player]]
        theirs = [str(i + 1) for i, m in enumerate(self.board) if m == self.roles[1 - player]]
        free = [str(i + 1) for i, m in enumerate(self.board) if not m]
        return (
            f"I play {self.roles[player]}. My cells: {' '.join(mine) or 'none'}. "
            f"Opponent cells: {' '.join(theirs) or 'none'}. Free cells: {' '.join(free)}."
        )

    def rules_text(self, role: str) -> str:
        return (
            f"You play TicTacToe as {role} against an opponent. Players take turns "
            "marking a free cell of the 3x3 board; X moves first. Three of your marks "
            "in a row, a column or a diagonal win; a full board without that is a draw. "
            "The cells are numbered 1 to 9, row by row.\nReward: 1 for a win, 0 for a "
            "draw, -1 for a loss.\nActions: the number of one free cell."
        )


CARDS = ("J", "Q", "K")


class KuhnPoker(Game):
    roles = ("first player", "second player")
    max_moves = 2
    vocabulary = ("check", "bet", "call", "fold")

    def __init__(self) -> None:
        super().__init__()
        self.cards = (0, 1)
        self.folded: int | None = None

    def reset(self, rng: np.random.Generator) -> None:
        super().reset(rng)
        first, second = rng.permutation(3)[:2]
        self.cards = (int(first), int(second))
        self.folded = None

    def _moves(self) -> list[str]:
        return [a for _, a in self.history if a != "nothing"]

    def legal(self) -> tuple[str, ...]:
        if self.payoffs() is not None:
            return ()
        return ("call", "fold") if "bet" in self._moves() else ("check", "bet")

    def play(self, action: str) -> None:
        if action not in self.legal():
            raise ValueError(f"{action!r} is not allowed now: {self.legal()}")
        if action == "fold":
            self.folded = self.to_move
        self.history.append((self.to_move, action))
        self.to_move = 1 - self.to_move

    def forfeit_turn(self) -> None:
        """A lost turn is the passive action: check, or fold to a bet."""
        self.play("fold" if "fold" in self.legal() else "check")

    def pot(self) -> int:
        return 2 + sum(a in ("bet", "call") for a in self._moves())

    def _outcome(self) -> tuple[float, float] | None:
        moves = self._moves()
        if self.folded is not None:  # the folder loses its ante
            return (1.0, -1.0) if self.folded == 1 else (-1.0, 1.0)
        if moves in (["check", "check"], ["bet", "call"], ["check", "bet", "call"]):
            stake = self.pot() / 2
            return (stake, -stake) if self.cards[0] > self.cards[1] else (-stake, stake)
        return None

    def view(self, player: int) -> str:
        said = {"check": "checked", "bet": "bet 1", "call": "called", "fold": "folded"}
        lines = [
            f"You are the {self.roles[player]}. Your card: {CARDS[self.cards[player]]}. "
            f"The pot: {self.pot()} chips."
        ]
        for p, a in self.history:
            who = "You" if p == player else "Your opponent"
            lines.append(f"{who} {said[a]}.")
        if self.folded is None and self.resigned is None and self.payoffs() is not None:
            lines.append(f"Showdown: your opponent's card was {CARDS[self.cards[1 - player]]}.")
        return "\n".join(lines)

    title = "Kuhn Poker"

    def notes(self, player: int) -> str | None:
        card = self.cards[player]
        rank = ("the lowest card", "the middle card", "the highest card")[card]
        moves = [a for p, a in self.history if p != player and a != "nothing"]
        said = {"check": "checked", "bet": "bet", "call": "called", "fold": "folded"}
        last = f" My opponent {said[moves[-1]]}." if moves else ""
        return f"I hold {CARDS[card]}, {rank}.{last}"

    def rules_text(self, role: str) -> str:
        return (
            f"You play Kuhn Poker as the {role} against one opponent. The deck has three "
            "cards, J lower than Q lower than K. Each player gets one card and puts 1 chip "
            "in the pot. The first player checks or bets 1 chip; after a check the second "
            "player checks or bets; facing a bet a player calls (puts in 1 chip) or folds "
            "(gives up the pot). If nobody folds, the higher card takes the pot.\n"
            "Reward: the chips you win or lose.\nActions: check, bet, call, fold (those "
            "allowed now are listed each turn)."
        )
