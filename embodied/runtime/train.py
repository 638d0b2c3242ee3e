"""``embodied train``: demonstrations -> a language-conditioned policy -> evaluation.

    embodied train                                   # manipulation suite, state obs, flow policy
    embodied train suite=navigation policy=diffusion
    embodied train obs_mode=pixels                   # side camera, 64 px, the pixel recipe

Steps: (1) collect scripted demonstrations into ``dataset`` unless it already holds
enough (collection resumes); (2) train with AdamW + cosine schedule + EMA, logging to
TensorBoard (``tb/``) with a progress bar, evaluating every ``eval_every`` steps and
saving ``checkpoint/`` (policy) + ``trainer_state.pt`` (optimiser, step) every
``save_every`` steps, and keeping a copy of the policy in ``checkpoints/step_XXXXXXX/``
every ``snapshot_every`` steps and at the last step (``embodied eval checkpoint=RUN/checkpoints``
draws success vs training step from them); (3) evaluate on training and held-out paraphrases, writing
``metrics.json``, ``report.md``, ``success.png``, ``training_curve.png`` and videos; with state
observations, collection and the final evaluation run in one worker process per CPU core
(``workers``; evaluation workers load ``checkpoint/``), with the same results as one process.
Rerunning with the same ``hydra.run.dir`` resumes from the last checkpoint.

The recipe is Hydra's (``configs/train.yaml``): this schema's defaults (the generic recipe),
then ``configs/recipe/suite/<suite>.yaml``, ``recipe/obs_mode/<obs_mode>.yaml`` (the pixel
recipe), ``recipe/suite_obs_mode/<suite>_<obs_mode>.yaml`` and ``recipe/policy/<family>.yaml``,
each over the ones before, and ``key=value`` over all of them. ``embodied train ... --cfg job``
prints the result and ``train`` runs exactly that. A ``TrainConfig(...)`` built in Python has
the schema's defaults only; ``embodied.commands.app.compose("train", TrainConfig, ["suite=..."])``
gives a suite's recipe.

Pixel policies: pixel datasets record the full state beside the images
(``privileged_state``) and the policy learns to predict it from its image keypoints, an
auxiliary loss (``policy.aux_state_weight``); the policy never reads that state.

Instructions are re-sampled during training: each window gets a random *training*
paraphrase of its task, filled with the episode's parameters (held-out ones are never
seen), so the policy learns what the words mean rather than one sentence per task.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embodied.core.registry import get_task, make_env, resolve_tasks
from embodied.runtime.evaluate import write_json
from policies import save_policy

log = logging.getLogger("embodied.train")


@dataclass
class TrainConfig:
    """Schema of ``configs/train.yaml``; its defaults are the generic recipe (see the module docstring).

    ``policy``: the policy's fields as a dict with the family's ``name`` (Hydra's ``policy``
    group: ``policy=flow | diffusion | mlp``, then ``policy.<field>=value``); fields left out
    take the family config's defaults (``policies/<name>/config.py``).
    """

    suite: str = "manipulation"
    tasks: list[str] = field(default_factory=list)  # overrides suite when given
    policy: dict[str, Any] = field(default_factory=lambda: {"name": "flow"})
    obs_mode: str = "state"  # "state" or "pixels"
    image_size: int = 64
    cameras: list[str] = field(default_factory=list)
    dataset: str = ""  # default data/<suite>-<obs_mode>; collected when it holds too few episodes
    demos: int = 400  # demonstrations per task
    demo_noise: float = 0.1  # noise on executed expert actions while collecting (recovery data)
    steps: int = 16000  # gradient steps
    batch_size: int = 128
    # ground wordings the policy was not trained on in the scene (policies.common.grounding);
    # policy.ground_instructions follows it and the index is stored in the checkpoint
    ground_instructions: bool = False
    eval_every: int = 0  # steps between periodic evaluations (0: final only)
    eval_episodes_periodic: int = 10  # per task, training paraphrases
    eval_episodes: int = 50  # final evaluation, per task and split
    eval_seed: int = 100_000
    save_every: int = 1000
    snapshot_every: int = 4000  # keep checkpoints/step_XXXXXXX/ (policy only) every N steps and at the end; 0: never
    num_envs: int = 10
    # worker processes for collection and the final evaluation (each evaluation worker loads
    # checkpoint/). 0: one per CPU core for state observations and >= 100 episodes, else this
    # process (a worker costs a few seconds to start; pixel environments already run in workers)
    workers: int = 0
    videos: int = 2
    seed: int = 0
    device: str = "auto"
    threads: int = 0  # torch CPU threads (0: the cores not busy now; more threads than free cores stalls torch)
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("demos", "steps", "batch_size", "eval_episodes", "save_every", "num_envs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "snapshot_every", "workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.demo_noise <= 1.0:
            raise ValueError(f"demo_noise must be in [0, 1], got {self.demo_noise}")
        if self.obs_mode not in ("state", "pixels"):
            raise ValueError(f"obs_mode must be 'state' or 'pixels', got {self.obs_mode!r}")
        if "name" not in self.policy:
            raise ValueError("policy needs a name: policy=flow | diffusion | mlp")
        if self.policy["name"] == "expert":
            raise ValueError("policy=expert has nothing to train: use policy=flow, diffusion or mlp")
        # what the policy observes and whether it grounds follow the run's settings, unless given
        self.policy = {**self.policy, "obs_mode": self.policy.get("obs_mode", self.obs_mode),
                       "ground_instructions": self.policy.get("ground_instructions", self.ground_instructions)}
        if self.policy["obs_mode"] != self.obs_mode:
            raise ValueError(f"policy.obs_mode={self.policy['obs_mode']!r} differs from obs_mode={self.obs_mode!r}: "
                             "set obs_mode (the policy observes what the run observes)")
        from policies import make_config

        make_config(self.policy["name"], self.policy)  # refuses a bad field, naming it


class Batcher:
    """Random training windows as policy batches (numpy; see ``embodied.runtime.data.sample_windows``)."""

    def __init__(self, ds: Any, tasks: list[str], n_obs_steps: int, horizon: int, pixels: bool, seed: int,
                 privileged: bool = False):
        from embodied.runtime.data import make_windows

        feats = ("state", "action") + (("image",) if pixels else ()) + (("privileged_state",) if privileged else ())
        self.arrays, self.ends = ds.load_arrays(features=feats, tasks=tasks)
        metas = [m for m in ds.episodes_meta if m.get("task") in tasks]
        self.task_of = [m["task"] for m in metas]
        self.params = [m.get("params") or {} for m in metas]
        self.templates = {t: get_task(t).train_instructions for t in set(self.task_of)}
        self.windows = make_windows(self.ends, horizon)
        self.to, self.h = n_obs_steps, horizon
        self.rng = np.random.default_rng(seed)
        self._cache: dict[tuple[str, int, int], str] = {}

    def instruction(self, ep: int, k: int) -> str:
        key = (self.task_of[ep], ep, k)
        if key not in self._cache:
            self._cache[key] = self.templates[self.task_of[ep]][k].format(**self.params[ep])
        return self._cache[key]

    def instructions_by_task(self) -> dict[str, list[str]]:
        """Task -> every instruction its batches can hold (each episode's parameters x its task's
        templates; episodes with the same task and parameters are rendered once)."""
        seen = {(self.task_of[e], json.dumps(self.params[e], sort_keys=True, default=str)): e
                for e in range(len(self.task_of))}
        out: dict[str, set[str]] = {}
        for e in seen.values():
            out.setdefault(self.task_of[e], set()).update(
                self.instruction(e, k) for k in range(len(self.templates[self.task_of[e]])))
        return {t: sorted(v) for t, v in out.items()}

    def all_instructions(self) -> list[str]:
        """Every instruction a batch can hold."""
        return sorted({s for ss in self.instructions_by_task().values() for s in ss})

    def grounding(self, k: int) -> Any:
        """The index that grounds unfamiliar instructions (``policies.common.grounding``)."""
        from policies.common.grounding import InstructionGrounding

        starts = np.concatenate([[0], self.ends[:-1]]).astype(np.int64)
        return InstructionGrounding.from_demonstrations(self.instructions_by_task(), self.arrays["state"][starts],
                                                        self.task_of, self.arrays["state"], k)

    def sample(self, batch_size: int) -> dict[str, Any]:
        from embodied.runtime.data import sample_windows

        idx = self.windows[self.rng.integers(len(self.windows), size=batch_size)]
        batch = sample_windows(self.arrays, self.ends, idx, self.to, self.h)
        eps = idx[:, 0]
        batch["instruction"] = [self.instruction(int(e), int(self.rng.integers(len(self.templates[self.task_of[e]]))))
                                for e in eps]
        batch["task"] = [self.task_of[int(e)] for e in eps]
        return batch


def free_cores(window_s: float = 0.5) -> int:
    """CPU cores not busy now (CPU use over ``window_s`` seconds, from /proc/stat), at least one.

    On 2 cores, training alone ran 1.5x faster with 2 torch threads than with 1; with another
    job on the machine, more threads than free cores stalled torch (up to 50x). Without
    /proc/stat (not Linux): half the cores.
    """
    n = os.cpu_count() or 1

    def times() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + (v[4] if len(v) > 4 else 0)  # all, idle + iowait

    try:
        (t0, i0), _, (t1, i1) = times(), time.sleep(window_s), times()
    except (OSError, ValueError, IndexError):
        return max(1, n // 2)
    busy = n * (1 - (i1 - i0) / max(t1 - t0, 1))
    return max(1, n - int(busy + 0.3))  # a core counts as busy from 70% use


def _workers(cfg: TrainConfig, episodes: int) -> int:
    """Worker processes for ``episodes`` episodes (``cfg.workers``, or the automatic choice)."""
    if cfg.workers:
        return cfg.workers
    return (os.cpu_count() or 1) if cfg.obs_mode == "state" and episodes >= 100 else 1


def _ensure_dataset(cfg: TrainConfig, tasks: list[str]) -> Any:
    from embodied.runtime.collect import collect
    from embodied.runtime.data import Dataset

    path = Path(cfg.dataset or f"data/{cfg.suite if not cfg.tasks else '-'.join(cfg.tasks)}-{cfg.obs_mode}")
    have: dict[str, int] = {}
    if (path / "meta.json").exists():
        for m in Dataset.open(path).episodes_meta:
            have[m.get("task")] = have.get(m.get("task"), 0) + 1
    if any(have.get(t, 0) < cfg.demos for t in tasks):
        log.info("collecting demonstrations into %s (%d per task)", path, cfg.demos)
        missing = sum(max(0, cfg.demos - have.get(t, 0)) for t in tasks)
        collect(tasks, path, cfg.demos, cfg.obs_mode, cfg.image_size, cfg.cameras, seed=cfg.seed,
                action_noise=cfg.demo_noise, progress=cfg.progress, suite=cfg.suite, workers=_workers(cfg, missing))
    ds = Dataset.open(path)
    log.info("dataset %s: %d episodes, %d steps", path, len(ds), sum(ds.lengths))
    return ds


def _check_dataset(ds: Any, obs_spec: Any, action_spec: Any) -> None:
    """Refuse demonstrations recorded with other observation/action shapes than the task's now."""
    for name, want in (("state", obs_spec.state_dim), ("action", action_spec.dim)):
        have = tuple(ds.features[name]["shape"])
        if have != (want,):
            raise ValueError(f"dataset {ds.root} holds {name} of shape {have} but the task's {name} is ({want},) "
                             f"(recorded with an older version of the task?): give another dataset=PATH, or "
                             f"move that folder away so the demonstrations are collected anew")
    recorded = (ds.info or {}).get("observation_spec") or {}
    cams, size = tuple(recorded.get("cameras", ())), int(recorded.get("image_size", 0))
    if obs_spec.cameras and (cams, size) != (tuple(obs_spec.cameras), obs_spec.image_size):
        raise ValueError(f"dataset {ds.root} holds images of cameras {list(cams)} at {size} px but this run "
                         f"observes {list(obs_spec.cameras)} at {obs_spec.image_size} px: pass cameras={list(cams)} "
                         f"image_size={size}, or give another dataset=PATH for these settings")


