"""``embodied bench``: figures, not timed tests.

Simulation: env steps/s with state observations vs. a raw ``mujoco.mj_step`` loop on the
same model with the same number of substeps (and the ratio). Rendering: frames/s of one
camera at several sizes. Policies (``policies=[...]`` with a ``checkpoint``): per-chunk
latency and actions/s on one CPU thread, and success at each sampler setting.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embodied.core.registry import make_env, resolve_tasks
from embodied.runtime.evaluate import write_json

log = logging.getLogger("embodied.bench")


@dataclass
class BenchConfig:
    """Schema of ``configs/bench.yaml``."""

    suite: str = "manipulation"
    tasks: list[str] = field(default_factory=list)
    sim_steps: int = 3000  # per task
    render_sizes: list[int] = field(default_factory=lambda: [64, 128, 224])
    render_frames: int = 200
    sections: list[str] = field(default_factory=lambda: ["sim", "render"])  # + "policy"
    seed: int = 0
    # policy section (see embodied/commands/bench_policy.py)
    policy_families: list[str] = field(default_factory=lambda: ["flow", "diffusion", "mlp"])
    policy_checkpoints: dict[str, str] = field(default_factory=dict)  # family -> checkpoint; else trained
    policy_dataset: str = ""
    policy_demos: int = 100
    policy_train_steps: int = 4000
    policy_eval_episodes: int = 20

    def __post_init__(self) -> None:
        bad = [s for s in self.sections if s not in ("sim", "render", "policy")]
        if bad:
            raise ValueError(f"sections may contain 'sim', 'render', 'policy'; got {bad}")
        if self.sim_steps < 10:
            raise ValueError(f"sim_steps must be >= 10, got {self.sim_steps}")


def bench_sim(task: str, steps: int, seed: int = 0) -> dict[str, float]:
    """Env steps/s (state obs, random actions) vs. raw ``mj_step`` replaying the same controls.

    The raw loop starts from the same states and applies the controls the env wrote, with
    the same number of substeps, so both simulate the same trajectories. Resets are timed
    in neither.
    """
    import mujoco

    env = make_env(task)
    u = env.unwrapped
    rng = np.random.default_rng(seed)
    actions = rng.uniform(-1, 1, (steps,) + env.action_space.shape).astype(np.float32)
    env.reset(seed=seed)
    segments: list[tuple[tuple[np.ndarray, np.ndarray], list[np.ndarray]]] = []
    start = (u.data.qpos.copy(), u.data.qvel.copy())
    ctrls: list[np.ndarray] = []
    elapsed, k = 0.0, 0
    while k < steps:
        t = time.perf_counter()
        _, _, term, trunc, _ = env.step(actions[k])
        elapsed += time.perf_counter() - t
        ctrls.append(u.data.ctrl.copy())
        k += 1
        if term or trunc:
            segments.append((start, ctrls))
            env.reset(seed=seed + k)
            start, ctrls = (u.data.qpos.copy(), u.data.qvel.copy()), []
    segments.append((start, ctrls))
    env_rate = steps / elapsed
    m, d = u.model, mujoco.MjData(u.model)
    raw = 0.0
    for (qpos, qvel), seg in segments:
        d.qpos[:], d.qvel[:] = qpos, qvel
        mujoco.mj_forward(m, d)
        t = time.perf_counter()
        for c in seg:
            d.ctrl[:] = c
            mujoco.mj_step(m, d, nstep=u.n_substeps)
        raw += time.perf_counter() - t
    raw_rate = steps / raw
    env.close()
    return {"env_steps_per_s": env_rate, "raw_mj_step_loop_per_s": raw_rate, "ratio": env_rate / raw_rate,
            "substeps": u.n_substeps}


def bench_render(task: str, sizes: list[int], frames: int, seed: int = 0) -> dict[str, float]:
    out = {}
    for size in sizes:
        env = make_env(task, obs_mode="pixels", image_size=size)
        env.reset(seed=seed)
        u = env.unwrapped
        cam = u.cameras[0]
        u._render(cam, size)
        t = time.perf_counter()
        for _ in range(frames):
            u._render(cam, size)
        out[f"{size}px_fps"] = frames / (time.perf_counter() - t)
        env.close()
    return out


def bench(cfg: BenchConfig, out: Path) -> dict[str, Any]:
    """Run the asked sections, write ``metrics.json`` in ``out``."""
    import sim.render

    tasks = resolve_tasks(cfg.suite, cfg.tasks)
    metrics: dict[str, Any] = {"suite": cfg.suite, "gl_backend": sim.render.configure_gl()}
    if "sim" in cfg.sections:
        per = {t: bench_sim(t, cfg.sim_steps, cfg.seed) for t in tasks}
        metrics["sim"] = {"per_task": per,
                          "mean_env_steps_per_s": float(np.mean([p["env_steps_per_s"] for p in per.values()])),
                          "mean_raw_steps_per_s": float(np.mean([p["raw_mj_step_loop_per_s"] for p in per.values()])),
                          "mean_ratio": float(np.mean([p["ratio"] for p in per.values()]))}
        for t, p in per.items():
            log.info("sim %-16s env %7.0f steps/s  raw mj_step x%d %7.0f /s  ratio %.2f", t, p["env_steps_per_s"],
                     p["substeps"], p["raw_mj_step_loop_per_s"], p["ratio"])
        log.info("sim mean ratio env/raw = %.2f", metrics["sim"]["mean_ratio"])
    if "render" in cfg.sections:
        metrics["render"] = bench_render(tasks[0], list(cfg.render_sizes), cfg.render_frames, cfg.seed)
        log.info("render (%s, one camera, %s): %s", tasks[0], metrics["gl_backend"],
                 ", ".join(f"{k} {v:.0f}" for k, v in metrics["render"].items()))
    if "policy" in cfg.sections:
        from embodied.runtime.bench_policy import bench_policies

        metrics["policy"] = bench_policies(cfg, tasks, out)
    write_json(out / "metrics.json", metrics)
    return metrics
