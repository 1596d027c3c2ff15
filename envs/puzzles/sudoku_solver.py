"""Sudoku solving and puzzle generation for :mod:`.sudoku`.

A grid of side ``n = box * box`` (4 or 9) is a flat list of ``n * n`` ints,
row-major, 0 for an empty cell. The solver is a depth-first search that fills
the empty cell with the fewest candidates first, keeping the digits used in
each row, column and box as bit masks; it counts solutions up to a limit, which
is how a puzzle's uniqueness is checked.

A puzzle is made by filling an empty grid with the solver (candidates in a
random order drawn from the env's generator), then emptying cells in a random
order, keeping each removal only when the solution stays unique, until the
wanted number of holes is reached or every cell was tried.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np


@cache
def geometry(box: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(row, column, box) index of every cell of a grid with ``box x box`` boxes."""
    n = box * box
    rows = tuple(i // n for i in range(n * n))
    cols = tuple(i % n for i in range(n * n))
    boxes = tuple((r // box) * box + c // box for r, c in zip(rows, cols, strict=True))
    return rows, cols, boxes


def conflicts(grid: Sequence[int], box: int, cell: int, digit: int) -> list[str]:
    """The units ("row", "column", "box") of ``cell`` that already hold ``digit``
    somewhere other than ``cell`` itself."""
    rows, cols, boxes = geometry(box)
    found = []
    for name, unit in (("row", rows), ("column", cols), ("box", boxes)):
        if any(grid[i] == digit and unit[i] == unit[cell] and i != cell for i in range(len(grid))):
            found.append(name)
    return found


def count_solutions(
    grid: Sequence[int], box: int, limit: int = 2, rng: np.random.Generator | None = None
) -> tuple[int, list[int] | None]:
    """The number of solutions of ``grid``, counted up to ``limit``, and the first one
    found (None when there is none). Givens that already clash give (0, None).
    With ``rng`` the candidates of each cell are tried in a random order."""
    n = box * box
    rows, cols, boxes = geometry(box)
    full = (1 << (n + 1)) - 2  # bits 1..n
    g = list(grid)
    used_r, used_c, used_b = [0] * n, [0] * n, [0] * n
    for i, v in enumerate(g):
        if v:
            bit = 1 << v
            if (used_r[rows[i]] | used_c[cols[i]] | used_b[boxes[i]]) & bit:
                return 0, None
            used_r[rows[i]] |= bit
            used_c[cols[i]] |= bit
            used_b[boxes[i]] |= bit
    empties = [i for i, v in enumerate(g) if not v]
    count = 0
    first: list[int] | None = None

    def search() -> bool:
        """True once ``limit`` solutions were counted."""
        nonlocal count, first
        best, best_mask, best_k = -1, 0, n + 1
        for i in empties:
            if g[i]:
                continue
            mask = full & ~(used_r[rows[i]] | used_c[cols[i]] | used_b[boxes[i]])
            k = mask.bit_count()
            if k < best_k:
                best, best_mask, best_k = i, mask, k
                if k <= 1:
                    break
        if best < 0:
            count += 1
            if first is None:
                first = g.copy()
            return count >= limit
        if best_k == 0:
            return False
        digits = [d for d in range(1, n + 1) if best_mask >> d & 1]
        if rng is not None:
            digits = [digits[int(k)] for k in rng.permutation(len(digits))]
        r, c, b = rows[best], cols[best], boxes[best]
        for d in digits:
            bit = 1 << d
            g[best] = d
            used_r[r] |= bit
            used_c[c] |= bit
            used_b[b] |= bit
            done = search()
            g[best] = 0
            used_r[r] &= ~bit
            used_c[c] &= ~bit
            used_b[b] &= ~bit
            if done:
                return True
        return False

    search()
    return count, first


def solve(grid: Sequence[int], box: int) -> list[int] | None:
    """One solution of ``grid``, or None."""
    return count_solutions(grid, box, limit=1)[1]


def generate_puzzle(rng: np.random.Generator, box: int, holes: int) -> tuple[list[int], list[int]]:
    """(puzzle, solution): a random full grid and a puzzle with at most ``holes``
    empty cells whose only solution it is."""
    n = box * box
    _, solution = count_solutions([0] * (n * n), box, limit=1, rng=rng)
    assert solution is not None  # an empty grid always has a solution
    puzzle = solution.copy()
    removed = 0
    for k in rng.permutation(n * n):
        if removed >= holes:
            break
        cell = int(k)
        puzzle[cell] = 0
        if count_solutions(puzzle, box, limit=2)[0] == 1:
            removed += 1
        else:
            puzzle[cell] = solution[cell]
    return puzzle, solution
