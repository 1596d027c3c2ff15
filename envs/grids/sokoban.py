"""Sokoban as a text environment.

The player walks a walled room and must push every box onto a target; boxes
can be pushed (one at a time) but never pulled. Rooms come from
:mod:`.sokoban_gen` (reverse play from the solved state, so every room is
solvable). Rewards per executed action: -0.1, plus 1 for a box pushed onto a
target, -1 for a box pushed off one, and 10 when every box is on a target,
which ends the episode. With ``distance_shaping`` c > 0 (off by default), a
push also earns c times the cells by which it brought the box nearer its
nearest target (negative when farther): a potential-based shaping term
(Ng, Harada and Russell, 1999) whose sum over an episode is c times the
potential (sum of each box's distance to its nearest target) at the start
minus at the end, whatever the path; a solved episode ends at 0.

The room is drawn one row per line in one of two symbol sets (``vocab``):
``"standard"`` (the RAGEN paper's) or ``"new"``, a set sharing no symbol with
it, to test whether a policy transfers to an unseen vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.base import TextEnv, check_distance_shaping, place_words
from .sokoban_gen import DIRECTIONS, Cell, check_room_params, generate_room
from .sokoban_solver import solve

#: What ``reset(options=...)`` accepts: a given room, and a range of the planner's
#: shortest-solution length (in moves) for generated rooms.
RESET_OPTIONS = ("room", "min_solution_length", "max_solution_length")
_MAX_LENGTH_DRAWS = 500
MOVES: dict[str, Cell] = dict(zip(("Up", "Down", "Left", "Right"), DIRECTIONS, strict=True))
STEP_REWARD = -0.1
BOX_ON_TARGET_REWARD = 1.0
SOLVED_REWARD = 10.0

#: vocab -> role -> symbol. Each symbol is one character; the two sets are disjoint.
VOCABS: dict[str, dict[str, str]] = {
    "standard": {
        "wall": "#",
        "floor": "_",
        "target": "O",
        "box": "X",
        "box_on_target": "√",
        "player": "P",
        "player_on_target": "S",
    },
    "new": {
        "wall": "%",
        "floor": ".",
        "target": "+",
        "box": "$",
        "box_on_target": "*",
        "player": "@",
        "player_on_target": "&",
    },
}
_LEGEND = {
    "wall": "wall",
    "floor": "floor",
    "target": "target",
    "box": "box",
    "box_on_target": "box on a target",
    "player": "you",
    "player_on_target": "you on a target",
}


@dataclass(frozen=True)
class SokobanState:
    """A snapshot of a room; cells are (row, col) inside a ``shape`` = (rows, cols) grid.

    Cells outside the grid count as wall, so a hand-built room needs no outer ring.
    """

    shape: tuple[int, int]
    walls: frozenset[Cell]
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    @property
    def is_solved(self) -> bool:
        return self.boxes <= self.targets


def render_room(state: SokobanState, vocab: str = "standard") -> str:
    """``state`` drawn one row per line (no trailing newline) in ``vocab``'s symbols."""
    sym = VOCABS[vocab]
    rows, cols = state.shape
    grid = [[sym["floor"]] * cols for _ in range(rows)]
    for r, c in state.walls:
        grid[r][c] = sym["wall"]
    for r, c in state.targets:
        grid[r][c] = sym["target"]
    for r, c in state.boxes:
        grid[r][c] = sym["box_on_target" if (r, c) in state.targets else "box"]
    r, c = state.player
    grid[r][c] = sym["player_on_target" if state.player in state.targets else "player"]
    return "\n".join("".join(row) for row in grid)


def parse_room(text: str, vocab: str = "standard") -> SokobanState:
    """The inverse of :func:`render_room`; raises ValueError on a malformed room.

    Leading and trailing whitespace of the text and of each row is ignored.
    The room needs exactly one player and as many targets as boxes (at least one).
    """
    if not isinstance(text, str):
        raise TypeError(f"a room is given as text, got {type(text).__name__}")
    role_of = {symbol: role for role, symbol in VOCABS[vocab].items()}
    rows = [line.strip() for line in text.strip().split("\n")]
    if len({len(row) for row in rows}) != 1 or not rows[0]:
        raise ValueError(f"room rows must be non-empty and of equal length, got {rows!r}")
    walls, targets, boxes, players = set(), set(), set(), []
    for r, row in enumerate(rows):
        for c, symbol in enumerate(row):
            role = role_of.get(symbol)
            if role is None:
                raise ValueError(
                    f"unknown symbol {symbol!r} at row {r}, column {c}; the {vocab!r} vocab "
                    f"uses {''.join(role_of)!r}"
                )
            cell = (r, c)
            if role == "wall":
                walls.add(cell)
            if role in ("target", "box_on_target", "player_on_target"):
                targets.add(cell)
            if role in ("box", "box_on_target"):
                boxes.add(cell)
            if role in ("player", "player_on_target"):
                players.append(cell)
    if len(players) != 1:
        raise ValueError(f"a room needs exactly one player, found {len(players)}")
    if not boxes or len(boxes) != len(targets):
        raise ValueError(
            f"a room needs as many targets as boxes (at least one), "
            f"found {len(boxes)} boxes and {len(targets)} targets"
        )
    return SokobanState(
        (len(rows), len(rows[0])),
        frozenset(walls),
        frozenset(targets),
        frozenset(boxes),
        players[0],
    )


