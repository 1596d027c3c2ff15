"""FrozenLake as a text environment.

A square lake of frozen tiles and holes; the agent walks from a random start
to a random goal. Each tile is frozen with probability ``p_frozen`` and only
maps with a path from start to goal are kept. On a slippery lake an action
goes in the intended direction with probability 1/3 and in each perpendicular
direction with 1/3. Reward 1 at the goal, 0 otherwise; a hole ends the episode.
With ``distance_shaping`` c > 0 (off by default), a move is also paid c times
the drop of the walking distance to the goal (shortest path round the holes),
and a step into a hole costs c. ``reset(options={"slip_rate": r})`` plays one
episode at slip rate r (a curriculum's way to start on a calmer lake).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..core.base import TextEnv, check_distance_shaping, place_words

MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
PERPENDICULAR = {
    "Up": ("Left", "Right"),
    "Down": ("Right", "Left"),
    "Left": ("Down", "Up"),
    "Right": ("Up", "Down"),
}
FROZEN, HOLE = "_", "O"
#: What ``reset(options=...)`` accepts: the slip rate of this episode.
RESET_OPTIONS = ("slip_rate",)
SYMBOLS = {
    "player": "P",
    "frozen": FROZEN,
    "hole": HOLE,
    "goal": "G",
    "player_in_hole": "X",
    "player_on_goal": "√",
}
_MAX_MAP_ATTEMPTS = 1000


def frozen_neighbours(
    grid: np.ndarray, cell: tuple[int, int]
) -> Iterator[tuple[str, tuple[int, int]]]:
    """(move, tile) for each move from ``cell`` that stays on the lake and off the holes
    (``grid``: True = hole), in the order of MOVES."""
    n_rows, n_cols = grid.shape
    for move, (dr, dc) in MOVES.items():
        r, c = cell[0] + dr, cell[1] + dc
        if 0 <= r < n_rows and 0 <= c < n_cols and not grid[r, c]:
            yield move, (r, c)


def shortest_path(
    grid: np.ndarray, start: tuple[int, int], goal: tuple[int, int]
) -> list[str] | None:
    """Breadth-first search over non-hole tiles: the action list, or None if unreachable.

    ``grid`` holds True for holes. Ignores slipperiness (it is the path an agent
    on a non-slippery lake would take).
    """
    parent: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            path: list[str] = []
            while parent[cell] is not None:
                cell, move = parent[cell]  # type: ignore[misc]
                path.append(move)
            return path[::-1]
        for move, tile in frozen_neighbours(grid, cell):
            if tile not in parent:
                parent[tile] = (cell, move)
                queue.append(tile)
    return None


def goal_distances(grid: np.ndarray, goal: tuple[int, int]) -> dict[tuple[int, int], int]:
    """Moves from each non-hole tile that can reach ``goal`` to it (``grid``: True = hole)."""
    distance = {goal: 0}
    queue = deque([goal])
    while queue:
        cell = queue.popleft()
        for _, tile in frozen_neighbours(grid, cell):
            if tile not in distance:
                distance[tile] = distance[cell] + 1
                queue.append(tile)
    return distance


def _check_slip_rate(value: Any, name: str) -> float:
    """``value`` as a float if it is a number in [0, 1); ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    return float(value)


def generate_lake(
    rng: np.random.Generator, size: int, p_frozen: float
) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
    """Draw (holes, start, goal) until the goal is reachable from the start."""
    for _ in range(_MAX_MAP_ATTEMPTS):
        holes = rng.random((size, size)) >= p_frozen
        start_idx, goal_idx = rng.choice(size * size, size=2, replace=False)
        start, goal = divmod(int(start_idx), size), divmod(int(goal_idx), size)
        holes[start] = holes[goal] = False
        if shortest_path(holes, start, goal) is not None:
            return holes, start, goal
    raise RuntimeError(
        f"no solvable {size}x{size} lake in {_MAX_MAP_ATTEMPTS} draws with "
        f"p_frozen={p_frozen}; raise p_frozen"
    )


