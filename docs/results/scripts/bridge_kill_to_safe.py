"""How long after a policy server dies is the robot in its safe state? (docs/results/bridge.md, "Faults")

Runs the setting of ``tests/test_bridge.py::test_server_killed_mid_episode_robot_in_safe_state_within_two_periods``
(a real server process on a loopback socket, SIGKILLed 0.6 s into an episode of the control loop
driving the test's toy robot) ``kills`` times at 20 Hz and at 50 Hz, and prints the time from the
kill to the first safe-state command the robot received.

    python3 docs/results/scripts/bridge_kill_to_safe.py [kills]
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from test_bridge import episode_with_server_killed  # noqa: E402


def kill_to_safe_ms(rate: float) -> float:
    loop, robot, _, t_kill = episode_with_server_killed(rate, int(rate * 2))
    holds = [t for t, _ in loop.hold_log if t > t_kill]
    return 1000 * (min(t for t, _ in robot.sent if t >= holds[0] - 1e-3) - t_kill)


def main() -> None:
    kills = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    logging.disable(logging.WARNING)  # the loop logs each hold and failed request
    for rate in (20.0, 50.0):
        ms = [kill_to_safe_ms(rate) for _ in range(kills)]
        print(f"{rate:.0f} Hz: kill -> safe state {min(ms):.1f}-{max(ms):.1f} ms (median {np.median(ms):.1f}) "
              f"over {kills} kills")


if __name__ == "__main__":
    main()
