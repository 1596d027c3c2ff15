"""Simple Negotiation: two traders, five goods, private values, a fixed number of turns.

Each player starts with a stock of five goods (wheat, wood, sheep, brick, ore;
5 to 25 of each) and values each good privately: a whole number drawn per
player and good within 20% of the good's base value (5, 10, 15, 25, 40), kept
within 5 to 40. The players move in turn, player 0 first, ``max_moves`` turns each.
On a turn a player either

- answers the offer waiting for it: ``accept`` (the trade happens, when both
  still hold the goods) or ``reject``;
- or proposes a trade, ``offer N GOOD for M GOOD``: it gives N of the first
  good and receives M of the second (N and M from 1 to 5; it must hold the N).
  Proposing (or passing) while an offer waits rejects that offer;
- or ``pass``.

An offer nobody answers lapses when the game ends. Once both players have had
their turns, each player's gain is the change in the value of its stock by its
own values; the one who gained more wins (+1, the other -1), equal gains draw
(0). The game is zero-sum although trades can make both richer: what counts is
trading better than the other side.

The rules follow TextArena's SimpleNegotiation (the same goods, base values,
stocks, value spread, ten turns in all, and an offer not accepted counts as
rejected), with one good against one good per offer
and named actions in place of its bracketed free-form messages, so an answer is
checked against the actions allowed now like every other env's.
"""

from __future__ import annotations

import numpy as np

from .rules import Game

GOODS = ("wheat", "wood", "sheep", "brick", "ore")
BASE_VALUES = (5, 10, 15, 25, 40)
QUANTITIES = range(1, 6)  # an offer's N and M


def offer_name(give: int, good: str, get: int, wanted: str) -> str:
    return f"offer {give} {good} for {get} {wanted}"


def _read_offer(action: str) -> tuple[int, str, int, str]:
    _, give, good, _, get, wanted = action.split()
    return int(give), good, int(get), wanted