class FrozenLakeEnv(TextEnv):
    """FrozenLake with random start and goal, solvable maps only.

    Args:
        size: side of the square lake (paper: 4).
        p_frozen: probability that a tile is frozen rather than a hole (paper: 0.8).
        is_slippery: whether moves slip to a perpendicular direction (paper: True):
            the move goes the intended way, or to either perpendicular side, one time
            in three each.
        slip_rate: the probability that a move slips to one of the two perpendicular
            directions (each equally likely), in [0, 1); set, it replaces
            ``is_slippery`` (``is_slippery=True`` is a slip rate of 2/3).
        action_budget: actions per trajectory (paper: 10).
        distance_shaping: c >= 0; a move that ends on a frozen tile or the goal
            adds c times the drop of the walking distance to the goal (round the
            holes), and a step into a hole adds -c, as a step away would (0: the
            paper's rewards only). Every episode that reaches the goal gets the
            same total from it, c times the start's distance, whatever its path.
        **kwargs: passed to :class:`TextEnv` (max_actions_per_turn, format_penalty,
            instructions, coordinates: a line with the positions of you, the goal and
            the holes, neighbours: a line with what lies one move away, ...).
    """

    obs_charset = "".join(sorted(set(SYMBOLS.values()) | {"\n"}))
    # Where you are (also in a hole or on the goal), the goal, then the holes.
    landmark_symbols = "".join(
        SYMBOLS[role] for role in ("player", "player_in_hole", "player_on_goal", "goal", "hole")
    )
    player_symbols = "".join(
        SYMBOLS[role] for role in ("player", "player_in_hole", "player_on_goal")
    )
    move_offsets = MOVES

    def __init__(
        self,
        size: int = 4,
        p_frozen: float = 0.8,
        is_slippery: bool = True,
        action_budget: int = 10,
        slip_rate: float | None = None,
        distance_shaping: float = 0.0,
        **kwargs: Any,
    ) -> None:
        self.distance_shaping = check_distance_shaping(distance_shaping)
        if not isinstance(size, int) or size < 2:
            raise ValueError(f"size must be an int >= 2, got {size!r}")
        if not 0.0 < float(p_frozen) <= 1.0:
            raise ValueError(f"p_frozen must be in (0, 1], got {p_frozen!r}")
        self.size = size
        self.p_frozen = float(p_frozen)
        if slip_rate is not None:
            _check_slip_rate(slip_rate, "slip_rate")
        # With slip_rate unset the draw is the classic one (one of three directions),
        # so runs made before the option existed replay exactly.
        self._three_way_slip = slip_rate is None and bool(is_slippery)
        self.slip_rate = (2 / 3 if is_slippery else 0.0) if slip_rate is None else float(slip_rate)
        self.is_slippery = self.slip_rate > 0
        self.obs_max_length = size * (size + 1)
        super().__init__(action_budget=action_budget, **kwargs)
        self.holes = np.zeros((size, size), dtype=bool)
        self.start = self.goal = self.player = (0, 0)
        self._moves_this_turn: list[tuple[str, str]] = []
        # (classic three-way draw?, slip rate) of this episode: the env's own, or the
        # reset option's for one episode.
        self._episode_slip = (self._three_way_slip, self.slip_rate)

    @property
    def action_names(self) -> tuple[str, ...]:
        return tuple(MOVES)

    def _new_episode(self) -> None:
        self.holes, self.start, self.goal = generate_lake(self.np_random, self.size, self.p_frozen)
        self.player = self.start
        self._moves_this_turn = []

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """``options={"slip_rate": r}`` (r in [0, 1)) plays this episode at slip rate r
        instead of the env's own; the next reset without it is back to the env's."""
        options = options or {}
        unknown = sorted(set(options) - set(RESET_OPTIONS))
        if unknown:
            raise ValueError(
                f"unknown reset options {unknown}; FrozenLakeEnv accepts {list(RESET_OPTIONS)}"
            )
        rate = options.get("slip_rate")
        self._episode_slip = (
            (self._three_way_slip, self.slip_rate)
            if rate is None
            else (False, _check_slip_rate(rate, "reset option slip_rate"))
        )
        return super().reset(seed=seed, options=options)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._moves_this_turn = []
        return super().step(action)

    def _execute(self, action: str) -> tuple[float, bool, bool]:
        direction = action
        three_way, rate = self._episode_slip
        if three_way:
            # One draw picks intended / first / second perpendicular with 1/3 each.
            pick = int(self.np_random.integers(3))
            direction = (action, *PERPENDICULAR[action])[pick]
        elif rate > 0 and self.np_random.random() < rate:
            direction = PERPENDICULAR[action][int(self.np_random.integers(2))]
        self._moves_this_turn.append((action, direction))
        dr, dc = MOVES[direction]
        r, c = self.player[0] + dr, self.player[1] + dc
        if not (0 <= r < self.size and 0 <= c < self.size):
            return 0.0, False, False
        before, self.player = self.player, (r, c)
        shaping = 0.0
        if self.distance_shaping:
            if self.holes[r, c]:
                shaping = -self.distance_shaping
            else:
                # A breadth-first search per move: 16 tiles on the paper's lake.
                distance = goal_distances(self.holes, self.goal)
                shaping = self.distance_shaping * (distance[before] - distance[self.player])
        if self.player == self.goal:
            return 1.0 + shaping, True, True
        return shaping, True, bool(self.holes[r, c])

    def _is_success(self) -> bool:
        return self.player == self.goal

    def state_notes(self) -> str:
        """Where the goal lies from the player, and which moves lead into a hole or off
        the lake: facts of the drawn lake, no choice of move."""
        holes, edges = [], []
        for move, (dr, dc) in MOVES.items():
            r, c = self.player[0] + dr, self.player[1] + dc
            if not (0 <= r < self.size and 0 <= c < self.size):
                edges.append(move)
            elif self.holes[r, c]:
                holes.append(move)
        notes = [f"The goal is {place_words(self.player, self.goal)} of me."]
        if holes:
            notes.append(
                f"{' and '.join(holes)} {'is a hole' if len(holes) == 1 else 'are holes'}."
            )
        else:
            notes.append("No hole is next to me.")
        if edges:
            notes.append(f"{' and '.join(edges)} {'is' if len(edges) == 1 else 'are'} the edge.")
        return " ".join(notes)

    def _extra_info(self) -> dict[str, Any]:
        # (intended, executed) per action, so slip statistics can be checked.
        return {"moves": tuple(self._moves_this_turn)}

    def _render_text(self) -> str:
        rows = []
        for r in range(self.size):
            row = []
            for c in range(self.size):
                cell = (r, c)
                if cell == self.player:
                    if cell == self.goal:
                        row.append(SYMBOLS["player_on_goal"])
                    elif self.holes[cell]:
                        row.append(SYMBOLS["player_in_hole"])
                    else:
                        row.append(SYMBOLS["player"])
                elif cell == self.goal:
                    row.append(SYMBOLS["goal"])
                else:
                    row.append(HOLE if self.holes[cell] else FROZEN)
            rows.append("".join(row))
        return "\n".join(rows)

    def _compact_instructions(self) -> str:
        slip = " The ice is slippery." if self.is_slippery else ""
        return (
            f"Reach the goal G without falling into a hole O. P you.{slip}\n"
            f"Actions: {', '.join(MOVES)}."
        )

    def _full_instructions(self) -> str:
        if self._three_way_slip:
            slip = (
                " The ice is slippery: a move goes in the intended direction only one time "
                "in three, otherwise to one of the two perpendicular directions."
            )
        elif self.is_slippery:
            slip = (
                f" The ice is slippery: a move goes to one of the two perpendicular "
                f"directions with probability {self.slip_rate:.2f}."
            )
        else:
            slip = ""
        return (
            "You are walking on a frozen lake. Reach the goal without falling into a hole."
            f"{slip}\n"
            "Symbols: P you, _ frozen ice, O hole, G goal, X you in a hole, √ you on the goal.\n"
            f"Actions: {', '.join(MOVES)}. Give up to {self.parser.max_actions} actions per "
            f"turn, separated by '{self.parser.separator}'. "
            f"You have {self.action_budget} actions in total."
        )
