"""Shortest-solution Sokoban solver, used to check generated rooms and as a planning agent.

Breadth-first search over (player cell, set of box cells) with forward moves
and pushes, so the first solved state found gives a shortest action list. It
reads only a :class:`ragen_envs.grids.sokoban.SokobanState` (shape, walls, targets,
boxes, player) and shares no code with the room generator.

Internally the grid gets an extra ring of wall so neighbour indices never
leave it, cells become flat indices and the box set a bit mask, so a search
state is one int. Pushes onto dead cells (from which no sequence of pushes
can bring a box to any target) are pruned.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sokoban import SokobanState

ACTIONS = ("Up", "Down", "Left", "Right")


class SolverLimitError(RuntimeError):
    """The search visited ``max_states`` states without finding a solution."""


def _live_cells(free: list[bool], targets: list[int], offsets: tuple[int, ...]) -> list[bool]:
    """Cells from which a lone box can be pushed to some target (targets included).

    Works backwards from the targets: a box reached ``y`` by a push along
    ``off`` from ``y - off``, with the player standing on ``y - 2 * off``.
    """
    live = [False] * len(free)
    queue = deque(targets)
    for t in targets:
        live[t] = True
    while queue:
        y = queue.popleft()
        for off in offsets:
            x = y - off
            if free[x] and free[x - off] and not live[x]:
                live[x] = True
                queue.append(x)
    return live


def solve(state: SokobanState, max_states: int = 1_000_000) -> list[str] | None:
    """A shortest list of actions ("Up", "Down", "Left", "Right") that solves ``state``.

    Returns ``[]`` when the state is already solved and None when it cannot be
    solved. Raises :class:`SolverLimitError` after ``max_states`` distinct
    states without an answer.
    """
    rows, cols = state.shape
    width = cols + 2
    n_cells = (rows + 2) * width

    def index(cell: tuple[int, int]) -> int:
        return (cell[0] + 1) * width + cell[1] + 1

    free = [False] * n_cells
    for r in range(rows):
        for c in range(cols):
            free[index((r, c))] = (r, c) not in state.walls
    offsets = (-width, width, -1, 1)  # same order as ACTIONS
    targets = [index(t) for t in state.targets]
    live = _live_cells(free, targets, offsets)
    target_mask = sum(1 << t for t in targets)
    boxes = sum(1 << index(b) for b in state.boxes)
    player = index(state.player)

    if boxes & ~target_mask == 0:
        return []
    if len(state.boxes) > len(targets) or not all(live[index(b)] for b in state.boxes):
        return None

    # key = boxes * n_cells + player; parent[key] = previous key * 4 + action index.
    start = boxes * n_cells + player
    parent: dict[int, int] = {start: -1}
    queue = deque([start])
    while queue:
        key = queue.popleft()
        boxes, player = divmod(key, n_cells)
        for action, off in enumerate(offsets):
            step = player + off
            if not free[step]:
                continue
            new_boxes = boxes
            if boxes >> step & 1:
                beyond = step + off
                if not live[beyond] or boxes >> beyond & 1:
                    continue
                new_boxes = boxes ^ (1 << step) ^ (1 << beyond)
            new_key = new_boxes * n_cells + step
            if new_key in parent:
                continue
            parent[new_key] = key * 4 + action
            if new_boxes != boxes and new_boxes & ~target_mask == 0:
                return _path(parent, new_key)
            if len(parent) >= max_states:
                raise SolverLimitError(
                    f"no solution within max_states={max_states} states; raise max_states"
                )
            queue.append(new_key)
    return None


def _path(parent: dict[int, int], key: int) -> list[str]:
    actions: list[str] = []
    while (link := parent[key]) != -1:
        key, action = divmod(link, 4)
        actions.append(ACTIONS[action])
    return actions[::-1]
