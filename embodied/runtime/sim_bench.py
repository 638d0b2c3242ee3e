"""The job of ``embodied bench``: a suite's simulation, rendering and expert figures, each against a
baseline timed in the same process (the policy section is ``embodied.runtime.policy_bench``).

    embodied bench suite=manipulation                      # sim + render (the default sections)
    embodied bench suite=metaworld-mt10 sections=[sim,experts]
    embodied bench sections=[policy]                       # see embodied.runtime.policy_bench

Sections:
    ``sim``: env steps/s (state observations, random actions) against a bare
        ``mujoco.mj_step`` loop that replays the same episodes on the same model
        (``n_substeps`` physics steps per control step, the inputs the env wrote), so the
        ratio is what the env adds on top of the physics. For an adapter (an env whose
        ``native_env`` is set, e.g. Meta-World) also the suite's own env stepped directly
        with the same actions.
    ``render``: ``env.render()`` frames/s at each size against a ``mujoco.Renderer`` with
        MuJoCo's default visual settings on the same scene.
    ``experts``: the scripted expert's success over seeds through the env; for an adapter
        also the suite's own expert on the suite's own env, on the same layouts (paired)
        and on the suite's benchmark layouts (Meta-World's MT1).
    ``policy``: per-chunk latency, actions/s and success per sampler setting.

Everything uses only the env protocol (``embodied.core.env``). ``metrics.json`` holds the
figures per task and their means.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import sim  # noqa: F401  (chooses the headless GL backend before mujoco is imported)
from embodied.core.registry import make_env, resolve_tasks
from embodied.runtime.evaluate import write_json

log = logging.getLogger("embodied.bench")

SECTIONS = ("sim", "render", "experts", "policy", "train_step")
# The render baseline (MuJoCo's default visuals) can be an order of magnitude slower on a
# CPU, so it renders one frame for every this many of the env's.
DEFAULT_RENDER_SHARE = 10


@dataclass
class BenchConfig:
    """Schema of ``configs/bench.yaml``.

    Attributes:
        suite: suite (or task) to measure.
        tasks: tasks instead of the whole suite.
        sim_steps: control steps timed per task in ``sim`` (each baseline replays as many).
        render_sizes: square frame sides (pixels) of ``render``.
        render_frames: frames timed per size.
        sections: any of ``sim``, ``render``, ``experts``, ``policy``, ``train_step``.
        seed: first episode seed; episodes use ``seed``, ``seed + 1``, ...
        expert_episodes: episodes per task in ``experts``.
        expert_steps: step limit of an expert episode (0: the task's ``max_episode_steps``).
    """

    suite: str = "manipulation"
    tasks: list[str] = field(default_factory=list)
    sim_steps: int = 3000
    render_sizes: list[int] = field(default_factory=lambda: [64, 128, 224])
    render_frames: int = 200
    sections: list[str] = field(default_factory=lambda: ["sim", "render"])
    seed: int = 0
    expert_episodes: int = 20
    expert_steps: int = 0
    # policy section (see embodied/runtime/policy_bench.py)
    policy_families: list[str] = field(default_factory=lambda: ["flow", "diffusion", "mlp"])
    policy_checkpoints: dict[str, str] = field(default_factory=dict)  # family -> checkpoint; else trained
    policy_dataset: str = ""
    policy_demos: int = 100
    policy_train_steps: int = 4000
    policy_eval_episodes: int = 20
    train_step_steps: int = 200  # train_step section: steps timed per setting (policy_dataset / policy_demos give the data)
    train_step_compile: bool = False  # train_step section: also time the step with its torch.compile'd loss graph

    def __post_init__(self) -> None:
        bad = [s for s in self.sections if s not in SECTIONS]
        if bad or not self.sections:
            raise ValueError(f"sections must be a non-empty list of {', '.join(SECTIONS)}; got {self.sections}")
        if self.sim_steps < 10:
            raise ValueError(f"sim_steps must be >= 10, got {self.sim_steps}")
        if self.render_frames < 1:
            raise ValueError(f"render_frames must be >= 1, got {self.render_frames}")
        sizes = [s for s in self.render_sizes if not 8 <= int(s) <= 512]
        if sizes or not self.render_sizes:
            raise ValueError(f"render_sizes must be a non-empty list of sides in [8, 512] pixels, got "
                             f"{self.render_sizes}")
        if self.train_step_steps < 1:
            raise ValueError(f"train_step_steps must be >= 1, got {self.train_step_steps}")
        if self.expert_episodes < 1 or self.expert_steps < 0:
            raise ValueError(f"expert_episodes must be >= 1 and expert_steps >= 0 (0: the task's limit), got "
                             f"{self.expert_episodes} and {self.expert_steps}")


# --------------------------------------------------------------------- sim
def _state_size(spec: int, model: Any) -> int:
    import mujoco

    return int(mujoco.mj_stateSize(model, spec))


def bench_sim(task: str, steps: int, seed: int = 0) -> dict[str, Any]:
    """Env steps/s against a bare ``mj_step`` loop and, for adapters, the suite's own env.

    Episodes run back to back (``seed``, ``seed + 1``, ... at each end); resets are timed in
    none of the loops. After each episode the bare loop replays it on a scratch
    ``MjData`` of the same model: the start state, then per control step the inputs the env
    wrote (``mjSTATE_USER``: controls, mocap targets, applied forces), the solver's warm
    start the env's step began from, and ``mj_step(nstep=n_substeps)``.
    ``replay_max_abs_qpos_diff`` is how far the replay's final ``qpos`` ended from the env's
    (0 when the baseline simulated the very same episodes).

    Returns:
        ``env_steps_per_s``, ``raw_steps_per_s``, ``env_vs_raw`` (their ratio),
        ``substeps``, ``replay_max_abs_qpos_diff``; for adapters also
        ``native_steps_per_s`` and ``env_vs_native``.
    """
    import mujoco

    env = make_env(task)
    u = env.unwrapped
    m, d, nsub = u.model, u.data, int(u.n_substeps)
    actions = np.random.default_rng(seed).uniform(-1, 1, (steps,) + env.action_space.shape).astype(np.float32)
    full, user, warm = (mujoco.mjtState.mjSTATE_INTEGRATION, mujoco.mjtState.mjSTATE_USER,
                        mujoco.mjtState.mjSTATE_WARMSTART)
    scratch = mujoco.MjData(m)
    inputs = np.empty((steps, _state_size(user, m)))
    # The solver's warm start before each step: an env's own mj_forward after a step (Meta-World
    # calls one) updates it, and the replay is the very same episode only when it starts alike.
    warms = np.empty((steps, _state_size(warm, m)))
    episodes: list[tuple[int, int, int]] = []  # (seed, first step, end step)
    env.reset(seed=seed)  # warm-up, untimed: first calls allocate and fill caches
    env.step(actions[0])
    mujoco.mj_step(m, scratch, nstep=nsub)
    t_env = t_raw = 0.0
    worst = 0.0
    k = 0
    while k < steps:
        ep_seed, first = seed + len(episodes), k
        env.reset(seed=ep_seed)
        start = np.empty(_state_size(full, m))
        mujoco.mj_getState(m, d, start, full)
        while k < steps:
            mujoco.mj_getState(m, d, warms[k], warm)
            t = time.perf_counter()
            _, _, term, trunc, _ = env.step(actions[k])
            t_env += time.perf_counter() - t
            mujoco.mj_getState(m, d, inputs[k], user)
            k += 1
            if term or trunc:
                break
        episodes.append((ep_seed, first, k))
        # replayed now, while the model is the episode's (a reset may move bodies in it)
        t_raw += _replay(m, scratch, start, warms[first:k], inputs[first:k], nsub)
        worst = max(worst, float(np.abs(scratch.qpos - d.qpos).max(initial=0.0)))
    out: dict[str, Any] = {"env_steps_per_s": steps / t_env, "raw_steps_per_s": steps / t_raw,
                           "env_vs_raw": t_raw / t_env, "substeps": nsub, "replay_max_abs_qpos_diff": worst}
    if u.native_env is not None:
        t_native = 0.0
        for ep_seed, first, end in episodes:
            env.reset(seed=ep_seed)  # sets the native env's layout too
            t = time.perf_counter()
            for j in range(first, end):
                u.native_env.step(actions[j])
            t_native += time.perf_counter() - t
        out.update(native_steps_per_s=steps / t_native, env_vs_native=t_native / t_env)
    env.close()
    return out


def _replay(m: Any, d: Any, start: np.ndarray, warms: np.ndarray, inputs: np.ndarray, nsub: int) -> float:
    """Seconds a bare loop takes to replay one episode on ``d``: from ``start``, per control step
    set the warm start and the inputs, then ``mj_step(nstep=nsub)``."""
    import mujoco

    mujoco.mj_setState(m, d, start, mujoco.mjtState.mjSTATE_INTEGRATION)
    warm, user = mujoco.mjtState.mjSTATE_WARMSTART, mujoco.mjtState.mjSTATE_USER
    t = time.perf_counter()
    for w, u in zip(warms, inputs):
        mujoco.mj_setState(m, d, w, warm)
        mujoco.mj_setState(m, d, u, user)
        mujoco.mj_step(m, d, nstep=nsub)
    return time.perf_counter() - t


# ------------------------------------------------------------------ render
def bench_render(task: str, sizes: list[int], frames: int, seed: int = 0) -> dict[str, Any]:
    """``env.render()`` frames/s per size against MuJoCo's default ``mujoco.Renderer``.

    The baseline renders the same camera and scene from a copy of the model taken before
    the env applied its light visual settings (``sim.render.fast_visuals``), one frame
    after every ``DEFAULT_RENDER_SHARE`` of the env's, timed separately.

    Returns:
        Per size S: ``{S}px_fps``, ``{S}px_default_fps`` and ``{S}px_vs_default``.
    """
    import mujoco

    out: dict[str, Any] = {}
    for size in sizes:
        env = make_env(task, render_mode="rgb_array", render_size=size)
        env.reset(seed=seed)
        u = env.unwrapped
        default_model = copy.copy(u.model)  # MuJoCo's visual defaults: the env has not rendered yet
        default_model.vis.global_.offwidth = max(int(default_model.vis.global_.offwidth), size)
        default_model.vis.global_.offheight = max(int(default_model.vis.global_.offheight), size)
        camera = u.render_camera
        with mujoco.Renderer(default_model, size, size) as r:
            env.render()  # both GL contexts exist and have drawn once before timing
            r.update_scene(u.data, camera)
            r.render()
            # interleaved, so that both see the same load on the machine
            t_ours = t_default = 0.0
            n = 0
            for i in range(frames):
                t = time.perf_counter()
                env.render()
                t_ours += time.perf_counter() - t
                if i % DEFAULT_RENDER_SHARE == 0:
                    t = time.perf_counter()
                    r.update_scene(u.data, camera)
                    r.render()
                    t_default += time.perf_counter() - t
                    n += 1
        ours, default = frames / t_ours, n / t_default
        out.update({f"{size}px_fps": ours, f"{size}px_default_fps": default, f"{size}px_vs_default": ours / default})
        env.close()
    return out


# ----------------------------------------------------------------- experts
def bench_experts(task: str, episodes: int, steps: int = 0, seed: int = 0) -> dict[str, Any]:
    """The scripted expert's success through the env over ``episodes`` seeds.

    For an adapter, also the suite's own expert on the suite's own env: on the layout of
    each of those episodes (``native_expert_success``, paired) and on the suite's
    benchmark layouts (``native_benchmark_success``). An episode succeeds when
    ``info["success"]`` is set within ``steps`` steps (0: the task's limit).

    Returns:
        ``success_rate``; for adapters also ``native_same_layouts_success_rate``,
        ``native_benchmark_success_rate`` and ``episodes_agree`` (paired episodes with
        the same outcome).
    """
    env = make_env(task, **({"max_episode_steps": steps} if steps else {}))
    u = env.unwrapped
    steps = steps or u.max_episode_steps
    wins, paired = [], []
    for i in range(episodes):
        env.reset(seed=seed + i)
        if u.native_env is not None:
            paired.append(u.native_expert_success(steps))
        won = False
        for _ in range(steps):
            _, _, term, trunc, info = env.step(u.expert_action())
            won = won or bool(info["success"])
            if term or trunc:
                break
        wins.append(won)
    out: dict[str, Any] = {"success_rate": float(np.mean(wins)), "episodes": episodes, "steps": steps}
    if u.native_env is not None:
        bench_layouts = u.native_benchmark_success(episodes, steps, seed)
        out.update(native_same_layouts_success_rate=float(np.mean(paired)),
                   native_benchmark_success_rate=float(np.mean(bench_layouts)),
                   episodes_agree=int(sum(a == b for a, b in zip(wins, paired))))
    env.close()
    return out


# -------------------------------------------------------------------- main
def _means(per: dict[str, dict[str, Any]], keys: tuple[str, ...]) -> dict[str, float]:
    """``mean_<key>`` over tasks of each key that every task has."""
    return {f"mean_{k}": float(np.mean([p[k] for p in per.values()])) for k in keys
            if all(k in p for p in per.values())}


def bench(cfg: BenchConfig, out: Path) -> dict[str, Any]:
    """Run the asked sections, log the figures, write ``metrics.json`` in ``out``."""
    tasks = resolve_tasks(cfg.suite, cfg.tasks)
    metrics: dict[str, Any] = {"suite": cfg.suite, "tasks": tasks, "gl_backend": sim.render.configure_gl()}
    if "sim" in cfg.sections:
        per = {t: bench_sim(t, cfg.sim_steps, cfg.seed) for t in tasks}
        metrics["sim"] = {"per_task": per, **_means(per, ("env_steps_per_s", "raw_steps_per_s", "env_vs_raw",
                                                         "native_steps_per_s", "env_vs_native")),
                          "max_replay_abs_qpos_diff": max(p["replay_max_abs_qpos_diff"] for p in per.values())}
        for t, p in per.items():
            native = (f"  Meta-World's env {p['native_steps_per_s']:7.0f}/s: x{p['env_vs_native']:.2f}"
                      if "native_steps_per_s" in p else "")
            log.info("sim %-24s env %7.0f steps/s  raw mj_step x%d %7.0f/s: x%.2f%s", t, p["env_steps_per_s"],
                     p["substeps"], p["raw_steps_per_s"], p["env_vs_raw"], native)
        s = metrics["sim"]
        log.info("sim mean: env/raw x%.2f%s", s["mean_env_vs_raw"],
                 f", env/native x{s['mean_env_vs_native']:.2f}" if "mean_env_vs_native" in s else "")
    if "render" in cfg.sections:
        metrics["render"] = bench_render(tasks[0], list(cfg.render_sizes), cfg.render_frames, cfg.seed)
        r = metrics["render"]
        log.info("render %s (one camera, %s): %s", tasks[0], metrics["gl_backend"], ", ".join(
            f"{s}px {r[f'{s}px_fps']:.0f} fps (MuJoCo defaults {r[f'{s}px_default_fps']:.0f}: "
            f"x{r[f'{s}px_vs_default']:.2f})" for s in cfg.render_sizes))
    if "experts" in cfg.sections:
        per = {t: bench_experts(t, cfg.expert_episodes, cfg.expert_steps, cfg.seed) for t in tasks}
        metrics["experts"] = {"per_task": per, **_means(per, ("success_rate", "native_same_layouts_success_rate",
                                                             "native_benchmark_success_rate"))}
        for t, p in per.items():
            native = (f"  Meta-World's own: same layouts {p['native_same_layouts_success_rate']:.2f}, "
                      f"MT1 layouts {p['native_benchmark_success_rate']:.2f} ({p['episodes_agree']}/{p['episodes']} "
                      f"episodes agree)" if "native_benchmark_success_rate" in p else "")
            log.info("expert %-24s success %.2f%s", t, p["success_rate"], native)
    if "policy" in cfg.sections:
        from embodied.runtime.policy_bench import bench_policies

        metrics["policy"] = bench_policies(cfg, tasks, out)
    if "train_step" in cfg.sections:
        from embodied.runtime.policy_bench import bench_train_step

        metrics["train_step"] = bench_train_step(cfg, tasks, out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "metrics.json", metrics)
    return metrics
