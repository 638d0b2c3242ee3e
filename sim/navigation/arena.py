"""The four-room arena (MJCF) shared by every navigation task, and its scene sampler.

Units: metres, radians, seconds. The arena is the square [-2.5, 2.5]^2 (5 m x 5 m), cut by
two walls along x = 0 and y = 0 into four 2.5 m rooms, each with its own floor tint:

    bedroom (-x, +y) | kitchen (+x, +y)
    -----------------+-----------------
    office  (-x, -y) | garage  (+x, -y)

Each inner wall segment has a 0.8 m doorway at its middle, so the rooms form a ring.
Four coloured balls (red, green, blue, yellow; radius 0.15 m, solid) are mocap bodies
placed per episode by ``sample_scene`` (in random rooms, clear of walls, doorways and each
other, with at least two pairs whose midpoint is free). The robot is a 0.15 m-radius disc (slide x, slide y,
hinge yaw) driven by velocity actuators; see ``sim.navigation.world``.

Every task sees the same scene distribution; only the instruction differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

HALF = 2.5  # arena half-size (m)
WALL_HALF_T = 0.05  # wall half-thickness (m)
WALL_HALF_H = 0.25  # wall half-height (m)
DOOR_HALF = 0.4  # half-width of a doorway (m)
ROBOT_R = 0.15  # robot radius (m)
BALL_R = 0.15  # landmark ball radius (m)
ROOM_MARGIN = 0.35  # robot centre this far past the inner walls counts as "in the room" (m)
N_RANGES = 8  # range sensors on the robot, every 45 degrees from straight ahead, counter-clockwise
RANGE_MAX = 2.5  # range readings are clipped to this (m)

COLORS = ("red", "green", "blue", "yellow")  # landmark order in the state vector
COLOR_RGBA = {"red": "0.9 0.12 0.12 1", "green": "0.1 0.75 0.2 1",
              "blue": "0.12 0.3 0.95 1", "yellow": "0.95 0.85 0.1 1"}
ROOMS = {"kitchen": (1, 1), "bedroom": (-1, 1), "office": (-1, -1), "garage": (1, -1)}  # quadrant signs
ROOM_RGBA = {"kitchen": "0.86 0.76 0.62 1", "bedroom": "0.72 0.64 0.82 1",
             "office": "0.74 0.78 0.8 1", "garage": "0.42 0.42 0.44 1"}
DOORS = np.array([(0.0, 1.25), (0.0, -1.25), (1.25, 0.0), (-1.25, 0.0)])  # doorway centres


def _range_sites_xml() -> str:
    """Horizontal rays from the robot centre (at ball-centre height), one every 45 degrees."""
    sites = []
    for k in range(N_RANGES):
        a = 2 * math.pi * k / N_RANGES
        sites.append(f'<site name="range_{k}" pos="0 0 {BALL_R}" zaxis="{math.cos(a):.6f} {math.sin(a):.6f} 0" '
                     f'size="0.01" rgba="0 0 0 0"/>')
    return "\n      ".join(sites)


def _range_sensors_xml() -> str:
    return "\n    ".join(f'<rangefinder name="range_{k}" site="range_{k}"/>' for k in range(N_RANGES))


def _wall_segments() -> np.ndarray:
    """Wall centre lines as (M, 2, 2) segments; the planner treats them as capsules."""
    h, d, a = HALF, DOOR_HALF, 1.25
    segs = [((-h, -h), (h, -h)), ((h, -h), (h, h)), ((h, h), (-h, h)), ((-h, h), (-h, -h))]
    for s in (1, -1):  # inner walls, split around the doorways at +-1.25
        segs += [((0, s * h), (0, s * (a + d))), ((0, s * (a - d)), (0, 0)),
                 ((s * h, 0), (s * (a + d), 0)), ((s * (a - d), 0), (0, 0))]
    return np.array(segs, dtype=np.float64)


SEGMENTS = _wall_segments()


def segment_distance(p: np.ndarray, segs: np.ndarray = SEGMENTS) -> np.ndarray:
    """Distance (...,) from points ``p`` (..., 2) to the nearest segment of ``segs`` (M, 2, 2)."""
    a, b = segs[:, 0], segs[:, 1]
    ab = b - a
    rel = p[..., None, :] - a  # (..., M, 2)
    t = np.clip((rel * ab).sum(-1) / (ab * ab).sum(-1), 0.0, 1.0)
    return np.linalg.norm(rel - t[..., None] * ab, axis=-1).min(-1)


def wall_clearance(p: np.ndarray) -> np.ndarray:
    """Distance (...,) from points (..., 2) to the nearest wall face (m)."""
    return segment_distance(p) - WALL_HALF_T


def room_of(x: float, y: float, margin: float = ROOM_MARGIN) -> str | None:
    """The room whose inner walls the point is at least ``margin`` past, else None."""
    for name, (sx, sy) in ROOMS.items():
        if sx * x > margin and sy * y > margin:
            return name
    return None


# ------------------------------------------------------------------ scene sampling
LANDMARK_WALL = 0.4  # min distance of a ball centre from a wall centre line (m)
LANDMARK_DOOR = 0.9  # min distance of a ball centre from a doorway centre (m); a ball never
# blocks a doorway, though the 0.8 m keep-out zone of an avoided ball may (the rooms form a
# ring, so there is usually another way round; episodes without one are resampled)
LANDMARK_SEP = 1.1  # min distance between ball centres (m)
MIDPOINT_CLEAR = 0.6  # a "between" point needs this much room from the other balls (m)


@dataclass(frozen=True)
class Scene:
    """One episode's layout.

    Attributes:
        landmarks: (4, 2) ball centres (m) in ``COLORS`` order.
        pairs: index pairs (i < j) whose midpoint is free space the robot can stand on.
    """

    landmarks: np.ndarray
    pairs: tuple[tuple[int, int], ...]


def sample_in_room(rng: np.random.Generator, room: str, margin: float = LANDMARK_WALL) -> np.ndarray:
    """A uniform point (2,) in a room, at least ``margin`` from its wall centre lines."""
    sx, sy = ROOMS[room]
    u = rng.uniform(margin, HALF - margin, size=2)
    return np.array([sx * u[0], sy * u[1]])


def free_pairs(lm: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Index pairs (i < j) of balls ``lm`` (4, 2) whose midpoint is free space the robot can stand on."""
    pairs = []
    for i in range(len(lm)):
        for j in range(i + 1, len(lm)):
            mid = 0.5 * (lm[i] + lm[j])
            others = np.delete(lm, (i, j), axis=0)
            if (segment_distance(mid) >= LANDMARK_WALL
                    and np.linalg.norm(others - mid, axis=1).min() >= MIDPOINT_CLEAR):
                pairs.append((i, j))
    return tuple(pairs)


