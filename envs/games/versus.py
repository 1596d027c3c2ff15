"""A two-player game against a fixed opponent, as a one-agent text env.

:class:`VersusEnv` seats the model at one side of a :class:`~.rules.Game` and
plays the other side with a reference player (:mod:`.players`): the model's
answer is one action in ``<answer>``, the opponent answers at once, and the
observation is the game as the model's side sees it, with the actions it may
take now. The seat is drawn per episode (``seat: random``) or fixed, so an
evaluation over seeds covers both seat orders.

Rewards: the game's payoff for the model's side when it ends (TicTacToe +1
win, 0 draw, -1 loss; Kuhn Poker the chips won or lost), plus the format
penalty once per turn whose answer broke the format or named an action not
allowed now. What an answer that names no allowed action does is
``invalid_move``:

- ``lose_game`` (the default against a fixed opponent): the game ends there,
  lost (payoff -1);
- ``lose_turn`` (the default in self-play): the turn passes (Kuhn Poker: the
  passive action, check, or fold when facing a bet);
- ``retry``: the model answers again (its turns are bounded by ``max_turns``).

A game cut by ``max_turns`` ends unfinished, with payoff 0. ``info`` has
``seat``, ``outcome`` (win, draw, loss; None while playing or unfinished) and
``payoff``; ``success`` is a win.
"""

from __future__ import annotations

import string
from typing import Any

from ..core.base import TextEnv
from .negotiation import SimpleNegotiation
from .players import player_of
from .rules import Game, KuhnPoker, TicTacToe

#: game name -> its rules
GAMES: dict[str, type[Game]] = {
    "tictactoe": TicTacToe,
    "kuhn_poker": KuhnPoker,
    "simple_negotiation": SimpleNegotiation,
}
INVALID_MOVES = ("lose_game", "lose_turn", "retry")
SEATS = ("random", 0, 1)


