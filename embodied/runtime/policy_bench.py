"""Policy section of ``embodied bench``: latency, actions/s, success per sampler, throughput.

    embodied bench sections=[policy]                       # trains flow, diffusion and mlp first
    embodied bench sections=[policy] policy_checkpoints.flow=PATH policy_checkpoints.diffusion=PATH ...

For each family (flow at 1/4/10 Euler steps, diffusion at DDIM-10 and DDPM-100, and the
MLP behaviour-cloning floor that reads a one-hot task id instead of the instruction):
per-chunk inference latency on one CPU thread (batch 1), actions/s (Ta actions per
chunk), success on training and held-out paraphrases, and training throughput
(samples/s) when the bench trained it. All families use the same demonstrations.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("embodied.bench")

SETTINGS = {
    "flow": [{"num_inference_steps": 1}, {"num_inference_steps": 4}, {"num_inference_steps": 10}],
    "diffusion": [{"sampler": "ddim", "num_inference_steps": 10}, {"sampler": "ddpm", "num_inference_steps": 100}],
    "mlp": [{}],
}


def _label(name: str, setting: dict[str, Any]) -> str:
    if name == "flow":
        return f"flow-{setting['num_inference_steps']}"
    if name == "diffusion":
        return f"diffusion-{setting['sampler']}-{setting['num_inference_steps']}"
    return name


def latency_ms(policy: Any, obs_batch: dict[str, Any], repeats: int = 30) -> float:
    """Median wall time of one ``predict_chunk`` call (batch 1) in ms, on one thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        policy.predict_chunk(obs_batch)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            policy.predict_chunk(obs_batch)
            times.append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
    return 1000 * float(np.median(times))


def bench_policies(cfg: Any, tasks: list[str], out: Path) -> dict[str, Any]:
    from embodied.core.policy import stack_history
    from embodied.core.registry import make_env
    from embodied.runtime.evaluate import evaluate
    from embodied.runtime.train import TrainConfig, train
    from policies import load_policy

    results: dict[str, Any] = {"settings": {}, "training": {}}
    env = make_env(tasks[0])
    obs, _ = env.reset(seed=0)
    batch = stack_history([obs] * 2)
    env.close()
    for name in cfg.policy_families:
        path = cfg.policy_checkpoints.get(name)
        if not path:
            tc = TrainConfig(suite=cfg.suite, tasks=list(cfg.tasks), policy={"name": name}, steps=cfg.policy_train_steps,
                             demos=cfg.policy_demos, eval_episodes=cfg.policy_eval_episodes, videos=0,
                             dataset=cfg.policy_dataset, seed=cfg.seed, progress=False,
                             snapshot_every=0)  # throwaway policies: no checkpoints/step_* copies
            log.info("training %s (%d steps) on %s", name, tc.steps, cfg.policy_dataset or "the default dataset")
            m = train(tc, out / name)
            results["training"][name] = {k: m[k] for k in ("train_samples_per_s", "train_time_s", "parameters")}
            path = str(out / name / "checkpoint")
        policy = load_policy(path)
        policy.eval()
        for setting in SETTINGS[name]:
            for k, v in setting.items():
                setattr(policy, k, v)
            b = dict(batch, task=[tasks[0]])
            ms = latency_ms(policy, b)
            m, _ = evaluate(policy, tasks, cfg.policy_eval_episodes, ("train", "heldout"), 100_000,
                            num_envs=10, vector="sync", progress=False)
            label = _label(name, setting)
            results["settings"][label] = {
                "latency_ms": ms, "actions_per_s": policy.n_action_steps / (ms / 1000),
                "success_rate": m["success_rate"], "heldout_paraphrase_success_rate": m["heldout_paraphrase_success_rate"],
                "per_task": {t: p["success_rate"] for t, p in m["per_task"].items()},
            }
            log.info("%-22s %7.2f ms/chunk %8.0f actions/s  success %.3f  held-out %.3f", label, ms,
                     results["settings"][label]["actions_per_s"], m["success_rate"],
                     m["heldout_paraphrase_success_rate"])
    s = results["settings"]
    if "flow-4" in s and "diffusion-ddpm-100" in s:
        results["flow4_vs_ddpm100_speedup"] = s["diffusion-ddpm-100"]["latency_ms"] / s["flow-4"]["latency_ms"]
        log.info("flow-4 is %.1fx faster than DDPM-100 (success %.3f vs %.3f)", results["flow4_vs_ddpm100_speedup"],
                 s["flow-4"]["success_rate"], s["diffusion-ddpm-100"]["success_rate"])
    return results
