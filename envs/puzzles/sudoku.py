"""Sudoku as a multi-turn text environment with free-text placements.

Each reset draws a puzzle with exactly one solution (:mod:`.sudoku_solver`):
a 4x4 grid of 2x2 boxes (``ragen/Sudoku4x4-v0``) or a 9x9 grid of 3x3 boxes
(``ragen/Sudoku9x9-v0``). The agent fills it with placements such as
``<answer>r2c3=4 || r1c1=2</answer>``: row, column (1-based) and digit, several
per turn, separated by the env's separator; ``r2c3=0`` empties a cell again.

A placement is refused, and named in the next observation with the reason,
when it is malformed, out of range, on a cell given at the start, or when the
digit is already in the cell's row, column or box on the current grid. A
placement that breaks no rule but is not the solution's digit is allowed: it
stays on the grid until the agent overwrites or empties it (nothing tells the
agent it is wrong, except that the puzzle later runs into a cell with no
possible digit). The episode succeeds, and ends, when the grid is full: with no
conflicts allowed that grid is the unique solution.

Reward: 1.0 when the puzzle is solved, 0 otherwise; the format penalty once in
a turn with a refused placement or an unreadable answer. Every placement made
(emptying included) spends one action of the budget; refused ones spend none.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..core.answer_env import AnswerEnv, AnswerResult, quote
from .sudoku_solver import conflicts, generate_puzzle

SOLVED_REWARD = 1.0
_PLACEMENT = re.compile(r"r\s*(\d{1,2})\s*c\s*(\d{1,2})\s*=\s*(\d{1,2})", re.ASCII | re.IGNORECASE)
#: A part longer than this is not a placement (and is not matched at all).
_MAX_PART = 24


class SudokuEnv(AnswerEnv):
    """Sudoku with generated puzzles of a unique solution.

    Args:
        size: 4 (2x2 boxes) or 9 (3x3 boxes).
        holes: empty cells wanted in each puzzle (default 10 for 4x4, 45 for 9x9);
            cells are emptied only while the solution stays unique, so a puzzle may
            have fewer.
        action_budget: placements per trajectory (default: twice ``holes``, room
            for corrections).
        max_actions_per_turn: placements read per turn (default: ``size``); further
            ones are ignored without penalty.
        **kwargs: passed to :class:`AnswerEnv` / :class:`TextEnv`.
    """

    def __init__(self, size: int = 4, holes: int | None = None, **kwargs: Any) -> None:
        if size not in (4, 9) or isinstance(size, bool):
            raise ValueError(f"size must be 4 or 9, got {size!r}")
        self.size = size
        self.box = 2 if size == 4 else 3
        if holes is None:
            holes = 10 if size == 4 else 45
        if not isinstance(holes, int) or isinstance(holes, bool) or not 1 <= holes < size * size:
            raise ValueError(f"holes must be an int in [1, {size * size - 1}], got {holes!r}")
        self.holes = holes
        kwargs.setdefault("action_budget", 2 * holes)
        kwargs.setdefault("max_actions_per_turn", size)
        per_turn = kwargs["max_actions_per_turn"]
        if isinstance(per_turn, int) and per_turn > 0:
            kwargs.setdefault("feedback_max_length", 120 + 70 * per_turn)
        self.grid = [0] * (size * size)
        self.state_max_length = len(self._render_state())
        super().__init__(**kwargs)
        self.answer_example = f"r1c2=3 {self.parser.separator} r4c4=1"
        self.givens: tuple[bool, ...] = ()
        self.solution: list[int] = []

    # ----- episode ------------------------------------------------------------------
    def _new_episode(self) -> None:
        puzzle, self.solution = generate_puzzle(self.np_random, self.box, self.holes)
        self.grid = puzzle
        self.givens = tuple(v != 0 for v in puzzle)

    def _well_formed_body(self, answer: str) -> bool:
        """Placements ``rRcC=D`` with the row, column and digit in range, on any cell."""
        parts = self.split_parts(answer)
        for part in parts:
            match = _PLACEMENT.fullmatch(part) if len(part) <= _MAX_PART else None
            if match is None:
                return False
            row, col, digit = (int(x) for x in match.groups())
            if not (1 <= row <= self.size and 1 <= col <= self.size and 0 <= digit <= self.size):
                return False
        return bool(parts)

    def random_actions(self, rng: np.random.Generator) -> list[str]:
        """1 to ``max_actions_per_turn`` legal placements: random cells that were not
        given, each with a digit drawn from those that clash with nothing placed so far
        (0, emptying the cell, when every digit clashes). Legal, not correct: the
        digits ignore the solution."""
        free = [i for i, given in enumerate(self.givens) if not given]
        count = int(rng.integers(1, self.parser.max_actions + 1))
        n, grid, out = self.size, list(self.grid), []
        for k in rng.integers(len(free), size=count):
            cell = free[int(k)]
            legal = [d for d in range(1, n + 1) if not conflicts(grid, self.box, cell, d)]
            digit = int(rng.choice(legal)) if legal else 0
            grid[cell] = digit
            out.append(f"r{cell // n + 1}c{cell % n + 1}={digit}")
        return out

    def _is_success(self) -> bool:
        return all(self.grid) and self.grid == self.solution

    def _extra_info(self) -> dict[str, Any]:
        return {"empty_cells": self.grid.count(0)}

    def _judge(self, answer: str) -> AnswerResult:
        parts = self.split_parts(answer)
        if not parts:
            return AnswerResult(feedback="No placement in the answer.", rejected=(answer,))
        room = min(self.parser.max_actions, self._actions_left)
        placed, cleared, refused = [], [], []
        executed, rejected, effective = [], [], 0
        for part in parts:
            if len(executed) >= room:
                break
            cell, digit, error = self._read(part)
            if error:
                rejected.append(part)
                refused.append(f"{quote(part, 16)} ({error})")
                continue
            name = f"r{cell // self.size + 1}c{cell % self.size + 1}"
            executed.append(f"{name}={digit}")
            effective += self.grid[cell] != digit
            self.grid[cell] = digit
            (placed if digit else cleared).append(f"{name}={digit}" if digit else name)
        lines = []
        if placed:
            lines.append(f"Placed {', '.join(placed)}.")
        if cleared:
            lines.append(f"Emptied {', '.join(cleared)}.")
        if refused:
            lines.append(f"Refused {', '.join(refused)}.")
        unread = len(parts) - len(executed) - len(rejected)
        if unread:
            lines.append(f"Ignored {unread} more (at most {room} placements this turn).")
        solved = self._is_success()
        if solved:
            lines.append("Solved!")
        return AnswerResult(
            reward=SOLVED_REWARD if solved else 0.0,
            feedback="\n".join(lines),
            executed=tuple(executed),
            rejected=tuple(rejected),
            effective=effective,
            terminated=solved,
        )

    def _read(self, part: str) -> tuple[int, int, str]:
        """(cell, digit, "") for a legal placement, else (-1, 0, why it is refused)."""
        match = _PLACEMENT.fullmatch(part) if len(part) <= _MAX_PART else None
        if match is None:
            return -1, 0, "not a placement like r1c2=3"
        row, col, digit = (int(x) for x in match.groups())
        n = self.size
        if not (1 <= row <= n and 1 <= col <= n):
            return -1, 0, f"rows and columns go from 1 to {n}"
        if not 0 <= digit <= n:
            return -1, 0, f"digits go from 1 to {n}, or 0 to empty a cell"
        cell = (row - 1) * n + col - 1
        if self.givens[cell]:
            return -1, 0, "a given cell"
        if digit:
            units = conflicts(self.grid, self.box, cell, digit)
            if units:
                where = {"row": f"row {row}", "column": f"column {col}", "box": "the box"}
                return -1, 0, f"{digit} is already in {' and '.join(where[u] for u in units)}"
        return cell, digit, ""

    # ----- text ----------------------------------------------------------------------
    def _render_state(self) -> str:
        n, box = self.size, self.box

        def band(cells: list[str]) -> str:
            groups = [" ".join(cells[i : i + box]) for i in range(0, n, box)]
            return " | ".join(groups)

        header = "    " + band([f"{c}" for c in range(1, n + 1)])
        rule = "    " + "-+-".join(["-" * (2 * box - 1)] * box)
        lines = [header]
        for r in range(n):
            if r and r % box == 0:
                lines.append(rule)
            row = self.grid[r * n : (r + 1) * n]
            lines.append(f"r{r + 1}  " + band([str(v) if v else "." for v in row]))
        return "\n".join(lines)

    def _compact_instructions(self) -> str:
        return (
            f"Fill the {self.size}x{self.size} Sudoku: each row, column and box holds "
            f"1-{self.size} once. Answer with placements, e.g. {self.answer_example}"
        )

    def _full_instructions(self) -> str:
        n, box = self.size, self.box
        return (
            f"Solve the {n}x{n} Sudoku: fill every empty cell (.) with a digit from 1 to {n} "
            f"so that each row, each column and each {box}x{box} box holds every digit once. "
            "The puzzle has exactly one solution. Rows are labelled r1, r2, ... and columns "
            "1, 2, ... at the top. Cells given at the start cannot be changed; your own "
            "digits can be overwritten, or emptied with 0. A digit already in the cell's "
            "row, column or box is refused.\n"
            f"Answer with placements row, column = digit, e.g. "
            f"{self.parser.wrap(self.answer_example)}, up to {self.parser.max_actions} per "
            f"turn, separated by '{self.parser.separator}'. You have {self.action_budget} "
            "placements in total. Reward 1 when the grid is solved."
        )