class SimpleNegotiation(Game):
    """The game of the module docstring."""

    roles = ("player 0", "player 1")
    max_moves = 5
    vocabulary = (
        "accept",
        "reject",
        "pass",
        *(
            offer_name(n, g, m, w)
            for g in GOODS
            for w in GOODS
            if w != g
            for n in QUANTITIES
            for m in QUANTITIES
        ),
    )

    def __init__(self) -> None:
        super().__init__()
        self.stock = [dict.fromkeys(GOODS, 0), dict.fromkeys(GOODS, 0)]
        self.start = [dict(s) for s in self.stock]
        self.values = [
            dict(zip(GOODS, BASE_VALUES, strict=True)),
            dict(zip(GOODS, BASE_VALUES, strict=True)),
        ]
        self.pending: tuple[int, str, int, str] | None = None  # (give, good, get, wanted)
        self.turns = 0

    def reset(self, rng: np.random.Generator) -> None:
        super().reset(rng)
        self.stock = [{g: int(rng.integers(5, 26)) for g in GOODS} for _ in range(2)]
        self.start = [dict(s) for s in self.stock]
        self.values = [
            {
                g: int(rng.integers(max(b - b // 5, 5), min(b + b // 5, 40) + 1))
                for g, b in zip(GOODS, BASE_VALUES, strict=True)
            }
            for _ in range(2)
        ]
        self.pending, self.turns = None, 0

    # ----- rules -----------------------------------------------------------------
    def legal(self) -> tuple[str, ...]:
        if self.payoffs() is not None:
            return ()
        mine = self.stock[self.to_move]
        answers: tuple[str, ...] = ()
        if self.pending is not None:
            answers = ("accept", "reject") if self._can_accept() else ("reject",)
        offers = tuple(
            offer_name(n, g, m, w)
            for g in GOODS
            for w in GOODS
            if w != g
            for n in QUANTITIES
            if mine[g] >= n
            for m in QUANTITIES
        )
        return (*answers, "pass", *offers)

    def _can_accept(self) -> bool:
        give, good, get, wanted = self.pending
        proposer, me = 1 - self.to_move, self.to_move
        return self.stock[proposer][good] >= give and self.stock[me][wanted] >= get

    def play(self, action: str) -> None:
        if action not in self.legal():
            raise ValueError(f"{action!r} is not allowed now")
        me, other = self.to_move, 1 - self.to_move
        if action == "accept":
            give, good, get, wanted = self.pending
            self.stock[other][good] -= give
            self.stock[me][good] += give
            self.stock[me][wanted] -= get
            self.stock[other][wanted] += get
            self.pending = None
        else:  # reject, pass or a new offer: the waiting offer is rejected
            self.pending = _read_offer(action) if action.startswith("offer ") else None
        self.history.append((me, action))
        self._end_turn()

    def forfeit_turn(self) -> None:
        """A lost turn passes; an offer waiting for the player lapses."""
        self.pending = None
        self.history.append((self.to_move, "nothing"))
        self._end_turn()

    def _end_turn(self) -> None:
        self.turns += 1
        self.to_move = 1 - self.to_move

    def gain(self, player: int) -> int:
        """The change in the value of ``player``'s stock, by its own values."""
        values = self.values[player]
        return sum(values[g] * (self.stock[player][g] - self.start[player][g]) for g in GOODS)

    def _outcome(self) -> tuple[float, float] | None:
        if self.turns < 2 * self.max_moves:
            return None
        first, second = self.gain(0), self.gain(1)
        if first == second:
            return (0.0, 0.0)
        return (1.0, -1.0) if first > second else (-1.0, 1.0)

    # ----- text ------------------------------------------------------------------
    def view(self, player: int) -> str:
        stock, values = self.stock[player], self.values[player]
        goods = ", ".join(f"{g} {stock[g]} (worth {values[g]})" for g in GOODS)
        lines = [
            f"You are {self.roles[player]}.",
            f"Your goods: {goods}.",
            f"Your gain so far: {self.gain(player):+d}.",
        ]
        if self.history and self.history[-1][0] != player:
            told = self._told(self.history[-1][1])
            if len(self.history) > 1 and self.history[-2][1].startswith("offer "):
                if self.history[-1][1] not in ("accept", "reject"):
                    told = f"did not take your offer, and {told}"
            lines.append(f"Your opponent {told}")
        if self.payoffs() is None:
            left = self.max_moves - sum(p == player for p, _ in self.history)
            lines.append(f"Your turns left: {left}.")
        else:
            lines.append(f"Your opponent's gain: {self.gain(1 - player):+d}.")
        return "\n".join(lines)

    def _told(self, action: str) -> str:
        if action.startswith("offer "):
            give, good, get, wanted = _read_offer(action)
            lapsed = ", which lapsed: the game is over" if self.payoffs() is not None else ""
            return f"offers {give} {good} for {get} {wanted} of yours{lapsed}."
        return {
            "accept": "accepted your offer.",
            "reject": "rejected your offer.",
            "pass": "passed.",
            "nothing": "lost its turn.",
        }[action]

    def legal_text(self) -> str:
        answers = [a for a in self.legal() if not a.startswith("offer ")]
        return (
            ", ".join(answers) + ", or offer N GOOD for M GOOD: N of yours, 1 to 5 and at most "
            "what you hold, for M of theirs, 1 to 5"
        )

    title = "Simple Negotiation"

    def notes(self, player: int) -> str | None:
        values = self.values[player]
        ranked = sorted(GOODS, key=lambda g: values[g])
        low, high = ranked[0], ranked[-1]
        notes = f"I value {high} most ({values[high]}) and {low} least ({values[low]})."
        if self.pending is not None and self.to_move == player:
            give, good, get, wanted = self.pending
            net = give * values[good] - get * values[wanted]
            notes += f" The offer waiting would change my value by {net:+d}."
        return notes

    def rules_text(self, role: str) -> str:
        return (
            f"You play Simple Negotiation as {role} against one opponent. Each player holds "
            "wheat, wood, sheep, brick and ore and values them privately; you see your own "
            f"values. Players take turns, {self.max_moves} each. After the last turn, the "
            "player whose goods gained more value by its own values wins.\nReward: 1 for a "
            "win, 0 for a draw, -1 for a loss.\nActions: accept or reject the offer waiting "
            "for you; offer N GOOD for M GOOD (you give N of the first good, which you must "
            "hold, and get M of the second, N and M from 1 to 5; an offer not accepted is "
            "rejected); or pass."
        )