def sample_scene(rng: np.random.Generator, max_tries: int = 1000) -> Scene:
    """Place the four balls: each in a random room, clear of walls, doorways and each other.

    Scenes with fewer than two "between" pairs are rejected, so that a policy must read
    the instruction to know which pair is meant (the same rule for every task).
    """
    names = list(ROOMS)
    for _ in range(max_tries):
        rooms = rng.integers(len(names), size=len(COLORS))
        lm = np.zeros((len(COLORS), 2))
        ok = True
        for k, r in enumerate(rooms):
            for _ in range(50):
                p = sample_in_room(rng, names[r])
                if (np.linalg.norm(DOORS - p, axis=1).min() >= LANDMARK_DOOR
                        and (k == 0 or np.linalg.norm(lm[:k] - p, axis=1).min() >= LANDMARK_SEP)):
                    lm[k] = p
                    break
            else:
                ok = False
                break
        if ok:
            pairs = free_pairs(lm)
            if len(pairs) >= 2:
                return Scene(lm, pairs)
    raise RuntimeError(f"could not sample a navigation scene in {max_tries} tries")


# ------------------------------------------------------------------------- MJCF
def _walls_xml() -> str:
    out = []
    for k, ((x0, y0), (x1, y1)) in enumerate(SEGMENTS):
        outer = k < 4
        half_len = 0.5 * math.hypot(x1 - x0, y1 - y0) + (WALL_HALF_T if outer else 0.0)
        sx, sy = (half_len, WALL_HALF_T) if abs(y1 - y0) < 1e-9 else (WALL_HALF_T, half_len)
        out.append(f'<geom name="wall{k}" class="solid" type="box" size="{sx:.3f} {sy:.3f} {WALL_HALF_H}" '
                   f'pos="{(x0 + x1) / 2:.3f} {(y0 + y1) / 2:.3f} {WALL_HALF_H}" rgba="0.7 0.64 0.56 1"/>')
    return "\n    ".join(out)


