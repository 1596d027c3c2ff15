"""The two-player games: their rules, the reference players (minimax never loses,
the greedy player lies between random and minimax, Kuhn Poker's Nash strategy is
an equilibrium of value -1/18), and the one-agent env that plays them against a
fixed opponent (seats, invalid moves, rewards)."""

from __future__ import annotations

import copy
import itertools

import gymnasium as gym
import numpy as np
import pytest

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_envs.games import (
    KuhnPoker,
    TicTacToe,
    VersusEnv,
    greedy_player,
    minimax_player,
    nash_policy,
    player_of,
    random_player,
)


def answer(action: str) -> str:
    return f"<think>x</think><answer>{action}</answer>"


# ----- rules --------------------------------------------------------------------------
def test_tictactoe_rules():
    game = TicTacToe()
    game.reset(np.random.default_rng(0))
    for cell in ("1", "4", "2", "5"):
        game.play(cell)
    assert game.payoffs() is None and "3" in game.legal()
    game.play("3")  # X: 1 2 3
    assert game.payoffs() == (1.0, -1.0) and game.legal() == ()
    with pytest.raises(ValueError, match="taken"):
        game.board[8] = ""
        game.play("1")
    draw = TicTacToe()
    draw.reset(np.random.default_rng(0))
    for cell in ("1", "2", "3", "5", "4", "6", "8", "7", "9"):
        draw.play(cell)
    assert draw.payoffs() == (0.0, 0.0)


@pytest.mark.parametrize("seat", [0, 1])
def test_minimax_never_loses(seat):
    rng = np.random.default_rng(seat)
    outcomes = []
    for _ in range(200):
        game = TicTacToe()
        game.reset(rng)
        while game.payoffs() is None:
            player = minimax_player if game.to_move == seat else random_player
            game.play(player(game, rng))
        outcomes.append(game.payoffs()[seat])
    assert min(outcomes) == 0.0 and max(outcomes) == 1.0  # it wins most, never loses
    game = TicTacToe()
    game.reset(rng)
    while game.payoffs() is None:
        game.play(minimax_player(game, rng))
    assert game.payoffs() == (0.0, 0.0)  # perfect play draws


def test_greedy_wins_when_it_can_else_blocks():
    rng = np.random.default_rng(0)
    game = TicTacToe()
    game.reset(rng)
    for cell in ("1", "4", "2", "5"):  # X: 1 2, O: 4 5; X to move
        game.play(cell)
    assert {greedy_player(game, rng) for _ in range(20)} == {"3"}  # its own line first
    game.play("7")  # X elsewhere; O to move, O can win at 6
    assert {greedy_player(game, rng) for _ in range(20)} == {"6"}
    block = TicTacToe()
    block.reset(rng)
    for cell in ("1", "5", "2"):  # X threatens 3; O has no line of its own
        block.play(cell)
    assert {greedy_player(block, rng) for _ in range(20)} == {"3"}


def _results(first, second, games: int, seed: int) -> list[float]:
    """The first player's payoffs over ``games`` games of ``first`` against ``second``."""
    rng = np.random.default_rng(seed)
    payoffs = []
    for _ in range(games):
        game = TicTacToe()
        game.reset(rng)
        while game.payoffs() is None:
            player = first if game.to_move == 0 else second
            game.play(player(game, rng))
        payoffs.append(game.payoffs()[0])
    return payoffs


def test_greedy_lies_between_random_and_minimax():
    # As O (the harder seat): it beats the random player far more often than a
    # random player does, and never beats minimax.
    as_o = [-p for p in _results(random_player, greedy_player, 400, 1)]
    random_as_o = [-p for p in _results(random_player, random_player, 400, 1)]
    assert as_o.count(1.0) > random_as_o.count(1.0) + 80
    assert as_o.count(-1.0) < random_as_o.count(-1.0) / 2
    against_minimax = _results(greedy_player, minimax_player, 200, 2)
    assert max(against_minimax) <= 0.0
    assert min(against_minimax) == -1.0  # minimax forks it


def _value(strategies, game=None) -> float:
    """Player 0's exact expected payoff, each player's action probabilities given by
    ``strategies[player](game)``, over the six deals."""
    if game is None:
        total = 0.0
        for cards in itertools.permutations(range(3), 2):
            deal = KuhnPoker()
            deal.reset(np.random.default_rng(0))
            deal.cards = cards
            total += _value(strategies, deal) / 6
        return total
    payoffs = game.payoffs()
    if payoffs is not None:
        return payoffs[0]
    value = 0.0
    for action, p in strategies[game.to_move](game).items():
        if p:
            after = copy.deepcopy(game)
            after.play(action)
            value += p * _value(strategies, after)
    return value


def _pure(choice: dict) -> callable:
    """A deterministic strategy: the action for (card, legal actions)."""
    return lambda game: {choice[(game.cards[game.to_move], game.legal())]: 1.0}


def _pure_strategies():
    situations = [
        (card, legal) for card in range(3) for legal in (("check", "bet"), ("call", "fold"))
    ]
    for picks in itertools.product(*[legal for _, legal in situations]):
        yield _pure(dict(zip(situations, picks, strict=True)))


