"""Grid planner and path follower for the navigation worlds (the scripted expert).

The planner is a Dijkstra wavefront on an occupancy grid: it computes, once per episode,
the cost-to-go ``D`` from *every* cell to the goal region (8-connected moves, each costing
its length times the mean cell cost). That is A* run from all start cells at once, with
no heuristic; at 0.1 m resolution it is cheap enough to solve at every reset, and gives both

* the expert's path from wherever the robot is (follow ``next`` cells downhill), so it
  never needs to replan after a bump, and
* the geodesic distance used by the dense reward (``progress``).

Cell costs are 1 in open space, grow near walls and obstacles (so paths keep clearance)
and are ``inf`` where the robot's centre cannot be. The follower is pure pursuit: it aims
at the farthest point of the path (up to ``LOOKAHEAD`` cells) still in straight-line
sight, turns toward it and drives forward when roughly facing it.

Everything here is numpy on small arrays and knows nothing about MuJoCo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

OFFSETS = np.array([(1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (1, -1), (-1, 1), (-1, -1)])
STEP_LEN = np.linalg.norm(OFFSETS, axis=1)
LOS_MAX_COST = 2.7  # a straight segment is "in sight" if no cell on it costs more than this
LOOKAHEAD = 12  # path cells (1.2 m at 0.1 m resolution)
FILL_COST = 8.0  # cost per metre of leaving a blocked cell
FILL_DEPTH = 2  # blocked cells a couple of cells from free space get a way out


class Grid:
    """A square grid over [-half, half]^2; cell [i, j] is centred at (xs[i], xs[j])."""

    def __init__(self, half: float, res: float):
        self.half, self.res = float(half), float(res)
        self.n = int(round(2 * half / res))
        self.xs = -half + res * (np.arange(self.n) + 0.5)
        self.xy = np.stack(np.meshgrid(self.xs, self.xs, indexing="ij"), axis=-1)  # (n, n, 2)

    def cell(self, x: float, y: float) -> tuple[int, int]:
        n1 = self.n - 1
        i = int((x + self.half) / self.res)
        j = int((y + self.half) / self.res)
        return min(max(i, 0), n1), min(max(j, 0), n1)


def ramp_cost(d: np.ndarray, r_hard: float, r_soft: float, penalty: float) -> np.ndarray:
    """Extra cost of cells at distance ``d`` from an obstacle: ``inf`` below ``r_hard``,
    ``penalty`` falling linearly to 0 at ``r_soft``."""
    extra = penalty * np.clip((r_soft - d) / (r_soft - r_hard), 0.0, 1.0)
    return np.where(d < r_hard, np.inf, extra)


def _edges(cost: np.ndarray, res: float) -> list[np.ndarray]:
    """Cost (n, n) of the move from each cell to its neighbour along each of ``OFFSETS``."""
    n = cost.shape[0]
    c = np.full((n + 2, n + 2), np.inf)
    c[1:-1, 1:-1] = cost
    return [res * L * 0.5 * (cost + c[1 + di:n + 1 + di, 1 + dj:n + 1 + dj])
            for (di, dj), L in zip(OFFSETS, STEP_LEN)]


def relax(dist: np.ndarray, edges: list[np.ndarray], update: np.ndarray | None = None,
          max_iter: int = 1000) -> np.ndarray:
    """Bellman relaxation of ``dist`` (n, n) over the 8 neighbour moves costing ``edges``.

    Updated in place, one shift at a time, until nothing changes (about one iteration per
    cell of the longest shortest path) or ``max_iter``; only ``update`` cells change.
    """
    n = dist.shape[0]
    d = np.full((n + 2, n + 2), np.inf)
    inner = d[1:-1, 1:-1]
    inner[...] = dist
    where = True if update is None else update
    shifted = [d[1 + di:n + 1 + di, 1 + dj:n + 1 + dj] for di, dj in OFFSETS]
    prev, tmp = inner.copy(), np.empty_like(inner)
    for it in range(max_iter):
        for s, e in zip(shifted, edges):
            np.add(s, e, out=tmp)
            np.minimum(inner, tmp, out=inner, where=where)
        if it % 4 == 3 or it == max_iter - 1:  # checking every sweep costs more than extra sweeps
            if np.array_equal(prev, inner):
                break
            prev[...] = inner
    return inner.copy()


def distance_field(cost: np.ndarray, seeds: np.ndarray, res: float) -> np.ndarray:
    """Cost-to-go (n, n) from every cell to the ``seeds`` cells (bool (n, n)); unreachable: inf."""
    init = np.where(seeds & np.isfinite(cost), 0.0, np.inf)
    return relax(init, _edges(cost, res))


def _downhill(dist: np.ndarray, edges: list[np.ndarray]) -> np.ndarray:
    """Index into OFFSETS (n, n) of each cell's best move."""
    n = dist.shape[0]
    pad = np.full((n + 2, n + 2), np.inf)
    pad[1:-1, 1:-1] = dist
    return np.stack([pad[1 + di:n + 1 + di, 1 + dj:n + 1 + dj] + e
                     for (di, dj), e in zip(OFFSETS, edges)]).argmin(0)


