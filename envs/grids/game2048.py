"""2048 as a multi-turn text environment.

A square board (4x4 by default) of numbered tiles. Each action slides every
tile Up, Down, Left or Right as far as it goes; two equal tiles that meet merge
into one tile of their sum, and a tile made by a merge does not merge again in
the same move (``2 2 2 2`` slid left is ``4 4 . .``, ``2 2 4 .`` is ``4 4 . .``).
After every move that changes the board a new tile appears in a uniformly drawn
empty cell: a 2 with probability 0.9, else a 4, drawn from the env's seeded
``np_random``. A move that changes nothing is valid but not effective: no tile
appears and it still spends an action.

Reward per move: the sum of the values of the tiles made by merges, times
``reward_scale`` (default ``1 / target_tile``, so rewards are O(1): a merge
into the target tile alone earns 1). Success, which ends the episode, is a tile
of at least ``target_tile``; the episode also ends when no move can change the
board, and is truncated when the action budget is spent.

Defaults: target 128 within 100 actions, up to 10 a turn. The demo's planner
reaches 128 in about three episodes in four within 10 turns; reaching 2048 takes
about a thousand moves (raise ``action_budget`` with ``target_tile``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from ..core.base import TextEnv

DIRECTIONS = ("Up", "Down", "Left", "Right")
SPAWN_FOUR_PROBABILITY = 0.1
EMPTY = "."
Board = tuple[int, ...]


@cache
def lines(size: int) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Direction -> the board's lines, each listed from the edge the tiles slide to."""
    rows = [tuple(r * size + c for c in range(size)) for r in range(size)]
    cols = [tuple(r * size + c for r in range(size)) for c in range(size)]
    return {
        "Left": tuple(rows),
        "Right": tuple(row[::-1] for row in rows),
        "Up": tuple(cols),
        "Down": tuple(col[::-1] for col in cols),
    }


def slide(values: list[int]) -> tuple[list[int], int]:
    """One line slid towards its start: (new values, sum of the merged tiles).

    >>> slide([2, 2, 2, 2])
    ([4, 4, 0, 0], 8)
    >>> slide([2, 2, 4, 0])
    ([4, 4, 0, 0], 4)
    """
    tiles = [v for v in values if v]
    out: list[int] = []
    merged, i = 0, 0
    while i < len(tiles):
        if i + 1 < len(tiles) and tiles[i] == tiles[i + 1]:
            out.append(2 * tiles[i])
            merged += 2 * tiles[i]
            i += 2
        else:
            out.append(tiles[i])
            i += 1
    return out + [0] * (len(values) - len(out)), merged


def move(board: Board, direction: str, size: int) -> tuple[Board, int]:
    """``board`` after sliding ``direction`` (no new tile): (board, merged sum)."""
    new = list(board)
    merged = 0
    for line in lines(size)[direction]:
        values, gained = slide([board[i] for i in line])
        merged += gained
        for i, v in zip(line, values, strict=True):
            new[i] = v
    return tuple(new), merged


def can_move(board: Board, size: int) -> bool:
    """Whether some direction changes the board."""
    return any(move(board, d, size)[0] != board for d in DIRECTIONS)


def spawn(board: Board, rng: np.random.Generator) -> Board:
    """``board`` with a new tile (2, or 4 with probability 0.1) in a random empty cell."""
    empty = [i for i, v in enumerate(board) if not v]
    cell = empty[int(rng.integers(len(empty)))]
    new = list(board)
    new[cell] = 4 if rng.random() < SPAWN_FOUR_PROBABILITY else 2
    return tuple(new)


