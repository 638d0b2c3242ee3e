"""``embodied robot``: run a policy on a robot through the bridge.

    embodied robot run robot=sim robot.task=reach url=ws://127.0.0.1:8000 episodes=5
    embodied robot run robot=remote robot.url=ws://ROBOT:8766 url=ws://GPU:8000 loop.rate_hz=20
    embodied robot run robot=sim checkpoint=RUN/checkpoint              # the policy in this process
    embodied robot run ... loop.mode=lockstep loop.rate_hz=0            # Policy.act step for step
    embodied robot bench requests=1000 loop_steps=500                   # round-trip latency and loop jitter
    embodied robot bench url=ws://127.0.0.1:8000 state_dim=39           # ... of a running policy server
    embodied robot sim-server --task reach  # a simulated robot as its own process (embodied.bridge.drivers.sim)

``run`` and ``bench`` are Hydra apps (``configs/robot.yaml``, ``configs/robot_bench.yaml``;
``embodied robot run --help`` lists the options) and write ``metrics.json`` to
``hydra.run.dir``; their jobs are ``embodied.runtime.robot``. ``run`` checks the robot and
the policy before enabling motion; any key pressed in the terminal is an e-stop; Ctrl-C holds
the robot and exits cleanly.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from embodied.commands.app import hydra_command, run_dir
from embodied.runtime.robot import RobotBenchConfig, RobotRunConfig, bench_bridge, run_robot

log = logging.getLogger("embodied.robot")


@hydra_command("robot", RobotRunConfig)
def run_main(cfg: RobotRunConfig) -> dict[str, Any]:
    metrics = run_robot(cfg, run_dir())
    log.info("success %s over %d episode(s); interventions %d, hold steps %d; run dir %s",
             metrics["success_rate"], len(metrics["episodes"]), metrics["interventions"], metrics["hold_steps"],
             run_dir())
    return metrics


@hydra_command("robot_bench", RobotBenchConfig)
def bench_main(cfg: RobotBenchConfig) -> dict[str, Any]:
    return bench_bridge(cfg, run_dir())


SUBCOMMANDS = ("run", "bench", "sim-server")


def main() -> None:
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return
    sub, rest = args[0], args[1:]
    if sub == "run":
        sys.argv = [f"{sys.argv[0]} run", *rest]
        run_main()
    elif sub == "bench":
        sys.argv = [f"{sys.argv[0]} bench", *rest]
        bench_main()
    elif sub == "sim-server":
        from embodied.bridge.drivers.sim import main as sim_server

        sim_server(rest)
    else:
        from embodied.core.errors import UnknownNameError

        print(f"embodied robot: error: {UnknownNameError('sub-command', sub, list(SUBCOMMANDS))}", file=sys.stderr)
        sys.exit(2)
