"""FrozenLake rules: solvable maps, slip statistics, rewards, budgets."""

from __future__ import annotations

import numpy as np
import pytest

from ragen_envs.grids.frozenlake import (
    MOVES,
    PERPENDICULAR,
    FrozenLakeEnv,
    generate_lake,
    goal_distances,
    shortest_path,
)


def answer(*actions: str) -> str:
    return f"<think>t</think><answer>{' || '.join(actions)}</answer>"


def test_every_generated_map_is_solvable():
    for seed in range(2000):
        env = FrozenLakeEnv()
        env.reset(seed=seed)
        assert env.start != env.goal
        assert not env.holes[env.start] and not env.holes[env.goal]
        path = shortest_path(env.holes, env.start, env.goal)
        assert path is not None and len(path) >= 1


def test_shortest_path_reports_unreachable_goal():
    holes = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=bool)
    assert shortest_path(holes, (0, 0), (2, 2)) is None
    assert shortest_path(holes, (1, 1), (0, 2)) in (["Right", "Up"], ["Up", "Right"])


def test_hole_fraction_matches_p_frozen():
    rng = np.random.default_rng(0)
    holes = [generate_lake(rng, 8, 0.8)[0] for _ in range(500)]
    # Solvability filtering and the forced start/goal tiles push it a little below 0.2.
    assert 0.15 < float(np.mean(holes)) < 0.2


def _slip_counts(
    env: FrozenLakeEnv, moves: int, options: dict | None = None
) -> tuple[dict[str, int], int]:
    """How often ``moves`` random moves went the intended way or to either side
    (every episode reset with ``options``)."""
    env.reset(seed=123, options=options)
    counts = {"intended": 0, "first": 0, "second": 0}
    n = 0
    rng = np.random.default_rng(7)
    while n < moves:
        intended = ["Up", "Down", "Left", "Right"][int(rng.integers(4))]
        _, _, term, trunc, info = env.step(answer(intended))
        for want, got in info["moves"]:
            key = (
                "intended"
                if got == want
                else ("first" if got == PERPENDICULAR[want][0] else "second")
            )
            counts[key] += 1
            n += 1
        if term or trunc:
            env.reset(seed=n, options=options)
    return counts, n


def test_slip_frequencies_are_one_third_each():
    counts, n = _slip_counts(FrozenLakeEnv(size=4, p_frozen=1.0, action_budget=10**9), 30_000)
    for key, c in counts.items():
        assert abs(c / n - 1 / 3) < 0.01, (key, c / n)


@pytest.mark.parametrize("rate", [0.0, 1 / 3, 2 / 3])
def test_slip_rate_sets_the_share_of_perpendicular_moves(rate):
    env = FrozenLakeEnv(size=4, p_frozen=1.0, action_budget=10**9, slip_rate=rate)
    counts, n = _slip_counts(env, 20_000)
    assert abs(counts["intended"] / n - (1 - rate)) < 0.012, counts
    # Both perpendicular sides equally often.
    assert abs(counts["first"] / n - rate / 2) < 0.012, counts
    assert abs(counts["second"] / n - rate / 2) < 0.012, counts
    assert env.is_slippery == (rate > 0)
    assert ("slippery" in env.instructions()) == (rate > 0)


@pytest.mark.parametrize("bad", [-0.1, 1.0, "high"])
def test_slip_rate_outside_zero_one_is_refused(bad):
    with pytest.raises(ValueError, match="slip_rate"):
        FrozenLakeEnv(slip_rate=bad)


