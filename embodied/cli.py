"""``embodied <command> [key=value ...]``: one console command, each sub-command a Hydra app.

Commands are looked up by name and imported lazily; every one accepts Hydra overrides
(``hydra.run.dir=PATH`` included) and writes ``metrics.json`` to its run directory.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "train": ("embodied.commands.train", "train a policy from scripted demonstrations, then evaluate it"),
    "eval": ("embodied.commands.eval", "evaluate a checkpoint (or the scripted experts) on a suite"),
    "collect": ("embodied.commands.collect", "record scripted-expert demonstrations to a dataset"),
    "play": ("embodied.commands.play", "run one episode with your own instruction and save a video"),
    "bench": ("embodied.commands.bench", "measure simulation, rendering and policy speed"),
    "data": ("embodied.commands.data", "validate|repair|info a dataset; export|import it as LeRobotDataset v3"),
    "serve": ("embodied.commands.serve", "serve a checkpoint's policy over websockets (openpi's wire format)"),
    "robot": ("embodied.commands.robot", "run a policy on a robot through the bridge: run | bench | sim-server"),
    "prefer": ("embodied.commands.prefer", "learn a reward from preferences with any teacher (run|eval|plot)"),
    "label": ("embodied.commands.label", "serve the labelling page: compare two clips, every answer saved at once"),
    "steer": ("embodied.commands.steer", "improve a frozen flow/diffusion policy by RL on its initial noise"),
    "reward": ("embodied.commands.reward", "fit | eval | bench a reward model (VLM reward, reward quality)"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {k:<{width}}  {v[1]}" for k, v in COMMANDS.items())
    return (f"usage: embodied <command> [key=value ...]\n\ncommands:\n{rows}\n\n"
            "Each command is a Hydra app: `embodied <command> --help` lists its options.")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        from embodied.core.errors import UnknownNameError

        print(f"embodied: error: {UnknownNameError('command', cmd, list(COMMANDS))}\n\n{_usage()}", file=sys.stderr)
        sys.exit(2)
    # torch ships triton, whose LLVM clashes with Mesa's: load it before any GL context.
    import sim.render

    sim.render.configure_gl()
    module = importlib.import_module(COMMANDS[cmd][0])
    actions = getattr(module, "ACTIONS", ())
    if actions and rest and "=" not in rest[0] and not rest[0].startswith("-"):
        rest = [f"action={rest[0]}", *rest[1:]]  # `embodied data repair ...` reads as action=repair
    sys.argv = [f"embodied {cmd}", *rest]
    module.main()


if __name__ == "__main__":
    main()