def _with_aux_state(pcfg: Any, ds: Any) -> Any:
    """Turn on the auxiliary state loss of a pixel policy when the dataset records the full state."""
    import dataclasses

    if pcfg.obs_mode != "pixels" or not pcfg.aux_state_weight:
        return pcfg
    if "privileged_state" not in ds.features:
        log.warning("dataset %s has no privileged_state (recorded before it was kept): the pixel policy "
                    "trains without the auxiliary state loss, which learns ~2x slower; collect a new dataset "
                    "(dataset=PATH) to use it", ds.root)
        return pcfg
    return dataclasses.replace(pcfg, aux_state_dim=int(ds.features["privileged_state"]["shape"][0]))


def _save(policy: Any, opt: Any, sched: Any, step: int, curve: list[Any], out: Path) -> None:
    """Checkpoint atomically: write into a temp dir, then swap it in."""
    import torch

    tmp, final = out / "checkpoint.tmp", out / "checkpoint"
    shutil.rmtree(tmp, ignore_errors=True)
    save_policy(policy, str(tmp))
    torch.save({"step": step, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "curve": curve},
               tmp / "trainer_state.pt")
    old = out / "checkpoint.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def _snapshot(policy: Any, step: int, out: Path) -> None:
    """Keep the policy at ``step`` (weights + config, no optimiser) in ``checkpoints/step_XXXXXXX/``.

    Written atomically (temp dir, then rename); an existing snapshot is left alone, so a
    resumed run does not overwrite the ones it already has.
    """
    final = out / "checkpoints" / f"step_{step:07d}"
    if final.exists():
        return
    tmp = final.parent / f".{final.name}.tmp"  # not matched by step_*
    shutil.rmtree(tmp, ignore_errors=True)
    save_policy(policy, str(tmp))
    os.replace(tmp, final)