@pytest.mark.parametrize("rate", [0.0, 1 / 3])
def test_the_slip_rate_reset_option_holds_for_its_episodes_only(rate):
    env = FrozenLakeEnv(size=4, p_frozen=1.0, action_budget=10**9)  # the classic 2/3 lake
    counts, n = _slip_counts(env, 12_000, options={"slip_rate": rate})
    assert abs(counts["intended"] / n - (1 - rate)) < 0.015, counts
    assert abs(counts["first"] / n - counts["second"] / n) < 0.015, counts
    # A reset without the option is back to the env's own slips, a third each way.
    counts, n = _slip_counts(env, 12_000)
    assert all(abs(c / n - 1 / 3) < 0.015 for c in counts.values()), counts
    # The option changes the slips only: the same seed draws the same map.
    plain = FrozenLakeEnv(size=4, p_frozen=1.0)
    assert env.reset(seed=9, options={"slip_rate": rate})[0] == plain.reset(seed=9)[0]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"slip_rate": 1.0}, "reset option slip_rate must be a number in"),
        ({"slip_rate": -0.5}, "reset option slip_rate"),
        ({"slip_rate": "calm"}, "reset option slip_rate"),
        ({"slip_rate": True}, "reset option slip_rate"),
        ({"slip": 0.0}, r"unknown reset options \['slip'\]; FrozenLakeEnv accepts \['slip_rate'\]"),
    ],
)
def test_bad_reset_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        FrozenLakeEnv().reset(seed=0, options=options)


def test_non_slippery_moves_go_where_asked():
    env = FrozenLakeEnv(is_slippery=False)
    env.reset(seed=5)
    path = shortest_path(env.holes, env.start, env.goal)
    total = 0.0
    done = False
    for i in range(0, len(path), 5):
        _, r, term, trunc, info = env.step(answer(*path[i : i + 5]))
        total += r
        done = term
        assert info["action_is_valid"] and info["action_is_effective"]
    assert done and info["success"] and total == pytest.approx(1.0)


def _lake(env: FrozenLakeEnv, layout: str) -> None:
    """Put ``env`` into the state drawn by ``layout`` (P start, G goal, O holes)."""
    rows = layout.strip().split("\n")
    env.reset(seed=0)
    env.holes = np.array([[ch == "O" for ch in row] for row in rows])
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch == "P":
                env.player = env.start = (r, c)
            if ch == "G":
                env.goal = (r, c)


def test_rules_and_rendering():
    env = FrozenLakeEnv(is_slippery=False, render_mode="ansi")
    _lake(env, "P_O_\n____\n_O_G\n____")
    obs, r, term, trunc, info = env.step(answer("Up"))  # into the border: no move
    assert (r, term, info["action_is_effective"]) == (0.0, False, False)
    assert obs == "P_O_\n____\n_O_G\n____"
    obs, r, term, trunc, info = env.step(answer("Right", "Right"))  # second step: hole
    assert term and not info["success"] and r == 0.0 and info["num_actions"] == 2
    assert obs == "__X_\n____\n_O_G\n____"
    _lake(env, "P___\n___G\n____\n____")
    obs, r, term, _, info = env.step(answer("Down", "Right", "Right", "Right", "Up"))
    # The goal is reached on the 4th action; the 5th is not executed.
    assert term and info["success"] and r == 1.0 and info["num_actions"] == 4
    assert obs == "____\n___√\n____\n____"
    assert env.render() == obs


def test_action_budget_truncates():
    env = FrozenLakeEnv(is_slippery=False, action_budget=3)
    _lake(env, "P___\n____\n____\n___G")
    _, _, term, trunc, info = env.step(answer("Left", "Left"))
    assert not trunc and info["actions_left"] == 1
    _, _, term, trunc, info = env.step(answer("Left", "Left", "Left"))
    assert trunc and not term and info["num_actions"] == 1 and info["actions_left"] == 0
    with pytest.raises(RuntimeError, match="reset"):
        env.step(answer("Left"))


