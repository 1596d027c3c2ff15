"""bench/kuhn_strategy.py: the information states read from the observations that the
env writes, and the exact values against the Nash strategy of strategies whose
values are known (the game's value; the uniform player's; always betting)."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragen_envs.games import VersusEnv, nash_player

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("kuhn_strategy", ROOT / "bench/kuhn_strategy.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_the_nash_strategy_played_gets_the_games_value(tmp_path):
    """Turns of the Nash player (as the model) against the Nash player: the counted
    strategy is close to Nash, and so its value is close to -1/18 and +1/18."""
    rows = []
    rng = np.random.default_rng(0)
    for seat in (0, 1):
        env = VersusEnv(game="kuhn_poker", opponent="nash", seat=seat)
        for seed in range(3000):
            obs, _ = env.reset(seed=seed)
            done = False
            while not done:
                action = nash_player(env.game, rng)
                rows.append({"env_id": "ragen/KuhnPokerNash-v0", "observation": obs,
                             "actions": [action]})  # fmt: skip
                obs, _, term, trunc, _ = env.step(f"<think>x</think><answer>{action}</answer>")
                done = term or trunc
    path = tmp_path / "turns.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    counts = bench.read_strategy(str(path))
    assert len(counts) == 12  # every information state was met
    (first, second), unseen = bench.value_against_nash(counts)
    assert unseen == 0
    assert first == pytest.approx(-1 / 18, abs=0.02) and second == pytest.approx(1 / 18, abs=0.02)


def test_known_strategies_get_their_known_values():
    assert bench.value_against_nash({})[0] == pytest.approx((-1 / 6, -1 / 9))  # uniform
    always_bet = {
        (seat, card, moves): Counter({"bet" if moves in ((), ("check",)) else "call": 1})
        for seat, moves_list in ((0, [(), ("check", "bet")]), (1, [("check",), ("bet",)]))
        for moves in moves_list
        for card in range(3)
    }
    assert bench.value_against_nash(always_bet)[0] == pytest.approx((-1 / 9, -1 / 9))
    forfeits = {k: Counter({"forfeit": 1}) for k in always_bet}
    assert bench.value_against_nash(forfeits)[0] == pytest.approx((-1.0, -1.0))