def test_kuhn_nash_is_an_equilibrium_of_value_minus_one_eighteenth():
    assert _value((nash_policy, nash_policy)) == pytest.approx(-1 / 18, abs=1e-12)
    # No pure strategy of either seat does better against it (64 each).
    best_second = max(-_value((nash_policy, s)) for s in _pure_strategies())
    best_first = max(_value((s, nash_policy)) for s in _pure_strategies())
    assert best_second == pytest.approx(1 / 18, abs=1e-12)
    assert best_first == pytest.approx(-1 / 18, abs=1e-12)


def test_kuhn_rules_and_payoffs():
    game = KuhnPoker()
    game.reset(np.random.default_rng(0))
    game.cards = (2, 0)  # K against J
    assert game.legal() == ("check", "bet")
    game.play("check")
    game.play("bet")
    assert game.legal() == ("call", "fold") and game.pot() == 3
    game.play("call")
    assert game.payoffs() == (2.0, -2.0)
    assert "Showdown: your opponent's card was K." in game.view(1)
    folded = KuhnPoker()
    folded.reset(np.random.default_rng(0))
    folded.cards = (2, 0)
    folded.play("bet")
    folded.play("fold")
    assert folded.payoffs() == (1.0, -1.0)


# ----- the env against a fixed opponent --------------------------------------------------
def test_players_are_named_per_game():
    names = r"\['greedy', 'minimax', 'random'\]"
    with pytest.raises(ValueError, match=f"opponent must be one of {names}"):
        player_of(TicTacToe(), "nash")
    with pytest.raises(ValueError, match="seat must be one of"):
        VersusEnv(seat=2)
    with pytest.raises(ValueError, match="invalid_move must be one of"):
        VersusEnv(invalid_move="shrug")
    with pytest.raises(ValueError, match="game must be one of"):
        VersusEnv(game="chess")


def test_both_seats_are_drawn_and_a_fixed_seat_holds():
    seats = {gym.make("ragen/TicTacToe-v0").unwrapped for _ in range(1)}
    env = seats.pop()
    drawn = set()
    for seed in range(20):
        env.reset(seed=seed)
        drawn.add(env.seat)
    assert drawn == {0, 1}
    fixed = VersusEnv(seat=1)
    for seed in range(5):
        obs, _ = fixed.reset(seed=seed)
        assert fixed.seat == 1 and "You play O." in obs and "took cell" in obs


@pytest.mark.parametrize(
    ("mode", "terminated", "reward"),
    [("lose_game", True, -1.1), ("lose_turn", False, -0.1), ("retry", False, -0.1)],
)
def test_an_answer_without_an_allowed_move(mode, terminated, reward):
    env = VersusEnv(game="tictactoe", opponent="random", seat=0, invalid_move=mode)
    env.reset(seed=0)
    board = list(env.game.board)
    _, r, term, trunc, info = env.step("I would rather not play")
    assert (term, r) == (terminated, pytest.approx(reward))
    assert info["format_penalty"] == -0.1
    assert r == pytest.approx(info["env_reward"] + info["format_penalty"])
    if mode == "lose_game":
        assert info["outcome"] == "loss" and info["forfeited"] and not info["success"]
    elif mode == "lose_turn":  # the opponent moved in the model's place
        assert sum(bool(c) for c in env.game.board) == sum(bool(c) for c in board) + 1
    else:
        assert env.game.board == board and not term


def test_a_won_game_pays_and_succeeds():
    env = VersusEnv(game="kuhn_poker", opponent="nash", seat=0)
    wins = payoffs = 0
    for seed in range(200):
        env.reset(seed=seed)
        done = False
        while not done:
            legal = env.action_names
            action = "bet" if "bet" in legal else "call"  # always aggressive
            _, r, term, trunc, info = env.step(answer(action))
            done = term or trunc
        assert term and info["payoff"] == r and info["success"] == (r > 0)
        wins += info["success"]
        payoffs += r
    # Always betting loses against the equilibrium: exactly -1/9 a hand as the opener.
    assert 0 < wins < 200 and payoffs / 200 < -1 / 18


def test_state_notes_read_the_state_and_decide_nothing():
    """What a format warm-up's think text says (format_warmup_think: state): the card,
    the cells, the values; never an action."""
    kuhn = VersusEnv(game="kuhn_poker", opponent="nash", seat=1)
    for seed in range(30):
        kuhn.reset(seed=seed)
        notes = kuhn.state_notes()
        card = "JQK"[kuhn.game.cards[1]]
        assert notes.startswith(f"I hold {card}, the ")
        assert ("My opponent bet." in notes) == (kuhn.game.history[-1][1] == "bet")
        assert not any(f" {a} " in f" {notes.split('.')[0]} " for a in kuhn.action_names)
    ttt = VersusEnv(game="tictactoe", opponent="random", seat=1)
    ttt.reset(seed=0)
    taken = next(i + 1 for i, m in enumerate(ttt.game.board) if m)
    assert ttt.state_notes() == (
        f"I play O. My cells: none. Opponent cells: {taken}. Free cells: "
        + " ".join(str(i) for i in range(1, 10) if i != taken)
        + "."
    )
    trade = VersusEnv(game="simple_negotiation", opponent="trader", seat=1)
    trade.reset(seed=2)
    values = trade.game.values[1]
    high = max(values, key=values.get)
    assert f"I value {high} most ({values[high]})" in trade.state_notes()
    if trade.game.pending is not None:
        assert "The offer waiting would change my value by" in trade.state_notes()