@dataclass
class Plan:
    """A solved field: cost ``cost`` (n, n), cost-to-go ``dist`` (n, n), the downhill
    neighbour ``nxt`` (n, n, 2) int of each cell, the unit direction ``direction``
    (n, n, 2) toward it (zero at the goal and where unreachable) and ``reachable`` (n, n),
    the cells with a path to the goal through free cells only."""

    grid: Grid
    cost: np.ndarray
    dist: np.ndarray
    nxt: np.ndarray
    direction: np.ndarray
    reachable: np.ndarray

    @classmethod
    def solve(cls, grid: Grid, cost: np.ndarray, seeds: np.ndarray) -> "Plan":
        """Solve the field; blocked cells near reachable ones get a way out.

        The robot can end up in a blocked cell (cells are coarse, and contacts are soft),
        so blocked cells within ``FILL_DEPTH`` cells of free space get a cost-to-go that
        leads back out (at ``FILL_COST`` per metre); free cells never route through them.
        """
        edges = _edges(cost, grid.res)
        dist = distance_field(cost, seeds, grid.res)
        blocked = ~np.isfinite(dist)
        fill_edges = _edges(np.where(np.isfinite(cost), cost, FILL_COST), grid.res)
        filled = relax(dist, fill_edges, update=blocked, max_iter=FILL_DEPTH)
        k = np.where(blocked, _downhill(filled, fill_edges), _downhill(dist, edges))
        move = OFFSETS[k] * (np.isfinite(filled) & (filled > 0))[..., None]
        ij = np.stack(np.meshgrid(np.arange(grid.n), np.arange(grid.n), indexing="ij"), -1)
        direction = move / np.maximum(np.linalg.norm(move, axis=-1, keepdims=True), 1e-9)
        return cls(grid, cost, filled, ij + move, direction, ~blocked)

    def path(self, i: int, j: int, length: int = LOOKAHEAD) -> list[tuple[int, int]]:
        """Up to ``length`` cells downhill from cell (i, j), stopping at the goal."""
        cells = []
        for _ in range(length):
            ni, nj = self.nxt[i, j]
            if (ni, nj) == (i, j):
                break
            i, j = int(ni), int(nj)
            cells.append((i, j))
        return cells

    def in_sight(self, p: np.ndarray, q: np.ndarray) -> bool:
        """Whether the segment p -> q (m) crosses no cell costing more than LOS_MAX_COST."""
        g = self.grid
        steps = max(2, int(math.hypot(q[0] - p[0], q[1] - p[1]) / (0.5 * g.res)) + 1)
        t = np.linspace(0.0, 1.0, steps)[1:, None]
        pts = p + t * (q - p)
        idx = np.clip(((pts + g.half) / g.res).astype(int), 0, g.n - 1)
        return bool((self.cost[idx[:, 0], idx[:, 1]] <= LOS_MAX_COST).all())

    def waypoint(self, pos: np.ndarray, goal_point: np.ndarray | None) -> np.ndarray:
        """The point (2,) the robot at ``pos`` should steer to next."""
        g = self.grid
        i, j = g.cell(pos[0], pos[1])
        if not np.isfinite(self.dist[i, j]):  # pushed into a blocked cell: step back out
            lo_i, lo_j = max(i - 2, 0), max(j - 2, 0)
            win = self.dist[lo_i:i + 3, lo_j:j + 3]
            a, b = np.unravel_index(np.argmin(win), win.shape)
            return g.xy[lo_i + a, lo_j + b]
        cells = self.path(i, j)
        pts = [g.xy[c] for c in cells]
        reached = not cells or self.dist[cells[-1]] == 0.0
        if goal_point is not None and reached:
            if not cells or self.in_sight(pos, pts[-1]):
                return goal_point
        for p in reversed(pts):
            if self.in_sight(pos, p):
                return p
        return pts[min(1, len(pts) - 1)] if pts else (goal_point if goal_point is not None else pos)


def pursue(pos: np.ndarray, yaw: float, target: np.ndarray, k_turn: float, max_turn: float) -> np.ndarray:
    """Normalised unicycle command [forward, turn] in [-1, 1]^2 steering toward ``target``.

    Turn rate is proportional to the heading error (``k_turn`` rad/s per rad, saturating at
    ``max_turn`` rad/s); forward speed falls with the error and is zero beyond ~70 degrees,
    so the robot turns on the spot first.
    """
    err = math.atan2(target[1] - pos[1], target[0] - pos[0]) - yaw
    err = (err + math.pi) % (2 * math.pi) - math.pi
    turn = max(-1.0, min(1.0, k_turn * err / max_turn))
    c = math.cos(err)
    forward = c * c if c > 0.35 else 0.0
    return np.array([forward, turn], dtype=np.float32)
