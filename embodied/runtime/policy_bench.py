"""Policy sections of ``embodied bench``: latency, actions/s, success per sampler, throughput; and
where a training step's time goes.

    embodied bench sections=[policy]                       # trains flow, diffusion and mlp first
    embodied bench sections=[policy] policy_checkpoints.flow=PATH policy_checkpoints.diffusion=PATH ...
    embodied bench sections=[train_step]                   # the main job's step: data, forward, backward, ...

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


PHASES = ("data", "forward", "backward", "clip", "optimizer", "ema")


def _step_times(policy: Any, batcher: Any, opt: Any, sched: Any, batch_size: int, steps: int,
                autocast: Any = None) -> dict[str, float]:
    """Mean seconds per phase of ``steps`` training steps (after 10 unmeasured ones)."""
    import contextlib

    import torch

    params = list(policy.model.parameters())
    total = dict.fromkeys(PHASES, 0.0)
    for i in range(steps + 10):
        t0 = time.perf_counter()
        batch = batcher.sample(batch_size)
        t1 = time.perf_counter()
        with autocast() if autocast is not None else contextlib.nullcontext():
            loss, _ = policy.compute_loss(batch)
        t2 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t3 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        t4 = time.perf_counter()
        opt.step()
        sched.step()
        t5 = time.perf_counter()
        policy.ema_update()
        t6 = time.perf_counter()
        if i >= 10:
            for k, a, b in zip(PHASES, (t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6)):
                total[k] += b - a
    return {k: v / steps for k, v in total.items()}


def bench_train_step(cfg: Any, tasks: list[str], out: Path) -> dict[str, Any]:
    """Where the main job's training step spends its time, on the suite's dataset and recipe policy.

    The share of each phase (drawing the batch, forward, backward, gradient clipping, the optimiser,
    the weight average) at this process's torch threads; then the whole step on one thread and
    under bf16 autocast, each as a ratio to the first (measured in this process, one after another).
    With ``train_step_compile`` also the step with its loss graph (text head, observation encoder
    and loss) compiled by ``torch.compile`` (inductor), after the eager ones; its compile time is
    reported apart.
    """
    import torch

    from embodied.core.registry import make_env
    from embodied.runtime.checkpoints import env_kwargs
    from embodied.runtime.train import Batcher, TrainConfig, _ensure_dataset, compile_for_training
    from policies import make_config, make_policy

    tc = TrainConfig(suite=cfg.suite, tasks=list(cfg.tasks), demos=cfg.policy_demos, dataset=cfg.policy_dataset,
                     seed=cfg.seed, progress=False)
    ds = _ensure_dataset(tc, tasks)
    probe = make_env(tasks[0], **env_kwargs("state", 64, []))
    obs_spec, action_spec = probe.unwrapped.observation_spec, probe.unwrapped.action_spec
    probe.close()
    torch.manual_seed(cfg.seed)
    pcfg = make_config("flow", {"name": "flow", "obs_mode": "state"})
    policy = make_policy("flow", pcfg, obs_spec, action_spec, ds.stats, task_names=tasks, device="cpu")
    opt, batcher = policy.make_optimizer(), Batcher(ds, tasks, policy.n_obs_steps, policy.horizon, False, cfg.seed)
    sched = policy.make_scheduler(opt, tc.steps)
    policy.prepare_instructions(batcher.all_instructions())
    policy.train()
    threads, n, bs = torch.get_num_threads(), cfg.train_step_steps, tc.batch_size
    try:
        phases = _step_times(policy, batcher, opt, sched, bs, n)
        step = sum(phases.values())
        torch.set_num_threads(1)
        one = sum(_step_times(policy, batcher, opt, sched, bs, n).values())
        torch.set_num_threads(threads)
        bf16 = None
        if torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
            bf16 = sum(_step_times(policy, batcher, opt, sched, bs, n,
                                   lambda: torch.autocast("cpu", dtype=torch.bfloat16)).values())
        compiled = compile_s = None
        if cfg.train_step_compile:
            t0 = time.perf_counter()
            compile_for_training(policy)
            _step_times(policy, batcher, opt, sched, bs, 1)  # the compilations happen in the first steps
            compile_s = time.perf_counter() - t0
            compiled = sum(_step_times(policy, batcher, opt, sched, bs, n).values())
    finally:
        torch.set_num_threads(threads)
        batcher.close()
    res = {"threads": threads, "batch_size": bs, "steps_timed": n, "step_ms": 1000 * step,
           "samples_per_s": bs / step, "phase_ms": {k: 1000 * v for k, v in phases.items()},
           "phase_share": {k: v / step for k, v in phases.items()},
           "one_thread_step_ms": 1000 * one, "threads_speedup": one / step,
           "bf16_step_ms": None if bf16 is None else 1000 * bf16, "bf16_speedup": None if bf16 is None else step / bf16,
           "compiled_step_ms": None if compiled is None else 1000 * compiled,
           "compile_speedup": None if compiled is None else step / compiled, "compile_s": compile_s,
           "main_job_steps": tc.steps, "main_job_training_s_at_this_rate": tc.steps * step}
    log.info("train step (flow, batch %d, %d threads): %.2f ms, %.0f samples/s; %s", bs, threads, 1000 * step,
             bs / step, ", ".join(f"{k} {100 * v:.0f}%" for k, v in res["phase_share"].items()))
    log.info("one thread: %.2f ms (x%.2f from %d threads); bf16 autocast: %s", 1000 * one, one / step, threads,
             "not supported by this CPU" if bf16 is None else f"{1000 * bf16:.2f} ms (x{step / bf16:.2f})")
    if compiled is not None:
        log.info("torch.compile: %.2f ms (x%.2f), after %.0f s of compiling", 1000 * compiled, step / compiled,
                 compile_s)
    return res
