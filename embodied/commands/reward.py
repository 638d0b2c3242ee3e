"""``embodied reward fit | eval | bench``: the in-domain CLIP reward and reward quality
(see ``embodied.runtime.reward``). The word after ``reward`` picks the sub-command; each is
its own Hydra app (``configs/reward_<word>.yaml``).

    embodied reward fit suite=manipulation
    embodied reward eval suite=manipulation reward.checkpoint=outputs/reward/fit/.../reward
    embodied reward bench suite=manipulation reward.checkpoint=outputs/reward/fit/.../reward
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable

from embodied.commands.app import hydra_command, run_dir
from embodied.runtime.reward import (RewardBenchConfig, RewardEvalConfig, RewardFitConfig, run_fit,
                                     run_reward_bench, run_reward_eval)

log = logging.getLogger("embodied.reward")


@hydra_command("reward_fit", RewardFitConfig)
def fit_main(cfg: RewardFitConfig) -> dict[str, Any]:
    return run_fit(cfg, run_dir())


@hydra_command("reward_eval", RewardEvalConfig)
def eval_main(cfg: RewardEvalConfig) -> dict[str, Any]:
    metrics = run_reward_eval(cfg, run_dir())
    for task, p in metrics["per_task"].items():
        log.info("%-24s AUROC %.3f  VOC %.3f  return Spearman %.3f  EPIC %.3f", task, p["auroc"], p["voc"],
                 p["return_spearman"], p["epic"])
    log.info("mean: AUROC %.3f (min %.3f)  VOC %.3f (min %.3f)  return Spearman %.3f  EPIC %.3f; report %s",
             metrics["auroc"], metrics["auroc_min"], metrics["voc"], metrics["voc_min"],
             metrics["return_spearman"], metrics["epic"], run_dir() / "report.md")
    return metrics


@hydra_command("reward_bench", RewardBenchConfig)
def bench_main(cfg: RewardBenchConfig) -> dict[str, Any]:
    return run_reward_bench(cfg, run_dir())


SUBCOMMANDS: dict[str, tuple[Callable[[], Any], str]] = {
    "fit": (fit_main, "fit the in-domain CLIP reward of a suite on a rollout bank (offline)"),
    "eval": (eval_main, "reward quality on held-out seeds and wordings: AUROC, VOC, return Spearman, EPIC"),
    "bench": (bench_main, "reward throughput: scoring frames/s and the loop's rate with vs. without it"),
}


def _usage() -> str:
    rows = "\n".join(f"  {k:<6} {v[1]}" for k, v in SUBCOMMANDS.items())
    return (f"usage: embodied reward <fit|eval|bench> [key=value ...]\n\n{rows}\n\n"
            "Each is a Hydra app: `embodied reward fit --help` lists its options.")


def main() -> None:
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return
    if args[0] not in SUBCOMMANDS:
        from embodied.core.errors import UnknownNameError

        print(f"embodied reward: error: {UnknownNameError('reward sub-command', args[0], list(SUBCOMMANDS))}\n\n"
              f"{_usage()}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [f"embodied reward {args[0]}", *args[1:]]
    SUBCOMMANDS[args[0]][0]()