def _floors_xml() -> str:
    q = HALF / 2
    return "\n    ".join(
        f'<geom name="floor_{n}" type="box" size="{q} {q} 0.005" pos="{sx * q} {sy * q} -0.005" '
        f'rgba="{ROOM_RGBA[n]}"/>' for n, (sx, sy) in ROOMS.items())


def _balls_xml() -> str:
    return "\n    ".join(
        f'<body name="ball_{c}" mocap="true" pos="{3 + k} 3 {BALL_R}">'
        f'<geom name="ball_{c}" class="solid" type="sphere" size="{BALL_R}" rgba="{COLOR_RGBA[c]}"/></body>'
        for k, c in enumerate(COLORS))


ARENA_XML = f"""
<mujoco model="four_rooms">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="0.02" integrator="implicitfast"/>
  <visual>
    <headlight active="0"/>
    <quality shadowsize="512" offsamples="0"/>
    <global offwidth="512" offheight="512"/>
  </visual>
  <default>
    <geom contype="0" conaffinity="0" solref="0.04 1" friction="0.3 0.005 0.0001"/>
    <default class="solid"><geom contype="1" conaffinity="1" condim="1"/></default>
  </default>
  <worldbody>
    <light name="sun" directional="true" castshadow="false" pos="0 0 6" dir="0.4 0.6 -0.7"
           diffuse="0.55 0.55 0.55" ambient="0.5 0.5 0.5" specular="0 0 0"/>
    <camera name="overhead" pos="0 0 6.6" xyaxes="1 0 0 0 1 0" fovy="45"/>
    <geom name="ground" type="plane" size="4 4 0.1" pos="0 0 -0.02" rgba="0.2 0.22 0.25 1"/>
    {_floors_xml()}
    {_walls_xml()}
    {_balls_xml()}
    <body name="robot" pos="0 0 0">
      <joint name="x" type="slide" axis="1 0 0"/>
      <joint name="y" type="slide" axis="0 1 0"/>
      <joint name="yaw" type="hinge" axis="0 0 1"/>
      <geom name="chassis" class="solid" type="cylinder" size="{ROBOT_R} 0.1" pos="0 0 0.1" mass="5"
            rgba="0.92 0.92 0.92 1"/>
      <geom name="nose" type="box" size="0.05 0.05 0.02" pos="0.08 0 0.21" mass="0.05" rgba="0.1 0.1 0.12 1"/>
      <camera name="ego" pos="0.16 0 0.26" xyaxes="0 -1 0 0.25 0 1" fovy="90"/>
      {_range_sites_xml()}
    </body>
  </worldbody>
  <sensor>
    {_range_sensors_xml()}
  </sensor>
  <actuator>
    <velocity name="vx" joint="x" kv="150" ctrlrange="-2 2"/>
    <velocity name="vy" joint="y" kv="150" ctrlrange="-2 2"/>
    <velocity name="wz" joint="yaw" kv="3" ctrlrange="-4 4"/>
  </actuator>
</mujoco>
"""