class VersusEnv(TextEnv):
    """One game an episode against ``opponent`` (see the module docstring).

    Args:
        game: one of :data:`GAMES`.
        opponent: a reference player of that game (``random``; ``greedy`` or
            ``minimax`` for TicTacToe, ``nash`` for Kuhn Poker, ``trader`` for Simple Negotiation),
            or ``self``: the other seat is
            another env, joined to this one's game (self-play; the runner pairs
            them).
        seat: the model's side: ``random`` (drawn per episode), 0 or 1.
        invalid_move: one of :data:`INVALID_MOVES` (default ``lose_game``;
            ``lose_turn`` in self-play).
        **kwargs: passed to :class:`TextEnv`; the action budget is the most actions
            one side takes in a game, one action a turn.
    """

    obs_charset = string.ascii_letters + string.digits + " .,:()'+-\n"
    obs_max_length = 512

    def __init__(
        self,
        game: str = "tictactoe",
        opponent: str = "random",
        seat: str | int = "random",
        invalid_move: str | None = None,
        **kwargs: Any,
    ) -> None:
        if invalid_move is None:  # self-play: a lost game could leave a seat no turn
            invalid_move = "lose_turn" if opponent == "self" else "lose_game"
        if game not in GAMES:
            raise ValueError(f"game must be one of {sorted(GAMES)}, got {game!r}")
        if seat not in SEATS or isinstance(seat, bool):
            raise ValueError(f"seat must be one of {list(SEATS)}, got {seat!r}")
        if invalid_move not in INVALID_MOVES:
            raise ValueError(
                f"invalid_move must be one of {list(INVALID_MOVES)}, got {invalid_move!r}"
            )
        self.game = GAMES[game]()
        self.game_name = game
        self.opponent_name = opponent
        #: self-play: the other seat is played by another env's model (:meth:`join`)
        self.self_play = opponent == "self"
        self._opponent = None if self.self_play else player_of(self.game, opponent)
        self._owns_game = True  # resets the game (False: a partner's game, joined)
        self._drawn_seat = 0  # the seat drawn for this episode (seat: random)
        self.seat_choice, self.invalid_move = seat, invalid_move
        kwargs.setdefault("action_budget", self.game.max_moves)
        kwargs.setdefault("max_actions_per_turn", 1)
        kwargs.setdefault("max_turns", self.game.max_moves + 3)
        super().__init__(**kwargs)
        self._payoff: float | None = None

    # ----- the game ------------------------------------------------------------
    @property
    def seat(self) -> int:
        """The model's side: ``seat_choice``, or the one drawn for the episode."""
        return self._drawn_seat if self.seat_choice == "random" else int(self.seat_choice)

    @property
    def action_names(self) -> tuple[str, ...]:
        """The actions allowed now (once the game is over, all of the game's)."""
        return self.game.legal() or self.game.vocabulary

    def _new_episode(self) -> None:
        if self._owns_game:
            self.game.reset(self.np_random)
        if self.seat_choice == "random":
            self._drawn_seat = int(self.np_random.integers(2))
        self._payoff = None
        self._opponent_moves()

    def _opponent_moves(self) -> bool:
        """The opponent plays until it is the model's turn or the game is over;
        whether it is over (the model's payoff then kept)."""
        while (
            self._opponent is not None
            and self.game.payoffs() is None
            and self.game.to_move != self.seat
        ):
            self.game.play(self._opponent(self.game, self.np_random))
        payoffs = self.game.payoffs()
        if payoffs is not None:
            self._payoff = payoffs[self.seat]
        return payoffs is not None

    def _execute(self, action: str) -> tuple[float, bool, bool]:
        self.game.play(action)
        over = self._opponent_moves()
        return (self._payoff if over else 0.0), True, over

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.self_play and self.waiting and not self._done:
            raise RuntimeError(f"self-play: seat {self.seat} stepped while the other seat moves")
        obs, reward, terminated, truncated, info = super().step(action)
        if self.self_play and truncated and self._waits_out_its_budget():
            truncated = self._done = False  # the other seat's move still ends the game
        if info["num_actions"] or terminated or self.invalid_move == "retry":
            return obs, reward, terminated, truncated, self._result_info(info)
        # No allowed action named: the game is lost, or the turn passes.
        if self.invalid_move == "lose_game":
            self.game.resign(self.seat)
            self._payoff, terminated = -1.0, True
            info["forfeited"] = True
        else:
            self.game.forfeit_turn()
            terminated = self._opponent_moves()
        if terminated:
            info["env_reward"] += self._payoff
            reward += self._payoff
            truncated = False
            self._done = True
        info["success"] = self._is_success()
        return self._observe(), reward, terminated, truncated, self._result_info(info)

    def _waits_out_its_budget(self) -> bool:
        """Self-play: this seat made its last move (its action budget spent, within
        max_turns) and the game goes on with the other seat to move (Simple
        Negotiation's first seat after its fifth turn)."""
        out_of_turns = self.max_turns is not None and self._turn >= self.max_turns
        return self._actions_left <= 0 and not out_of_turns and self.waiting

    # ----- self-play: two envs, one game ---------------------------------------
    def join(self, first: VersusEnv) -> None:
        """Play the other seat of ``first``'s game (self-play): this env's reset no
        longer resets the game, ``first``'s does (reset ``first`` first)."""
        if not (self.self_play and first.self_play and first is not self):
            raise ValueError("join() pairs two self-play envs (opponent='self')")
        self.game, self._owns_game = first.game, False

    def own_game(self) -> None:
        """Play a game of its own again (seat 0 of a self-play pair, or alone)."""
        if not self._owns_game:
            self.game, self._owns_game = GAMES[self.game_name](), True

    def result_info(self) -> dict[str, Any]:
        """The result's ``info`` entries now (``seat``, ``outcome``, ``payoff``,
        ``success``)."""
        return {**self._result_info({}), "success": self._is_success()}

    @property
    def waiting(self) -> bool:
        """Self-play: the game goes on and the other seat is to move."""
        return self.game.payoffs() is None and self.game.to_move != self.seat

    def observe(self) -> str:
        """The observation now (after the other seat's moves)."""
        return self._observe()

    def settle(self) -> float | None:
        """Self-play: this seat's payoff once, when the other seat's move ended the
        game (None while it goes on or once paid); the episode is then over."""
        payoffs = self.game.payoffs()
        if payoffs is None or self._done:
            return None
        self._done = True
        self._payoff = payoffs[self.seat]
        return self._payoff

    def state_notes(self) -> str | None:
        """The game's true sentences about the state as the model's side sees it (its
        card, its cells, its values), deciding nothing."""
        return self.game.notes(self.seat)

    def _result_info(self, info: dict[str, Any]) -> dict[str, Any]:
        outcome = None
        if self._payoff is not None:
            outcome = "win" if self._payoff > 0 else "loss" if self._payoff < 0 else "draw"
        info.update(seat=self.seat, outcome=outcome, payoff=self._payoff)
        info.setdefault("forfeited", False)
        return info

    def _is_success(self) -> bool:
        return self._payoff is not None and self._payoff > 0

    def _render_text(self) -> str:
        text = self.game.view(self.seat)
        if self._payoff is not None:
            outcome = "won" if self._payoff > 0 else "lost" if self._payoff < 0 else "drew"
            return f"{text}\nThe game is over: you {outcome} ({self._payoff:+g})."
        return f"{text}\nYour actions now: {self.game.legal_text()}."

    # ----- the prompt ----------------------------------------------------------
    def _invalid_rule(self) -> str:
        return {
            "lose_game": "An answer without an allowed action loses the game.",
            "lose_turn": "An answer without an allowed action loses your turn.",
            "retry": "An answer without an allowed action is penalised; answer again.",
        }[self.invalid_move]

    def _full_instructions(self) -> str:
        rules = self.game.rules_text(self.game.roles[self.seat])
        budget = f"You have at most {self.action_budget} actions in the game."
        return f"{rules} {self._invalid_rule()} {budget}"

    def _compact_instructions(self) -> str:
        role = self.game.roles[self.seat]
        return f"{self.game.title}, you are {role}. Answer one of: {self.game.legal_text()}."
