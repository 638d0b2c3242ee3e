"""``embodied reward fit | eval | bench`` wired to the VLM reward's room (``rewards.vlm``):
each runs the room's function and writes what it returns to ``RUN/metrics.json``.

The algorithms live beside the model: rollout banks (``rewards.vlm.bank``), caption labels
(``rewards.vlm.labels``), the fit (``rewards.vlm.fit_reward``, ``rewards.vlm.fit``), reward
quality on a bank (``rewards.vlm.evaluate``) and throughput (``rewards.vlm.bench``).

    embodied reward fit suite=manipulation                     # -> RUN/reward (the checkpoint)
    embodied reward eval suite=manipulation reward.checkpoint=RUN/reward
    embodied reward bench suite=manipulation reward.checkpoint=RUN/reward
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embodied.core.files import write_json
from embodied.core.reward import RewardModel
from rewards.vlm.bench import RewardBenchConfig, bench_reward
from rewards.vlm.evaluate import RewardEvalConfig, evaluate_on_bank
from rewards.vlm.fit_reward import RewardFitConfig, fit_reward

__all__ = ["RewardBenchConfig", "RewardEvalConfig", "RewardFitConfig", "run_fit", "run_reward_bench",
           "run_reward_eval"]


def run_fit(cfg: RewardFitConfig, out: Path) -> dict[str, Any]:
    """Fit the in-domain reward on a training bank and save it to ``cfg.out`` or ``out/reward``."""
    metrics = fit_reward(cfg, Path(cfg.out) if cfg.out else out / "reward")
    write_json(out / "metrics.json", metrics)
    return metrics


def run_reward_eval(cfg: RewardEvalConfig, out: Path, model: RewardModel | None = None) -> dict[str, Any]:
    """Evaluate ``model`` (else the one ``cfg.reward`` names) on a bank; write metrics.json and report.md."""
    from rewards.report import write_reward_report

    metrics, bank, curves = evaluate_on_bank(cfg, model)
    write_json(out / "metrics.json", metrics)
    write_reward_report(out, metrics, bank, curves, plots=cfg.plots)
    return metrics


def run_reward_bench(cfg: RewardBenchConfig, out: Path) -> dict[str, Any]:
    """Reward throughput (``rewards.vlm.bench``); writes metrics.json."""
    metrics = bench_reward(cfg)
    write_json(out / "metrics.json", metrics)
    return metrics
