"""Simple Negotiation: trades move goods only when both sides hold them, an offer
not accepted is rejected, the outcome compares the two gains (zero-sum), and the
one-agent env plays it against the random player and the trader."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_envs.games import SimpleNegotiation, VersusEnv, random_player, trader_player
from ragen_envs.games.negotiation import BASE_VALUES, GOODS


def answer(action: str) -> str:
    return f"<think>x</think><answer>{action}</answer>"


def fresh(seed: int = 0) -> SimpleNegotiation:
    game = SimpleNegotiation()
    game.reset(np.random.default_rng(seed))
    return game


def test_the_deal_is_drawn_within_the_rules():
    for seed in range(50):
        game = fresh(seed)
        for player in (0, 1):
            assert all(5 <= game.stock[player][g] <= 25 for g in GOODS)
            for good, base in zip(GOODS, BASE_VALUES, strict=True):
                assert (
                    max(base - base // 5, 5)
                    <= game.values[player][good]
                    <= min(base + base // 5, 40)
                )


def test_an_accepted_offer_moves_the_goods_and_the_gains():
    game = fresh()
    before = [dict(s) for s in game.stock]
    game.play("offer 2 wheat for 1 ore")  # player 0 gives 2 wheat, wants 1 ore
    assert game.to_move == 1 and game.legal()[:3] == ("accept", "reject", "pass")
    game.play("accept")
    assert game.stock[0]["wheat"] == before[0]["wheat"] - 2
    assert game.stock[0]["ore"] == before[0]["ore"] + 1
    assert game.stock[1]["wheat"] == before[1]["wheat"] + 2
    assert game.stock[1]["ore"] == before[1]["ore"] - 1
    assert game.gain(0) == game.values[0]["ore"] - 2 * game.values[0]["wheat"]
    assert game.gain(1) == 2 * game.values[1]["wheat"] - game.values[1]["ore"]
    assert game.pending is None and "accept" not in game.legal()


@pytest.mark.parametrize("reply", ["reject", "pass", "offer 1 wood for 1 sheep"])
def test_an_offer_not_accepted_is_rejected(reply):
    game = fresh()
    stock = [dict(s) for s in game.stock]
    game.play("offer 1 wheat for 1 ore")
    game.play(reply)
    assert game.stock == stock
    assert game.pending == ((1, "wood", 1, "sheep") if reply.startswith("offer") else None)


def test_offers_need_the_goods_and_accepting_needs_them_too():
    game = fresh()
    game.stock[0]["ore"] = 2
    assert "offer 2 ore for 1 wheat" in game.legal()
    assert "offer 3 ore for 1 wheat" not in game.legal()
    with pytest.raises(ValueError, match="not allowed"):
        game.play("offer 3 ore for 1 wheat")
    game.stock[1]["brick"] = 1
    game.play("offer 1 wheat for 4 brick")
    assert game.legal()[0] == "reject"  # player 1 holds 1 brick: it cannot accept
    with pytest.raises(ValueError, match="not allowed"):
        game.play("accept")


def test_the_outcome_compares_the_gains_after_ten_turns():
    game = fresh()
    game.play("offer 1 wheat for 1 ore")  # a bargain for player 0 at any values
    game.play("accept")
    for _ in range(8):
        assert game.payoffs() is None
        game.play("pass")
    assert game.turns == 10 and game.legal() == ()
    assert game.payoffs() == (1.0, -1.0)
    drawn = fresh()
    for _ in range(10):
        drawn.play("pass")
    assert drawn.payoffs() == (0.0, 0.0)


def test_a_lost_turn_lets_the_offer_lapse():
    game = fresh()
    game.play("offer 1 wheat for 1 ore")
    game.forfeit_turn()
    assert game.pending is None and game.to_move == 0 and game.turns == 2


def test_the_trader_beats_the_random_player_and_never_takes_a_loss():
    rng = np.random.default_rng(0)
    wins = 0
    for hand in range(300):
        game = SimpleNegotiation()
        game.reset(rng)
        trader = hand % 2
        while game.payoffs() is None:
            if game.to_move == trader:
                action = trader_player(game, rng)
                if action == "accept":  # only trades that raise its own value
                    give, good, get, wanted = game.pending
                    assert give * game.values[trader][good] > get * game.values[trader][wanted]
            else:
                action = random_player(game, rng)
            game.play(action)
        assert game.gain(trader) >= 0
        wins += game.payoffs()[trader] > 0
    assert wins / 300 > 0.8


def test_the_env_plays_the_trader_and_reads_what_happened():
    env = gym.make("ragen/SimpleNegotiationTrader-v0", seat=0).unwrapped
    obs, _ = env.reset(seed=1)
    assert obs.startswith("You are player 0.") and "Your turns left: 5." in obs
    assert "offer N GOOD for M GOOD" in obs and "offer N GOOD" in env.instructions()
    obs, reward, term, _, info = env.step(answer("offer 2 wheat for 1 ore"))
    assert (reward, term, info["num_actions"]) == (0.0, False, 1)
    # A bad trade for the trader at any values it may hold: it never accepts it.
    assert "Your opponent did not take your offer" in obs or "rejected your offer" in obs
    assert env.observation_space.contains(obs)
    done = term
    while not done:
        obs, reward, term, trunc, info = env.step(answer("pass"))
        done = term or trunc
    assert term and info["outcome"] in ("win", "draw", "loss")
    assert "Your opponent's gain:" in obs and "The game is over" in obs


def test_self_play_pairs_two_negotiation_envs():
    first = VersusEnv(game="simple_negotiation", opponent="self", seat=0)
    second = VersusEnv(game="simple_negotiation", opponent="self", seat=1)
    second.join(first)
    first.reset(seed=3)
    second.reset(seed=3)
    first.step(answer("offer 1 wheat for 1 ore"))
    assert first.waiting and first.game.to_move == 1
    obs = second.observe()
    assert "Your opponent offers 1 wheat for 1 ore of yours." in obs
    second.step(answer("accept"))
    assert first.game.stock[0]["ore"] == first.game.start[0]["ore"] + 1


def test_a_self_play_game_pays_both_seats_when_the_second_ends_it():
    """The first seat's fifth move spends its budget without ending the game: its
    episode waits for the other seat's last move and is paid then (zero-sum)."""
    first = VersusEnv(game="simple_negotiation", opponent="self", seat=0)
    second = VersusEnv(game="simple_negotiation", opponent="self", seat=1)
    second.join(first)
    first.reset(seed=3)
    second.reset(seed=3)
    first.step(answer("offer 1 wheat for 1 ore"))  # a bargain for the first seat
    second.step(answer("accept"))
    for turn in range(4):
        _, reward, term, trunc, _ = first.step(answer("pass"))
        assert (reward, term, trunc) == (0.0, False, False), turn  # the last one waits
        _, reward, term, trunc, info = second.step(answer("pass"))
    assert term and not trunc and reward == -1.0 and info["outcome"] == "loss"
    assert first.settle() == 1.0 and first.result_info()["outcome"] == "win"
    assert first.settle() is None  # paid once