class Game2048Env(TextEnv):
    """2048 with seeded tile spawns.

    Args:
        size: side of the square board, 2 to 8 (4: the classic game).
        target_tile: the tile that means success, a power of two >= 8.
        reward_scale: factor on the merged values (default ``1 / target_tile``).
        action_budget: moves per trajectory.
        max_actions_per_turn: moves read per turn.
        **kwargs: passed to :class:`TextEnv` (format_penalty, instructions, ...).
    """

    obs_charset = "0123456789" + EMPTY + " \n"

    def __init__(
        self,
        size: int = 4,
        target_tile: int = 128,
        reward_scale: float | None = None,
        action_budget: int = 100,
        max_actions_per_turn: int = 10,
        **kwargs: Any,
    ) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or not 2 <= size <= 8:
            raise ValueError(f"size must be an int in [2, 8], got {size!r}")
        if (
            not isinstance(target_tile, int)
            or isinstance(target_tile, bool)
            or target_tile < 8
            or target_tile & (target_tile - 1)
        ):
            raise ValueError(f"target_tile must be a power of two >= 8, got {target_tile!r}")
        if reward_scale is not None and not (
            isinstance(reward_scale, int | float) and float(reward_scale) > 0
        ):
            raise ValueError(f"reward_scale must be null or a number > 0, got {reward_scale!r}")
        self.size = size
        self.target_tile = target_tile
        self.reward_scale = 1.0 / target_tile if reward_scale is None else float(reward_scale)
        # Tiles stay below 2 ** (size * size + 2): at most 7 digits a cell on 4x4 and beyond.
        width = len(str(2 ** (size * size + 2)))
        self.obs_max_length = size * (size * (width + 1)) - 1
        super().__init__(
            action_budget=action_budget, max_actions_per_turn=max_actions_per_turn, **kwargs
        )
        self.board: Board = (0,) * (size * size)
        self.score = 0

    @property
    def action_names(self) -> tuple[str, ...]:
        return DIRECTIONS

    def _new_episode(self) -> None:
        empty: Board = (0,) * (self.size * self.size)
        self.board = spawn(spawn(empty, self.np_random), self.np_random)
        self.score = 0

    def _execute(self, action: str) -> tuple[float, bool, bool]:
        new, merged = move(self.board, action, self.size)
        if new == self.board:
            return 0.0, False, False
        self.board = spawn(new, self.np_random)
        self.score += merged
        done = self._is_success() or not can_move(self.board, self.size)
        return merged * self.reward_scale, True, done

    def _is_success(self) -> bool:
        return max(self.board) >= self.target_tile

    def _extra_info(self) -> dict[str, Any]:
        return {"score": self.score, "max_tile": max(self.board)}

    def _render_text(self) -> str:
        width = max(len(str(v)) for v in self.board)
        cells = [str(v).rjust(width) if v else EMPTY.rjust(width) for v in self.board]
        n = self.size
        return "\n".join(" ".join(cells[r * n : (r + 1) * n]) for r in range(n))

    def _compact_instructions(self) -> str:
        return (
            f"2048: slide the tiles so equal ones merge; make a {self.target_tile} tile. "
            f"{EMPTY} is empty.\nActions: {', '.join(DIRECTIONS)}."
        )

    def _full_instructions(self) -> str:
        if self.reward_scale == 1.0 / self.target_tile:
            scale = f"divided by {self.target_tile}"
        else:
            scale = f"times {self.reward_scale:g}"
        return (
            f"You are playing 2048 on a {self.size}x{self.size} board. Each action slides "
            "every tile as far as it goes in that direction; two equal tiles that meet merge "
            "into one tile of their sum (a merged tile does not merge again in the same "
            "move). After every move that changes the board a new tile appears in a random "
            f"empty cell: a 2, or sometimes a 4. Make a tile of {self.target_tile}. "
            "A move that changes nothing is wasted. The reward of a move is the sum of "
            f"the tiles it merged, {scale}.\n"
            f"Symbols: numbers are tiles, {EMPTY} is an empty cell.\n"
            f"Actions: {', '.join(DIRECTIONS)}. Give up to {self.parser.max_actions} actions "
            f"per turn, separated by '{self.parser.separator}'. "
            f"You have {self.action_budget} actions in total."
        )


# ----- the demo's planner -------------------------------------------------------------
@cache
def _snake_weights(size: int) -> tuple[float, ...]:
    """Weights that fall along a snake from the bottom-left corner: large tiles are
    worth most there, in order along the bottom row, then the next row back."""
    order = []
    for k, r in enumerate(range(size - 1, -1, -1)):
        cols = range(size) if k % 2 == 0 else range(size - 1, -1, -1)
        order += [r * size + c for c in cols]
    weights = [0.0] * (size * size)
    for rank, cell in enumerate(order):
        weights[cell] = 8.0 ** (size * size - 1 - rank) / 8.0 ** (size * size - 1)
    return tuple(weights)


def board_value(board: Board, size: int) -> float:
    """A heuristic: large tiles along the snake, empty cells, neighbours that can merge."""
    weights = _snake_weights(size)
    value = 1000.0 * sum(w * v for w, v in zip(weights, board, strict=True))
    value += 10.0 * board.count(0)
    for i, v in enumerate(board):
        if v and i % size < size - 1 and board[i + 1] == v:
            value += 2 * v
        if v and i + size < len(board) and board[i + size] == v:
            value += 2 * v
    return value


def plan_moves(
    board: Board, size: int, count: int, rng: np.random.Generator, samples: int = 8
) -> list[str]:
    """Up to ``count`` moves to play blind (the new tiles of the turn are not seen).

    Keeps ``samples`` guesses of the board, each move's tile drawn at random with
    the planner's own generator, and picks each move by its mean heuristic value
    over the guesses (a move that changes nothing in a guess counts as a loss)."""
    guesses = [board] * samples
    planned: list[str] = []
    for _ in range(count):
        best, best_total = None, 0.0
        for direction in DIRECTIONS:
            total, changed = 0.0, 0
            for guess in guesses:
                new, _ = move(guess, direction, size)
                if new == guess:
                    total += board_value(guess, size) - 1000.0
                else:
                    changed += 1
                    total += board_value(new, size)
            if changed and (best is None or total > best_total):
                best, best_total = direction, total
        if best is None:
            break
        planned.append(best)
        moved = [move(guess, best, size)[0] for guess in guesses]
        guesses = [
            spawn(new, rng) if new != old else new for new, old in zip(moved, guesses, strict=True)
        ]
    return planned or [DIRECTIONS[0]]