class SokobanEnv(TextEnv):
    """Sokoban with procedurally generated, always solvable rooms.

    Args:
        dim_room: (rows, cols) of the room, outer wall ring included; at least 5x5.
        num_boxes: boxes (and targets) per room.
        search_depth: reverse moves per walk when generating a room.
        num_player_moves: random player steps (no pushes) after the reverse play.
        max_steps: actions an episode may execute; it is truncated when they
            are spent (like ``action_budget``, whichever is smaller applies).
        vocab: ``"standard"`` or ``"new"`` symbol set for observations.
        coordinates: append a line with the positions of you, the boxes and the
            targets (see :class:`TextEnv`); neighbours: a line with what lies one
            move away (a wall, a box, floor, a target).
        action_budget: actions per trajectory (paper: 10).
        distance_shaping: c >= 0; each push adds c times the drop of the pushed
            box's Manhattan distance to its nearest target (0: the paper's
            rewards only).
        **kwargs: passed to :class:`TextEnv` (max_actions_per_turn, format_penalty, ...).

    ``reset(options={"room": text})`` starts from a given room instead of a
    generated one: ``text`` is drawn in this env's vocab (see
    :func:`parse_room`) and must have the shape ``dim_room``.

    ``reset(options={"max_solution_length": n})`` (and/or
    ``"min_solution_length"``) keeps drawing rooms, from the same seeded stream,
    until the planner's shortest solution has that many moves: the difficulty
    knob of a curriculum (the ``curriculum`` setting of the algorithm passes
    such options to the training envs only, never to evaluation).
    """

    obs_charset = "".join(sorted({s for vocab in VOCABS.values() for s in vocab.values()} | {"\n"}))
    move_offsets = MOVES

    def __init__(
        self,
        dim_room: tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        search_depth: int = 300,
        num_player_moves: int = 3,
        max_steps: int = 100,
        vocab: str = "standard",
        action_budget: int = 10,
        distance_shaping: float = 0.0,
        **kwargs: Any,
    ) -> None:
        self.dim_room = check_room_params(dim_room, num_boxes, search_depth, num_player_moves)
        self.distance_shaping = check_distance_shaping(distance_shaping)
        if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
            raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
        if vocab not in VOCABS:
            raise ValueError(f"vocab must be one of {sorted(VOCABS)}, got {vocab!r}")
        self.num_boxes = int(num_boxes)
        self.search_depth = int(search_depth)
        self.num_player_moves = int(num_player_moves)
        self.max_steps = int(max_steps)
        self.vocab = vocab
        # The coordinates line: you, the boxes, then the targets still free.
        roles = ("player", "player_on_target", "box", "box_on_target", "target")
        self.landmark_symbols = "".join(VOCABS[vocab][role] for role in roles)
        self.player_symbols = "".join(
            VOCABS[vocab][role] for role in ("player", "player_on_target")
        )
        self.outside_symbol = VOCABS[vocab]["wall"]  # off the grid counts as wall
        rows, cols = self.dim_room
        self.obs_max_length = rows * (cols + 1) - 1
        super().__init__(action_budget=action_budget, **kwargs)
        self._walls: frozenset[Cell] = frozenset()
        self._targets: frozenset[Cell] = frozenset()
        self._boxes: set[Cell] = set()
        self.player: Cell = (0, 0)
        self._given_room: SokobanState | None = None
        self._length_range: tuple[int, int | None] = (0, None)

    @property
    def action_names(self) -> tuple[str, ...]:
        return tuple(MOVES)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        self._given_room = self._read_options(options)
        obs, info = super().reset(seed=seed, options=options)
        # max_steps acts as a second action budget: the base class truncates the
        # episode when the smaller one is spent, even in the middle of a turn.
        self._actions_left = min(self._actions_left, self.max_steps)
        info["actions_left"] = self._actions_left
        return obs, info

    def _read_options(self, options: dict[str, Any] | None) -> SokobanState | None:
        self._length_range = (0, None)
        if not options:
            return None
        unknown = sorted(set(options) - set(RESET_OPTIONS))
        if unknown:
            raise ValueError(
                f"unknown reset options {unknown}; SokobanEnv accepts {list(RESET_OPTIONS)}"
            )
        low, high = (options.get(key) for key in RESET_OPTIONS[1:])
        for key, value in (("min_solution_length", low), ("max_solution_length", high)):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ValueError(f"reset option {key} must be null or an int >= 1, got {value!r}")
        if low is not None and high is not None and low > high:
            raise ValueError(f"min_solution_length {low} > max_solution_length {high}")
        self._length_range = (low or 0, high)
        if "room" not in options:
            return None
        room = parse_room(options["room"], self.vocab)
        if room.shape != self.dim_room:
            raise ValueError(
                f"the room is {room.shape[0]}x{room.shape[1]} but this env draws "
                f"{self.dim_room[0]}x{self.dim_room[1]} rooms (dim_room)"
            )
        return room

    def _new_episode(self) -> None:
        room = self._given_room
        self._given_room = None
        if room is None:
            room = self._draw_room()
        self._walls, self._targets = room.walls, room.targets
        self._boxes, self.player = set(room.boxes), room.player

    def _draw_room(self) -> SokobanState:
        """A generated room; with a solution-length range, the first one in it."""
        low, high = self._length_range
        for _ in range(_MAX_LENGTH_DRAWS if (low or high) else 1):
            walls, targets, boxes, player = generate_room(
                self.np_random,
                self.dim_room,
                self.num_boxes,
                self.search_depth,
                self.num_player_moves,
            )
            room = SokobanState(self.dim_room, walls, targets, boxes, player)
            if not (low or high):
                return room
            path = solve(room)
            if path is not None and low <= len(path) <= (high if high is not None else len(path)):
                return room
        raise RuntimeError(
            f"no room with a shortest solution of {low}..{high} moves in {_MAX_LENGTH_DRAWS} "
            f"draws (dim_room={self.dim_room}, num_boxes={self.num_boxes}); widen the range"
        )

    def state(self) -> SokobanState:
        """The current room, e.g. for :func:`ragen_envs.grids.sokoban_solver.solve`."""
        return SokobanState(
            self.dim_room, self._walls, self._targets, frozenset(self._boxes), self.player
        )

    def _is_free(self, cell: Cell) -> bool:
        """Inside the grid, not a wall and not a box."""
        rows, cols = self.dim_room
        return (
            0 <= cell[0] < rows
            and 0 <= cell[1] < cols
            and cell not in self._walls
            and cell not in self._boxes
        )

    def _execute(self, action: str) -> tuple[float, bool, bool]:
        dr, dc = MOVES[action]
        step = (self.player[0] + dr, self.player[1] + dc)
        reward = STEP_REWARD
        if step in self._boxes:
            beyond = (step[0] + dr, step[1] + dc)
            if not self._is_free(beyond):
                return reward, False, False
            self._boxes.remove(step)
            self._boxes.add(beyond)
            reward += BOX_ON_TARGET_REWARD * ((beyond in self._targets) - (step in self._targets))
            if self.distance_shaping:
                reward += self.distance_shaping * (
                    self._target_distance(step) - self._target_distance(beyond)
                )
        elif not self._is_free(step):
            return reward, False, False
        self.player = step
        solved = self._is_success()
        if solved:
            reward += SOLVED_REWARD
        return reward, True, solved

    def _target_distance(self, cell: Cell) -> int:
        """Manhattan distance from ``cell`` to the nearest target."""
        return min(abs(cell[0] - t[0]) + abs(cell[1] - t[1]) for t in self._targets)

    def _is_success(self) -> bool:
        return self._boxes <= self._targets

    def state_notes(self) -> str:
        """Where each box off its target lies from the player, and where the nearest free
        target lies from that box: facts of the room, no choice of move."""
        free = sorted(self._targets - self._boxes)
        notes = []
        for box in sorted(self._boxes - self._targets):
            target = min(free, key=lambda t: (abs(t[0] - box[0]) + abs(t[1] - box[1]), t))
            notes.append(
                f"A box is {place_words(self.player, box)} of me; "
                f"its nearest target is {place_words(box, target)} of it."
            )
        return " ".join(notes) or "Every box is on a target."

    def _extra_info(self) -> dict[str, Any]:
        return {"boxes_on_target": len(self._boxes & self._targets)}

    def _render_text(self) -> str:
        return render_room(self.state(), self.vocab)

    def _legend(self) -> str:
        sym = VOCABS[self.vocab]
        return ", ".join(f"{sym[role]} {words}" for role, words in _LEGEND.items())

    def _compact_instructions(self) -> str:
        return (
            f"Sokoban puzzle: push every box onto a target.\nSymbols: {self._legend()}.\n"
            f"Actions: {', '.join(MOVES)}."
        )

    def _full_instructions(self) -> str:
        legend = self._legend()
        return (
            "You are solving a Sokoban puzzle: push every box onto a target. Walking into a "
            "box pushes it one cell; you cannot pull boxes, and a box blocked by a wall or "
            "another box does not move.\n"
            f"Symbols: {legend}.\n"
            f"Actions: {', '.join(MOVES)}. Give up to {self.parser.max_actions} actions per "
            f"turn, separated by '{self.parser.separator}'. "
            f"You have {min(self.action_budget, self.max_steps)} actions in total."
        )