def test_format_penalty_once_per_turn():
    env = FrozenLakeEnv(is_slippery=False)
    _lake(env, "P___\n____\n____\n___G")
    _, r, _, _, info = env.step(answer("Right", "Jump", "Fly"))
    assert r == pytest.approx(-0.1) and info["num_actions"] == 1 and not info["action_is_valid"]
    _, r, _, _, info = env.step("no tags at all")
    assert r == pytest.approx(-0.1) and info["num_actions"] == 0 and not info["format_ok"]
    _, r, _, _, _ = env.step(answer("Down"))
    assert r == 0.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"size": 1}, "size"),
        ({"p_frozen": 0.0}, "p_frozen"),
        ({"action_budget": 0}, "action_budget"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FrozenLakeEnv(**kwargs)


def test_distance_shaping_pays_the_walking_distance_round_the_holes():
    # G is two cells below P, past a hole, but 8 moves away on foot: right along the
    # top row, down the right column, left along row 2.
    layout = "P___\nOOO_\nG___\n____"
    env = FrozenLakeEnv(is_slippery=False, distance_shaping=0.5, action_budget=20)
    _lake(env, layout)
    assert env.step(answer("Right"))[1] == pytest.approx(0.5)  # 8 -> 7 moves
    # 7 -> 8, then into the border: no move, no pay.
    assert env.step(answer("Left", "Up"))[1] == pytest.approx(-0.5)
    _, r, term, *_ = env.step(answer("Right", "Right", "Right", "Down", "Down"))
    assert not term and r == pytest.approx(0.5 * 5)  # 8 -> 3
    _, r, term, _, info = env.step(answer("Left", "Left", "Left"))  # 3 -> 0, the goal
    assert term and info["success"] and r == pytest.approx(0.5 * 3 + 1.0)
    _lake(env, layout)
    _, r, term, _, info = env.step(answer("Down"))  # a hole costs c, as a step away does
    assert term and not info["success"] and r == pytest.approx(-0.5)
    env = FrozenLakeEnv(is_slippery=False)
    _lake(env, layout)
    assert env.step(answer("Right"))[1] == 0.0  # off by default


def test_distance_shaping_gives_every_solved_episode_the_same_total():
    """Shaped minus plain return is c times the start's walking distance, also when the
    episode first steps away from the goal and back."""
    detours = 0
    for seed in range(20):
        plain = FrozenLakeEnv(is_slippery=False)
        shaped = FrozenLakeEnv(is_slippery=False, distance_shaping=0.3)
        plain.reset(seed=seed)
        shaped.reset(seed=seed)
        distance = goal_distances(shaped.holes, shaped.goal)
        r0, c0 = shaped.start
        away = [
            move for move, (dr, dc) in MOVES.items()
            if distance.get((r0 + dr, c0 + dc), -1) > distance[shaped.start]
        ]  # fmt: skip
        detours += bool(away)
        totals = []
        for env in (plain, shaped):
            total = 0.0
            if away:
                total += env.step(answer(away[0]))[1]
            for move in shortest_path(env.holes, env.player, env.goal):
                _, r, term, _, info = env.step(answer(move))
                total += r
            assert term and info["success"]
            totals.append(total)
        start_distance = len(shortest_path(shaped.holes, shaped.start, shaped.goal))
        assert totals[1] - totals[0] == pytest.approx(0.3 * start_distance)
    assert detours >= 10  # most starts have a step away from the goal


def test_distance_shaping_on_a_slippery_lake_pays_the_move_that_happened():
    env = FrozenLakeEnv(slip_rate=0.5, distance_shaping=0.5, action_budget=200)
    slipped = 0
    for seed in range(30):
        env.reset(seed=seed)
        for _ in range(200):
            distance = goal_distances(env.holes, env.goal)
            before = env.player
            _, r, term, trunc, info = env.step(answer("Right"))
            ((asked, went),) = info["moves"]
            slipped += asked != went
            dr, dc = MOVES[went]
            after = (before[0] + dr, before[1] + dc)
            if not (0 <= after[0] < env.size and 0 <= after[1] < env.size):
                expected = 0.0  # the border: no move
            elif env.holes[after]:
                expected = -0.5
            else:
                expected = 0.5 * (distance[before] - distance[after]) + (after == env.goal)
            assert r == pytest.approx(expected)
            if term or trunc:
                break
    assert slipped >= 10


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "0.5", True])
def test_distance_shaping_must_be_a_finite_number_at_least_0(bad):
    with pytest.raises(ValueError, match="distance_shaping"):
        FrozenLakeEnv(distance_shaping=bad)
