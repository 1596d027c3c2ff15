"""The Kuhn Poker strategy a model played, and its exact value against the Nash strategy.

Reads the turns of Kuhn Poker trajectories (``rllib evaluate CHECKPOINT --suite
kuhn_poker --trajectories turns.parquet``, or a run's rollout dumps) and counts,
for each of the 12 information states (the seat, the card, the moves so far),
the actions the model took there: check, bet, call, fold, or an answer with no
allowed action ("forfeit": the game is lost, payoff -1, as ``invalid_move:
lose_game`` scores it). That empirical behaviour strategy is then played
exactly, over all six deals, against the Nash strategy of
``ragen_envs.games.nash_policy``: its value per seat, beside the game's value
(-1/18 as the first player, +1/18 as the second).

The value of a played game is a noisy figure (a hand pays -2 to +2, so 1,000
hands leave about +-0.08 at two standard errors); this one is exact for the
strategy observed, and its error is only that of the estimated action
frequencies. An information state never met is played uniformly (counted in
``unseen``).

    python bench/kuhn_strategy.py turns.parquet
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from collections import Counter, defaultdict

import pyarrow.parquet as pq

from ragen_envs.games import KuhnPoker, nash_policy
from ragen_envs.games.rules import CARDS

VALUE = (-1 / 18, 1 / 18)
SAID = {"checked": "check", "bet 1": "bet", "called": "call", "folded": "fold"}
MOVE = re.compile(r"^(You|Your opponent) (checked|bet 1|called|folded)\.$", re.MULTILINE)


def info_state(observation: str) -> tuple[int, int, tuple[str, ...]] | None:
    """(seat, card, moves so far) of a Kuhn Poker observation, None if it is none."""
    seat = 0 if "You are the first player" in observation else 1
    card = re.search(r"Your card: ([JQK])\.", observation)
    if card is None:
        return None
    moves = tuple(SAID[m.group(2)] for m in MOVE.finditer(observation))
    return seat, CARDS.index(card.group(1)), moves


def read_strategy(path: str) -> dict[tuple, Counter]:
    table = pq.read_table(path, columns=["env_id", "observation", "actions"]).to_pylist()
    counts: dict[tuple, Counter] = defaultdict(Counter)
    for row in table:
        state = info_state(row["observation"] or "")
        if state is None:
            continue
        actions = row["actions"] or []
        counts[state][actions[0] if actions else "forfeit"] += 1
    return counts


def value_against_nash(counts: dict[tuple, Counter]) -> tuple[tuple[float, float], int]:
    """The strategy's exact expected payoff per seat against the Nash strategy, and how
    many of the information states it reached were never observed."""
    unseen: set = set()

    def mine(game: KuhnPoker, seat: int) -> dict[str, float]:
        moves = tuple(a for _, a in game.history)
        seen = counts.get((seat, game.cards[seat], moves))
        legal = game.legal()
        if not seen:
            unseen.add((seat, game.cards[seat], moves))
            return {a: 1 / len(legal) for a in legal}
        total = sum(seen.values())
        return {a: n / total for a, n in seen.items() if a in legal or a == "forfeit"}

    def walk(game: KuhnPoker, seat: int) -> float:
        payoffs = game.payoffs()
        if payoffs is not None:
            return payoffs[seat]
        policy = mine(game, seat) if game.to_move == seat else nash_policy(game)
        value = 0.0
        for action, p in policy.items():
            if p == 0:
                continue
            if action == "forfeit":
                value += p * -1.0
                continue
            child = KuhnPoker()
            child.cards, child.history = game.cards, list(game.history)
            child.to_move, child.folded = game.to_move, game.folded
            child.play(action)
            value += p * walk(child, seat)
        return value

    values = []
    for seat in (0, 1):
        deals = list(itertools.permutations(range(3), 2))
        total = 0.0
        for cards in deals:
            game = KuhnPoker()
            game.cards = cards
            total += walk(game, seat) / len(deals)
        values.append(total)
    return (values[0], values[1]), len(unseen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("turns", help="a Parquet file of trajectory turns")
    args = parser.parse_args(argv)
    counts = read_strategy(args.turns)
    (first, second), unseen = value_against_nash(counts)
    strategy = {
        f"{('first', 'second')[s]} {CARDS[c]} after {' '.join(m) or 'nothing'}": dict(n)
        for (s, c, m), n in sorted(counts.items())
    }
    out = {
        "turns": sum(sum(n.values()) for n in counts.values()),
        "strategy": strategy,
        "value_first_seat": round(first, 4),
        "value_second_seat": round(second, 4),
        "value_mean_over_seats": round((first + second) / 2, 4),
        # the game's value per seat, and over both seats (0): the target's reference
        "game_value_first_second_mean": [round(VALUE[0], 4), round(VALUE[1], 4), 0.0],
        "unseen_info_states": unseen,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
