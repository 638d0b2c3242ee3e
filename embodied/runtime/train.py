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
Rerunning with the same ``hydra.run.dir`` resumes from the last checkpoint, and only when the
rerun is the same run: every setting of ``TrainConfig`` but those in ``RESUMABLE`` (how long to
train, and how to evaluate, save, log and run it) defines the run and is recorded in
``checkpoint/train_run.json``; a rerun that changes one is refused with each difference named
(give a new ``hydra.run.dir``, or ``restart=true`` to move the old run aside, to ``RUN.old-<k>``,
and start over: nothing recorded is deleted). The dataset must hold the episodes the run trained on. A
rerun never goes back: ``steps`` below the steps done is refused, and a finished run rerun with
the same ``steps`` says so and does nothing (it evaluates when its final evaluation is missing).
Snapshots are labelled with the step their weights come from.

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

Under torchrun (``torchrun --nproc_per_node=N -m embodied.cli train ...``) the processes split
the global ``batch_size`` and average their gradients; rank 0 alone collects, logs, evaluates
and writes (``embodied.runtime.ddp``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from embodied.core.registry import get_task, make_env, resolve_tasks
from embodied.runtime import ddp
from embodied.runtime.ddp import BACKENDS
from embodied.runtime.evaluate import write_json
from embodied.runtime.stream import DEFAULT_MEMORY_GB
from policies import save_policy

log = logging.getLogger("embodied.train")

# Settings a rerun into the same run folder may change: how long to train, and how to evaluate,
# save, log and run it. Every other field of TrainConfig defines the run and must match on resume.
RESUMABLE = frozenset({"steps", "eval_every", "eval_episodes_periodic", "eval_episodes", "eval_seed", "save_every",
                       "snapshot_every", "num_envs", "workers", "videos", "device", "threads", "progress",
                       "on_corrupt", "restart", "stream", "stream_memory_gb", "ddp_backend", "compile"})
PRECISIONS = ("fp32", "bf16")
RUN_RECORD = "train_run.json"  # in checkpoint/: the settings that define the run, its data and its step
DERIVED_POLICY_FIELDS = ("aux_state_dim",)  # set by train from the dataset, not by the user


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
    # default data/<suite>-<obs_mode>; collected when it holds too few episodes. A LeRobotDataset v3 folder is
    # imported once into RUN/lerobot-import/ and trained from (embodied.runtime.lerobot)
    dataset: str = ""
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
    # checkpoint/). 0: one per CPU core for >= 100 episodes, else this process (a worker costs a
    # few seconds to start)
    workers: int = 0
    videos: int = 2
    seed: int = 0
    device: str = "auto"
    threads: int = 0  # torch CPU threads (0: OMP_NUM_THREADS if set, else the cores not busy now; more threads than free cores stalls torch)
    progress: bool = True
    # a corrupt episode file in the dataset: raise (name it), skip it, or quarantine it (move it to
    # DATASET/quarantine/); as `embodied collect on_corrupt=...`
    on_corrupt: str = "raise"
    # read training windows from the episode files batch by batch instead of loading the dataset into memory
    # (embodied.runtime.stream): true, false, or auto (stream when the arrays trained on would take more than
    # stream_memory_gb). The batches are the same either way
    stream: str = "auto"
    stream_memory_gb: float = DEFAULT_MEMORY_GB
    # start over in this run folder: the run already there is moved aside (to RUN.old-<k>), not deleted
    restart: bool = False
    # the forward pass's arithmetic: fp32, or bf16 (torch.autocast: matmuls in bfloat16, weights and optimiser in
    # fp32; on a CPU it needs bf16 instructions, AVX512-BF16 or AMX)
    precision: str = "fp32"
    # compile the training step's text head, observation encoder and loss as one graph with torch.compile
    # (inductor; needs a C++ compiler on a CPU). The first steps pay the compiling; the steps after it run
    # faster, and the numbers differ from eager ones in the last bits
    compile: bool = False
    # under torchrun (embodied.runtime.ddp): the process group's backend, auto (nccl on GPUs, else gloo), gloo or
    # nccl; batch_size is the global batch, split evenly over the processes
    ddp_backend: str = "auto"

    def __post_init__(self) -> None:
        from embodied.runtime.collect import check_image_args
        from embodied.runtime.data import ON_CORRUPT
        from embodied.runtime.eval_job import check_device
        from embodied.runtime.stream import check_memory_gb, stream_mode

        for name in ("demos", "steps", "batch_size", "eval_episodes", "eval_episodes_periodic", "save_every",
                     "num_envs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "snapshot_every", "workers", "eval_seed", "seed", "threads", "videos"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.demo_noise <= 1.0:
            raise ValueError(f"demo_noise must be in [0, 1], got {self.demo_noise}")
        if self.obs_mode not in ("state", "pixels"):
            raise ValueError(f"obs_mode must be 'state' or 'pixels', got {self.obs_mode!r}")
        check_image_args(self.obs_mode, self.image_size, self.cameras)
        if self.on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt must be one of {ON_CORRUPT}, got {self.on_corrupt!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        self.stream = stream_mode(self.stream)
        self.stream_memory_gb = check_memory_gb(self.stream_memory_gb)
        if self.stream != "auto" and self.stream_memory_gb != DEFAULT_MEMORY_GB:
            raise ValueError(f"stream_memory_gb={self.stream_memory_gb:g} has no effect with stream={self.stream}: "
                             "it is the budget stream=auto compares the training arrays with")
        check_device(self.device)
        if self.ddp_backend not in BACKENDS:
            raise ValueError(f"ddp_backend must be one of {BACKENDS}, got {self.ddp_backend!r}")
        resolve_tasks(self.suite, self.tasks)  # an unknown suite or task is named now, not after the data
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
        if self.policy["ground_instructions"] != self.ground_instructions:
            raise ValueError(f"policy.ground_instructions={self.policy['ground_instructions']!r} differs from "
                             f"ground_instructions={self.ground_instructions!r}: set ground_instructions (the policy "
                             "grounds when the run does, and the run records it)")
        from policies import make_config

        make_config(self.policy["name"], self.policy)  # refuses a bad field, naming it


class Batcher:
    """Random training windows as policy batches (numpy; see ``embodied.runtime.data.sample_windows``).

    The windows come from arrays in memory, or with ``stream`` from the episode files batch by batch,
    the next batch read by a background thread while this one trains (``embodied.runtime.stream``:
    "auto" streams when the arrays would take more than ``memory_gb``). Both give the same batches
    for a seed and a batch size: the random draws are the same, only where the values are read differs.
    """

    def __init__(self, ds: Any, tasks: list[str], n_obs_steps: int, horizon: int, pixels: bool, seed: int,
                 privileged: bool = False, stream: Any = "auto", memory_gb: float = DEFAULT_MEMORY_GB):
        from embodied.runtime.stream import (MemoryWindows, StreamedWindows, WindowIndex, arrays_bytes,
                                             check_memory_gb, should_stream, stream_mode)

        # one camera is recorded as ``image``, several as ``images/<camera>`` (``embodied.runtime.data.features_for``);
        # a dataset with neither is refused below, naming the missing "image"
        views = tuple(sorted(f for f in ds.features if f.startswith("images/")))
        cams = () if not pixels else views if views and "image" not in ds.features else ("image",)
        feats = ("state", "action") + cams + (("privileged_state",) if privileged else ())
        self._views = cams if cams != ("image",) else ()  # several cameras: handed over as batch["images"]
        positions = ds.select(tasks)
        memory_gb = check_memory_gb(memory_gb)
        self.streamed = should_stream(stream_mode(stream), arrays_bytes(ds, feats, positions), memory_gb)
        self.ds, self.positions = ds, positions
        self.source = (StreamedWindows if self.streamed else MemoryWindows)(ds, positions, feats, tasks)
        metas = ds.episodes_meta
        metas = [metas[i] for i in positions]
        self.task_of = [m["task"] for m in metas]
        self.params = [m.get("params") or {} for m in metas]
        # an episode recorded elsewhere (imported from a LeRobotDataset) has no template parameters: its own words
        self.words = [None if "params" in m else str(m.get("instruction") or "") for m in metas]
        self.templates = {t: get_task(t).train_instructions for t in set(self.task_of)}
        self.windows = WindowIndex([int(m["length"]) for m in metas])
        self.to, self.h = n_obs_steps, horizon
        self.rng = np.random.default_rng(seed)
        self._cache: dict[tuple[str, int, int], str] = {}
        # streaming: the next batch, drawn ahead and being read by the thread (batch size, rng state before its
        # draws, idx, template picks, future)
        self._ahead: tuple[int, Any, np.ndarray, list[int], Any] | None = None
        self._pool: Any = None
        if self.streamed:
            import weakref
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="stream-batches")
            weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)

    def instruction(self, ep: int, k: int) -> str:
        if self.words[ep] is not None:
            return self.words[ep]
        key = (self.task_of[ep], ep, k)
        if key not in self._cache:
            self._cache[key] = self.templates[self.task_of[ep]][k].format(**self.params[ep])
        return self._cache[key]

    def instructions_by_task(self) -> dict[str, list[str]]:
        """Task -> every instruction its batches can hold (each episode's parameters x its task's
        templates; episodes with the same task and parameters are rendered once)."""
        seen = {(self.task_of[e], json.dumps(self.params[e], sort_keys=True, default=str), self.words[e]): e
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
        """The index that grounds unfamiliar instructions (``policies.common.grounding``). Streaming, it
        loads the ``state`` arrays alone (steps x state_dim floats) to build it, and lets them go."""
        from policies.common.grounding import InstructionGrounding

        if self.streamed:
            states, ends = self.ds.load_arrays(("state",), tasks=sorted(set(self.task_of)))
            states = states["state"]
        else:
            states, ends = self.source.arrays["state"], self.source.ends
        starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        return InstructionGrounding.from_demonstrations(self.instructions_by_task(), states[starts], self.task_of,
                                                        states, k)

    def _draw(self, batch_size: int) -> tuple[np.ndarray, list[int]]:
        """A batch's random choices: its windows (B, 2) and each window's instruction template."""
        idx = self.windows[self.rng.integers(len(self.windows), size=batch_size)]
        return idx, [int(self.rng.integers(len(self.templates[self.task_of[e]]))) for e in idx[:, 0]]

    def sample(self, batch_size: int) -> dict[str, Any]:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] != batch_size:  # drawn for another batch size: take its draws back
            self.rng.bit_generator.state = ahead[1]
            ahead = None
        if ahead is None:
            idx, ks = self._draw(batch_size)
            batch = self.source.cut(idx, self.to, self.h)
        if self._pool is not None:  # (a batch is drawn ahead only while the thread runs)
            # Ctrl-C waits until the hand-over is done: raised inside the executor's or the future's
            # locks it would leave them held, and the reading thread (joined at exit) would hang
            with _held_interrupts():
                if ahead is not None:
                    idx, ks, batch = ahead[2], ahead[3], ahead[4].result()
                state = self.rng.bit_generator.state
                nidx, nks = self._draw(batch_size)
                self._ahead = (batch_size, state, nidx, nks,
                               self._pool.submit(self.source.cut, nidx, self.to, self.h))
        if self._views:  # the policies read several cameras as batch["images"][camera]
            batch["images"] = {k[len("images/"):]: batch.pop(k) for k in self._views}
        eps = idx[:, 0]
        batch["instruction"] = [self.instruction(int(e), k) for e, k in zip(eps, ks)]
        batch["task"] = [self.task_of[int(e)] for e in eps]
        return batch

    def close(self) -> None:
        """Stop the streaming thread (it also stops when the batcher is garbage collected); the batch
        drawn ahead is taken back, so the next ``sample`` gives it, read in this thread."""
        if self._ahead is not None:
            self.rng.bit_generator.state = self._ahead[1]
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool, self._ahead = None, None


def free_cores(window_s: float = 0.5) -> int:
    """CPU cores not busy now (CPU use over ``window_s`` seconds, from /proc/stat), at least one.

    Training uses this many torch threads unless ``threads`` is set: more threads than free cores
    make torch's threads wait for each other. Without /proc/stat (not Linux): half the cores.
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


def default_threads() -> int:
    """Torch threads for ``threads=0``: ``OMP_NUM_THREADS`` when it is set (the usual way to cap a
    process's threads), else the cores not busy now (``free_cores``)."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return free_cores()


def _workers(cfg: TrainConfig, episodes: int) -> int:
    """Worker processes for ``episodes`` episodes (``cfg.workers``, or the automatic choice: one per
    core from 100 episodes on, for state and pixels alike: a worker renders its own frames)."""
    if cfg.workers:
        return cfg.workers
    return (os.cpu_count() or 1) if episodes >= 100 else 1


def dataset_path(cfg: TrainConfig) -> Path:
    """The run's dataset folder: ``dataset``, else ``data/<suite or tasks>-<obs_mode>``."""
    return Path(cfg.dataset or f"data/{cfg.suite if not cfg.tasks else '-'.join(cfg.tasks)}-{cfg.obs_mode}")


def run_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The settings that define the run (every field but ``RESUMABLE``), flat and as JSON values.

    The tasks are the resolved list, the dataset an absolute path and the policy its whole
    config (``policy.<field>``, defaults filled in); ``image_size`` and ``cameras`` are left out
    for state observations, where they change nothing.
    """
    from policies import make_config

    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in RESUMABLE}
    values["tasks"] = resolve_tasks(cfg.suite, cfg.tasks)
    values["dataset"] = str(dataset_path(cfg).resolve())
    if cfg.obs_mode == "state":
        del values["image_size"], values["cameras"]
    policy = values.pop("policy")
    values["policy.name"] = policy["name"]
    values.update({f"policy.{k}": v for k, v in dataclasses.asdict(make_config(policy["name"], policy)).items()
                   if k not in DERIVED_POLICY_FIELDS})
    return json.loads(json.dumps(values))


def _recorded_run(ckpt: Path) -> tuple[dict[str, Any], int, dict[str, int] | None, str]:
    """(settings, step, episodes per task of the dataset, where they come from) of the run in ``ckpt``.

    A checkpoint from before ``train_run.json`` existed tells its policy (family and config),
    tasks and observation mode (``config.json``) and its step (``trainer_state.pt``).
    """
    record = ckpt / RUN_RECORD
    if record.is_file():
        try:
            data = json.loads(record.read_text())
            return dict(data["settings"]), int(data["step"]), data.get("dataset_episodes"), str(record)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{record} is damaged ({type(e).__name__}: {e}); the run's settings are unknown, so it "
                             "is not resumed: give a new hydra.run.dir=PATH, or restart=true to move it aside"
                             ) from None
    import torch

    from policies.common.checkpoint import read_checkpoint_config

    meta = read_checkpoint_config(ckpt)
    settings = {"policy.name": meta["policy"], "tasks": list(meta.get("task_names") or [])}
    settings.update({f"policy.{k}": v for k, v in meta["config"].items() if k not in DERIVED_POLICY_FIELDS})
    settings["obs_mode"] = meta["config"].get("obs_mode")
    try:
        step = int(torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=True)["step"])
    except Exception as e:  # unreadable: the run cannot be continued
        raise ValueError(f"{ckpt / 'trainer_state.pt'} is damaged ({e}); give a new hydra.run.dir=PATH, or "
                         "restart=true to move this run aside") from None
    return settings, step, None, str(ckpt / "config.json")


def resume_state(cfg: TrainConfig, out: Path) -> tuple[int, dict[str, int] | None]:
    """(steps done, episodes per task it trained on) of the run in ``out``; (0, None) for a new run.

    Raises:
        ValueError: the run there was trained with other settings (each difference named),
            or ``cfg.steps`` is below the steps it has done (a run never goes back).
    """
    ckpt = out / "checkpoint"
    if not (ckpt / "trainer_state.pt").is_file():
        return 0, None
    recorded, step, episodes, source = _recorded_run(ckpt)
    now = run_settings(cfg)
    diffs = [f"{k}: recorded {recorded[k]!r}, now {now[k]!r}" for k in sorted(recorded)
             if k in now and recorded[k] != now[k]]
    ways = (f"give a new hydra.run.dir=PATH for a new run, or restart=true to move this one aside (to "
            f"{_aside(out)}) and start over")
    if diffs:
        raise ValueError(f"{out} holds a run trained with other settings (recorded in {source}); resuming it with "
                         f"these would mix two runs: {'; '.join(diffs)}. Rerun with the recorded settings to resume "
                         f"it; {ways}")
    if cfg.steps < step:
        raise ValueError(f"{out} has trained {step} steps; steps={cfg.steps} would go back (a rerun only continues: "
                         f"steps > {step}). Its snapshots are in {out / 'checkpoints'} (embodied eval "
                         f"checkpoint={out / 'checkpoints'}); {ways}")
    return step, episodes


def finished(out: Path, step: int) -> bool:
    """Whether ``out`` holds the final results (``metrics.json``) of its run at ``step``."""
    try:
        return json.loads((out / "metrics.json").read_text()).get("steps") == step
    except (OSError, ValueError, AttributeError):
        return False


def _aside(out: Path) -> Path:
    k = 1
    while out.with_name(f"{out.name}.old-{k}").exists():
        k += 1
    return out.with_name(f"{out.name}.old-{k}")


def move_aside(out: Path) -> Path | None:
    """Move the run folder ``out`` to ``out.old-<k>`` (the first free k), for ``restart=true``;
    None when there is nothing there. Nothing is deleted."""
    out = out.absolute()
    if not out.is_dir() or not any(out.iterdir()):
        return None
    here = Path.cwd().resolve()
    if out.resolve() == here or out.resolve() in here.parents:
        raise ValueError(f"restart=true cannot move {out} aside: it holds the working directory; give a new "
                         "hydra.run.dir=PATH instead")
    dest = _aside(out)
    os.replace(out, dest)
    return dest


def _ensure_dataset(cfg: TrainConfig, tasks: list[str], out: Path | None = None) -> Any:
    from embodied.runtime.collect import collect
    from embodied.runtime.data import Dataset
    from embodied.runtime.lerobot import is_lerobot, training_copy

    path = dataset_path(cfg)
    if is_lerobot(path):  # a LeRobotDataset v3: trained from our copy of it, imported once into the run folder
        dest = out / "lerobot-import" if out is not None else Path("data") / f"{path.name}-imported"
        ds = Dataset.open(training_copy(path, dest, tasks), on_corrupt=cfg.on_corrupt)
        log.info("dataset %s (LeRobotDataset, imported to %s): %d episodes, %d steps", path, ds.root, len(ds),
                 sum(ds.lengths))
        return ds
    have: dict[str, int] = {}
    if (path / "meta.json").exists():
        for m in Dataset.open(path, on_corrupt=cfg.on_corrupt).episodes_meta:
            have[m.get("task")] = have.get(m.get("task"), 0) + 1
    if any(have.get(t, 0) < cfg.demos for t in tasks):
        log.info("collecting demonstrations into %s (%d per task)", path, cfg.demos)
        missing = sum(max(0, cfg.demos - have.get(t, 0)) for t in tasks)
        collect(tasks, path, cfg.demos, cfg.obs_mode, cfg.image_size, cfg.cameras, seed=cfg.seed,
                action_noise=cfg.demo_noise, progress=cfg.progress, suite=cfg.suite, workers=_workers(cfg, missing),
                on_corrupt=cfg.on_corrupt)
    ds = Dataset.open(path, on_corrupt=cfg.on_corrupt)
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


def compile_for_training(policy: Any) -> None:
    """Compile (in place) the tensor work of a training step with torch.compile, as one graph:
    the text head, the observation encoder and the family's loss (``policy.loss_graph``). The
    weight average (the evaluated copy) stays eager."""
    import torch

    policy.loss_graph = torch.compile(policy.loss_graph)
    log.info("torch.compile: the training loss (text head, observation encoder, %s loss) compiles as one graph in the "
             "first steps", type(policy).__name__)


def _autocast(precision: str, device: Any) -> Any:
    """A context factory for the forward pass at ``precision`` on ``device``."""
    import torch

    if precision == "fp32":
        return contextlib.nullcontext
    if device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        raise ValueError("precision=bf16: this CPU has no bf16 instructions (AVX512-BF16 or AMX); use precision=fp32")
    return lambda: torch.autocast(device.type, dtype=torch.bfloat16)


@contextlib.contextmanager
def _held_interrupts(reraise: bool = True) -> Iterator[None]:
    """Hold Ctrl-C until the block is done (then raise it, with ``reraise``), so that a step's
    updates or a checkpoint are never cut in half and the step count labels the weights."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    if caught and reraise:
        raise KeyboardInterrupt


def _save(policy: Any, opt: Any, sched: Any, step: int, curve: list[Any], out: Path,
          record: dict[str, Any] | None = None) -> None:
    """Checkpoint atomically: write into a temp dir, then swap it in. ``record`` (the run's
    settings and data, see ``resume_state``) goes to ``train_run.json`` with ``step``."""
    import torch

    tmp, final = out / "checkpoint.tmp", out / "checkpoint"
    shutil.rmtree(tmp, ignore_errors=True)
    save_policy(policy, str(tmp))
    torch.save({"step": step, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "curve": curve},
               tmp / "trainer_state.pt")
    if record is not None:
        (tmp / RUN_RECORD).write_text(json.dumps({**record, "step": step}, indent=1) + "\n")
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


def train(cfg: TrainConfig, out: Path) -> dict[str, Any] | None:
    """Train (or resume) the run in ``out`` and evaluate it; its metrics (see the module docstring).

    Under torchrun each process trains on its share of the global batch (``embodied.runtime.ddp``);
    rank 0 alone evaluates and writes, and the others return None once it is done.
    On Ctrl-C the steps done are saved first, then a warning says what ``out`` holds and the
    ``KeyboardInterrupt`` goes on up.
    """
    world = ddp.start(cfg.batch_size, cfg.device, cfg.ddp_backend)
    try:
        metrics = _train(cfg, out, world)
        ddp.barrier(world)  # the others wait for rank 0's evaluation, so that every rank leaves the group together
        return metrics
    except KeyboardInterrupt:
        if world.main:
            log.warning("%s", _kept(cfg, out))
        raise
    finally:
        ddp.stop(world)


def _kept(cfg: TrainConfig, out: Path) -> str:
    """What an interrupted run leaves in ``out``, and how to go on."""
    ckpt = out / "checkpoint"
    try:
        step = _recorded_run(ckpt)[1] if (ckpt / "trainer_state.pt").is_file() else None
    except ValueError:
        step = None
    if step is None:
        return (f"interrupted before the first checkpoint: nothing is trained yet (the demonstrations recorded so "
                f"far are kept in {dataset_path(cfg)}); rerun the same command to start")
    if step >= cfg.steps:
        return (f"interrupted in the final evaluation: {ckpt} holds the trained policy (step {step}); rerun the same "
                "command to evaluate it (nothing is trained again)")
    return (f"interrupted at step {step} of {cfg.steps}: {ckpt} holds the policy at step {step} (snapshots in "
            f"{out / 'checkpoints'}); rerun the same command to continue from there")


def _train(cfg: TrainConfig, out: Path, world: ddp.World) -> dict[str, Any] | None:
    import torch
    from tqdm.auto import tqdm

    from embodied.runtime.checkpoints import env_kwargs
    from embodied.runtime.evaluate import drawn_noise_scale, evaluate, save_videos, write_report
    from policies import load_policy, make_config, make_policy

    t_start = time.time()
    tasks = resolve_tasks(cfg.suite, cfg.tasks)
    if world.main and cfg.restart and (out / "checkpoint").exists():  # `embodied train` has moved it before it started
        log.warning("restart=true: moved the previous run to %s", move_aside(out))
        out.mkdir(parents=True)
    ddp.barrier(world)  # the others read the run folder once rank 0 has moved it aside
    start_step, trained_on = resume_state(cfg, out)  # refuses another run's folder before any work
    if start_step and start_step == cfg.steps and finished(out, start_step):
        log.info("%s finished at step %d: nothing to train (steps > %d continues it)", out, start_step, start_step)
        return json.loads((out / "metrics.json").read_text()) if world.main else None
    torch.set_num_threads(cfg.threads or max(1, default_threads() // world.local_size))
    train_threads = torch.get_num_threads()  # recorded: results change (in the last bits, then more) with it
    torch.manual_seed(cfg.seed)
    name = cfg.policy["name"]
    pcfg = make_config(name, {**cfg.policy, "obs_mode": cfg.obs_mode})  # validates before any work
    kw = env_kwargs(cfg.obs_mode, cfg.image_size, cfg.cameras)
    probe = make_env(tasks[0], **kw)
    obs_spec, action_spec = probe.unwrapped.observation_spec, probe.unwrapped.action_spec
    probe.close()

    if world.main:  # rank 0 collects what is missing, the others then open the dataset
        ds = _ensure_dataset(cfg, tasks, out)
    ddp.barrier(world)
    if not world.main:
        ds = _ensure_dataset(cfg, tasks, out)
    _check_dataset(ds, obs_spec, action_spec)
    episodes = dict(sorted(Counter(m.get("task") for m in ds.episodes_meta if m.get("task") in tasks).items()))
    if trained_on is not None and trained_on != episodes:
        raise ValueError(f"dataset {ds.root} now holds {episodes} episodes per task, but the run in {out} trained on "
                         f"{trained_on}: resuming would train on other data. Give dataset=PATH of the run's data, a "
                         "new hydra.run.dir=PATH for a new run, or restart=true to move this run aside")
    record = {"settings": run_settings(cfg), "dataset_episodes": episodes}
    pcfg = _with_aux_state(pcfg, ds)
    t_data = time.time() - t_start
    ckpt = out / "checkpoint"
    curve: list[dict[str, Any]] = []
    if start_step:
        policy = load_policy(str(ckpt), device=world.device)
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        curve = list(state["curve"])
        log.info("resuming from %s at step %d", ckpt, start_step)
    else:
        stats = ds.stats
        policy = make_policy(name, pcfg, obs_spec, action_spec, stats, task_names=tasks, device=world.device)
    ddp.broadcast_state(policy, world)
    ddp.seed_rank(cfg.seed, world)
    opt = policy.make_optimizer()
    sched = policy.make_scheduler(opt, cfg.steps)
    if start_step:
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
    n_params = sum(p.numel() for p in policy.model.parameters())
    log.info("%s policy, %.2fM parameters, device %s, %d torch threads%s", name, n_params / 1e6, policy.device,
             train_threads, "" if cfg.threads else " (threads=0: OMP_NUM_THREADS, else the free cores)")

    batcher = Batcher(ds, tasks, policy.n_obs_steps, policy.horizon, cfg.obs_mode == "pixels", cfg.seed + start_step,
                      privileged=policy.config.aux_state_dim > 0 and "privileged_state" in ds.features,
                      stream=cfg.stream, memory_gb=cfg.stream_memory_gb)
    log.info("training windows %s", "read from the episode files batch by batch" if batcher.streamed else "in memory")
    policy.prepare_instructions(batcher.all_instructions())  # embed them all at once, not step by step
    deployed: Any = policy  # what is saved and evaluated: the network, with its grounding wrapper
    if policy.config.ground_instructions:
        from policies.common.grounding import GroundedPolicy

        deployed = GroundedPolicy(policy, batcher.grounding(policy.config.ground_neighbours))
    from torch.utils.tensorboard import SummaryWriter

    tb = SummaryWriter(str(out / "tb")) if world.main else None
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
               disable=not (cfg.progress and world.main))
    params = list(policy.model.parameters())
    autocast = _autocast(cfg.precision, policy.device)
    if cfg.compile:
        compile_for_training(policy)
    done = start_step  # steps whose updates the weights hold: what every checkpoint and snapshot is labelled
    try:
        for step in bar:
            batch = ddp.shard(batcher.sample(cfg.batch_size), world)  # every rank samples the global batch
            with autocast():
                loss, logs = policy.compute_loss(batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            logs = ddp.average_gradients(params, logs, world)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            with _held_interrupts():
                opt.step()
                sched.step()
                policy.ema_update()
                done = step + 1
            if world.main and step % 25 == 0:
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
            if not world.main:  # the others go on to the next step's all-reduce, which waits for rank 0
                continue
            if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
                periodic_eval(done)
            # Ctrl-C waits for the writes: raised inside shutil.rmtree it can surface as an OSError
            # (exit 1) and leave a half-written directory
            with _held_interrupts():
                if cfg.snapshot_every and done % cfg.snapshot_every == 0:
                    _snapshot(deployed, done, out)  # before _save: a crash in between still resumes to it
                if done % cfg.save_every == 0:
                    _save(deployed, opt, sched, done, curve, out, record)
    except KeyboardInterrupt:  # keep the steps done (train() then says what is kept)
        if world.main:
            with _held_interrupts(reraise=False):
                _save(deployed, opt, sched, done, curve, out, record)
        raise
    finally:
        bar.close()
    batcher.close()
    if not world.main:
        return None
    train_time = time.time() - t_train
    from embodied.runtime.stream import peak_rss_mb

    train_peak_rss_mb = peak_rss_mb()  # this process's peak through training, before evaluation starts workers
    trained = done - start_step
    samples_per_s = trained * cfg.batch_size / max(train_time, 1e-9) if trained else None
    with _held_interrupts():
        if cfg.snapshot_every:
            _snapshot(deployed, done, out)
        _save(deployed, opt, sched, done, curve, out, record)

    policy.eval()
    workers = _workers(cfg, len(tasks) * 2 * cfg.eval_episodes)
    if workers > 1:
        from embodied.runtime.distributed import PolicySource, evaluate_sharded

        # each worker steps its environments in its own process ("sync"): the workers fill the cores
        metrics, results = evaluate_sharded(PolicySource(str(ckpt), cfg.device), tasks, cfg.eval_episodes,
                                            ("train", "heldout"), cfg.eval_seed, cfg.num_envs, "sync", kw,
                                            videos=cfg.videos, progress=cfg.progress, workers=workers)
    else:
        metrics, results = evaluate(deployed, tasks, cfg.eval_episodes, ("train", "heldout"), cfg.eval_seed,
                                    cfg.num_envs, vector, kw, videos=cfg.videos, progress=cfg.progress)
    curve.append({"step": done, "success_rate": metrics["success_rate"]})
    videos = save_videos(out, results) if cfg.videos else {}
    metrics.update({
        "policy": name, "suite": cfg.suite, "tasks": tasks, "obs_mode": cfg.obs_mode, "steps": done,
        "resumed_from_step": start_step, "batch_size": cfg.batch_size, "world_size": world.size,
        "batch_per_rank": cfg.batch_size // world.size, "ddp_backend": world.backend, "demos": cfg.demos,
        "demo_noise": cfg.demo_noise, "dataset": str(ds.root), "dataset_episodes": episodes,
        "checkpoint": str(ckpt), "videos": videos, "success_curve": curve,
        "final_loss": losses[-1][1] if losses else None, "parameters": n_params,
        "train_samples_per_s": samples_per_s, "data_time_s": t_data, "train_time_s": train_time,
        "streamed": batcher.streamed, "train_peak_rss_mb": train_peak_rss_mb, "train_threads": train_threads,
        "precision": cfg.precision, "compiled": cfg.compile, "eval_time_s": metrics["wall_time_s"],
        "wall_time_s": time.time() - t_start,
        "noise_scale": drawn_noise_scale(deployed),  # the evaluation's factor on the initial noise (policy.noise_scale)
    })
    write_json(out / "metrics.json", metrics)
    write_report(out, metrics, f"{name} policy on {cfg.suite} ({cfg.obs_mode})", videos)
    plot_curve(out / "training_curve.png", losses, curve)
    tb.add_scalar("eval/final_success_rate", metrics["success_rate"], done)
    tb.close()
    return metrics