def plot_curve(path: Path, losses: list[tuple[int, float]], curve: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    if losses:
        s, v = zip(*losses)
        ax.plot(s, v, color="tab:blue", lw=1, label="training loss")
        ax.set_yscale("log")
    ax.set_xlabel("gradient step")
    ax.set_ylabel("loss", color="tab:blue")
    if curve:
        ax2 = ax.twinx()
        ax2.plot([c["step"] for c in curve], [c["success_rate"] for c in curve], "o-", color="tab:green",
                 label="success (training paraphrases)")
        ax2.set_ylim(0, 1.05)
        ax2.set_ylabel("success rate", color="tab:green")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def train(cfg: TrainConfig, out: Path) -> dict[str, Any]:
    import torch
    from tqdm.auto import tqdm

    from embodied.runtime.checkpoints import env_kwargs
    from embodied.runtime.evaluate import evaluate, save_videos, write_report
    from policies import load_policy, make_config, make_policy

    t_start = time.time()
    torch.set_num_threads(cfg.threads or free_cores())
    torch.manual_seed(cfg.seed)
    tasks = resolve_tasks(cfg.suite, cfg.tasks)
    name = cfg.policy["name"]
    pcfg = make_config(name, {**cfg.policy, "obs_mode": cfg.obs_mode})  # validates before any work
    kw = env_kwargs(cfg.obs_mode, cfg.image_size, cfg.cameras)
    probe = make_env(tasks[0], **kw)
    obs_spec, action_spec = probe.unwrapped.observation_spec, probe.unwrapped.action_spec
    probe.close()

    ds = _ensure_dataset(cfg, tasks)
    _check_dataset(ds, obs_spec, action_spec)
    pcfg = _with_aux_state(pcfg, ds)
    t_data = time.time() - t_start
    ckpt = out / "checkpoint"
    curve: list[dict[str, Any]] = []
    start_step = 0
    if (ckpt / "trainer_state.pt").exists():
        policy = load_policy(str(ckpt), device=cfg.device)
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        start_step, curve = int(state["step"]), list(state["curve"])
        log.info("resuming from %s at step %d", ckpt, start_step)
    else:
        stats = ds.stats
        policy = make_policy(name, pcfg, obs_spec, action_spec, stats, task_names=tasks, device=cfg.device)
    opt = policy.make_optimizer()
    sched = policy.make_scheduler(opt, cfg.steps)
    if start_step:
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
    n_params = sum(p.numel() for p in policy.model.parameters())
    log.info("%s policy, %.2fM parameters, device %s", name, n_params / 1e6, policy.device)

    batcher = Batcher(ds, tasks, policy.n_obs_steps, policy.horizon, cfg.obs_mode == "pixels", cfg.seed + start_step,
                      privileged=policy.config.aux_state_dim > 0 and "privileged_state" in ds.features)
    policy.prepare_instructions(batcher.all_instructions())  # embed them all at once, not step by step
    deployed: Any = policy  # what is saved and evaluated: the network, with its grounding wrapper
    if policy.config.ground_instructions:
        from policies.common.grounding import GroundedPolicy

        deployed = GroundedPolicy(policy, batcher.grounding(policy.config.ground_neighbours))
    from torch.utils.tensorboard import SummaryWriter

    tb = SummaryWriter(str(out / "tb"))
    losses: list[tuple[int, float]] = []
    vector = "async" if cfg.obs_mode == "pixels" else "sync"

    def periodic_eval(step: int) -> None:
        policy.eval()
        m, _ = evaluate(deployed, tasks, cfg.eval_episodes_periodic, ("train",), cfg.eval_seed + 50_000,
                        cfg.num_envs, vector, kw, progress=False)
        policy.train()
        curve.append({"step": step, "success_rate": m["success_rate"]})
        tb.add_scalar("eval/success_rate", m["success_rate"], step)
        log.info("step %d: success %.3f", step, m["success_rate"])

    policy.train()
    t_train = time.time()
    bar = tqdm(range(start_step, cfg.steps), initial=start_step, total=cfg.steps, desc=f"train {name}",
               disable=not cfg.progress)
    step = start_step
    try:
        for step in bar:
            batch = batcher.sample(cfg.batch_size)
            loss, logs = policy.compute_loss(batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
            opt.step()
            sched.step()
            policy.ema_update()
            if step % 25 == 0:
                losses.append((step, logs["loss"]))
                tb.add_scalar("train/loss", logs["loss"], step)
                tb.add_scalar("train/lr", sched.get_last_lr()[0], step)
                if "aux_state_loss" in logs:
                    tb.add_scalar("train/aux_state_loss", logs["aux_state_loss"], step)
                    tb.add_scalar("train/action_loss", logs["action_loss"], step)
                bar.set_postfix(loss=f"{logs['loss']:.4f}")
            if not cfg.progress and (step + 1) % max(1, cfg.steps // 10) == 0:
                log.info("step %d/%d loss %.4f%s (%.0f s)", step + 1, cfg.steps, logs["loss"],
                         f" (aux state {logs['aux_state_loss']:.4f})" if "aux_state_loss" in logs else "",
                         time.time() - t_train)
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                periodic_eval(step + 1)
            if cfg.snapshot_every and (step + 1) % cfg.snapshot_every == 0:
                _snapshot(deployed, step + 1, out)  # before _save: a crash in between still resumes to it
            if (step + 1) % cfg.save_every == 0:
                _save(deployed, opt, sched, step + 1, curve, out)
        step = cfg.steps
    except KeyboardInterrupt:
        log.warning("interrupted at step %d: saving a checkpoint to resume from", step)
        _save(deployed, opt, sched, step, curve, out)
        raise
    finally:
        bar.close()
    train_time = time.time() - t_train
    samples_per_s = (cfg.steps - start_step) * cfg.batch_size / max(train_time, 1e-9)
    if cfg.snapshot_every:
        _snapshot(deployed, cfg.steps, out)
    _save(deployed, opt, sched, cfg.steps, curve, out)

    policy.eval()
    workers = _workers(cfg, len(tasks) * 2 * cfg.eval_episodes)
    if workers > 1:
        from embodied.runtime.distributed import PolicySource, evaluate_sharded

        metrics, results = evaluate_sharded(PolicySource(str(ckpt), cfg.device), tasks, cfg.eval_episodes,
                                            ("train", "heldout"), cfg.eval_seed, cfg.num_envs, vector, kw,
                                            videos=cfg.videos, progress=cfg.progress, workers=workers)
    else:
        metrics, results = evaluate(deployed, tasks, cfg.eval_episodes, ("train", "heldout"), cfg.eval_seed,
                                    cfg.num_envs, vector, kw, videos=cfg.videos, progress=cfg.progress)
    curve.append({"step": cfg.steps, "success_rate": metrics["success_rate"]})
    videos = save_videos(out, results) if cfg.videos else {}
    metrics.update({
        "policy": name, "suite": cfg.suite, "obs_mode": cfg.obs_mode, "steps": cfg.steps,
        "batch_size": cfg.batch_size, "demos": cfg.demos, "demo_noise": cfg.demo_noise,
        "checkpoint": str(ckpt), "videos": videos, "success_curve": curve,
        "final_loss": losses[-1][1] if losses else None, "parameters": n_params,
        "train_samples_per_s": samples_per_s, "data_time_s": t_data, "train_time_s": train_time,
        "eval_time_s": metrics["wall_time_s"], "wall_time_s": time.time() - t_start,
    })
    write_json(out / "metrics.json", metrics)
    write_report(out, metrics, f"{name} policy on {cfg.suite} ({cfg.obs_mode})", videos)
    plot_curve(out / "training_curve.png", losses, curve)
    tb.add_scalar("eval/final_success_rate", metrics["success_rate"], cfg.steps)
    tb.close()
    return metrics
