"""open_clip models for rewards: build any architecture offline, load local weights, save and
load reward checkpoints.

Nothing here downloads. Models are built with ``open_clip.create_model(arch,
pretrained=None)`` (random weights, no base-tower weights either) and weights come only from a
local file: a user's open_clip checkpoint (``load_open_clip``) or a reward checkpoint folder
written by ``embodied reward fit`` (``save_reward_checkpoint`` / ``read_reward_checkpoint``).

A reward checkpoint is a folder:

    reward.json        what the reward is: format, suite and tasks it was fitted for, the
                       open_clip architecture (name + overrides), the text side, the frame
                       size and normalisation, the fitting record (seeds, wordings, steps)
    model.safetensors  the open_clip model's weights (image tower; the text tower too when
                       the text side is open_clip's own)
    reference.safetensors  (optional) ``embeddings`` (N, D): unit image embeddings of N frames
                       of the fitting bank, against which each instruction's reward is
                       standardised (``ClipReward``'s ``reference``)
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from pathlib import Path
from typing import Any

import torch

from embodied.core.errors import EmbodiedError, UnknownNameError

FORMAT = "embodied-clip-reward"
FORMAT_VERSION = 1
CONFIG_FILE, WEIGHTS_FILE, REFERENCE_FILE = "reward.json", "model.safetensors", "reference.safetensors"
# A text tower the in-domain default never runs (its text side is MiniLM): open_clip's CLIP
# class always builds one, so it is made as small as the class allows.
PLACEHOLDER_TEXT = {"context_length": 4, "vocab_size": 8, "width": 8, "heads": 1, "layers": 1}
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


class RewardCheckpointError(EmbodiedError, ValueError):
    """A reward checkpoint is missing, damaged, or was fitted for something else."""


def check_arch(arch: str) -> dict[str, Any]:
    """The open_clip config of built-in architecture ``arch``; refuse what would download."""
    import open_clip

    if ":" in arch:
        raise ValueError(f"reward arch {arch!r}: schema names (hf-hub:, local-dir:) are not accepted, since "
                         "they fetch configs or weights; give a built-in open_clip name and checkpoint=PATH")
    cfg = open_clip.get_model_config(arch)
    if cfg is None:
        raise UnknownNameError("open_clip architecture", arch, open_clip.list_models())
    text = cfg.get("text_cfg", {})
    if text.get("hf_model_name") or text.get("hf_tokenizer_name"):
        raise ValueError(f"reward arch {arch!r} uses a Hugging Face text model/tokenizer "
                         f"({text.get('hf_model_name') or text.get('hf_tokenizer_name')}), which would be "
                         "downloaded; choose an arch with open_clip's own tokenizer (e.g. ViT-B-32, RN50)")
    return cfg


class _OpenClipNotices(logging.Filter):
    """open_clip narrates model creation on the root logger (and warns of the random init that
    is asked for here); the reward's own log says what was built."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "open_clip" not in record.pathname


@contextlib.contextmanager
def quiet_open_clip():
    f = _OpenClipNotices()
    logging.getLogger().addFilter(f)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(f)


def build_open_clip(arch: str, overrides: dict[str, Any] | None = None) -> torch.nn.Module:
    """A randomly initialised open_clip model of ``arch``; ``overrides`` replace top-level config
    entries (``vision_cfg``/``text_cfg`` dicts are merged into the arch's own)."""
    import open_clip

    cfg = check_arch(arch)
    kwargs: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            merged = copy.deepcopy(cfg[key])
            merged.update(value)
            kwargs[key] = merged
        else:
            kwargs[key] = value
    vision = kwargs.get("vision_cfg", cfg.get("vision_cfg", {}))
    if vision.get("timm_model_pretrained"):
        raise ValueError(f"reward arch {arch!r}: timm_model_pretrained would download weights; set it false")
    with quiet_open_clip():
        return open_clip.create_model(arch, pretrained=None, pretrained_image=False, pretrained_text=False,
                                      device="cpu", **kwargs)


def load_open_clip(arch: str, path: str | Path, overrides: dict[str, Any] | None = None) -> torch.nn.Module:
    """A user's open_clip checkpoint file (any format open_clip reads) into architecture ``arch``."""
    import open_clip

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"reward checkpoint {str(path)!r} does not exist: give the path of a local "
                                "open_clip weights file (.pt/.bin/.safetensors) with reward.arch=NAME, or a "
                                "reward folder written by `embodied reward fit`")
    model = build_open_clip(arch, overrides)
    try:
        with quiet_open_clip():
            open_clip.load_checkpoint(model, str(p), strict=True, weights_only=True)
    except (RuntimeError, KeyError, ValueError, AssertionError) as e:  # open_clip asserts on some mismatches
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise RewardCheckpointError(f"reward checkpoint {str(path)!r} does not fit open_clip arch {arch!r}: "
                                    f"{first}") from None
    return model.eval()


def image_size_of(model: torch.nn.Module) -> int:
    size = getattr(model.visual, "image_size", 224)
    size = size if isinstance(size, int) else size[0]
    return int(size)


def save_reward_checkpoint(folder: str | Path, model: torch.nn.Module, meta: dict[str, Any]) -> Path:
    """Write ``model``'s weights and ``meta`` (see the module docstring) to ``folder``."""
    from safetensors.torch import save_file

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(out / WEIGHTS_FILE))
    meta = {"format": FORMAT, "version": FORMAT_VERSION, **meta}
    (out / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return out


def save_reference(folder: str | Path, embeddings: torch.Tensor) -> Path:
    """Write the reference image embeddings (N, D) of a reward checkpoint (see the module docstring)."""
    from safetensors.torch import save_file

    path = Path(folder) / REFERENCE_FILE
    save_file({"embeddings": embeddings.detach().float().contiguous().cpu()}, str(path))
    return path


def read_reference(folder: str | Path, dim: int) -> torch.Tensor | None:
    """The reference embeddings (N, ``dim``) of a reward checkpoint folder, None if it has none."""
    from safetensors.torch import load_file

    path = Path(folder) / REFERENCE_FILE
    if not path.is_file():
        return None
    try:
        ref = load_file(str(path))["embeddings"]
    except Exception as e:  # a truncated file, or another file under that name
        raise RewardCheckpointError(f"{path} is not a reference file written by `embodied reward fit` "
                                    f"({type(e).__name__}: {e}); fit again, or delete it to score "
                                    "unstandardised") from None
    if ref.ndim != 2 or ref.shape[1] != dim or len(ref) < 2:
        raise RewardCheckpointError(f"{path} holds embeddings of shape {tuple(ref.shape)}, not (N >= 2, {dim}): it "
                                    "belongs to another checkpoint; fit again, or delete it to score unstandardised")
    return ref


def is_reward_checkpoint(path: str | Path) -> bool:
    return Path(path).is_dir() and (Path(path) / CONFIG_FILE).is_file()


def read_reward_checkpoint(folder: str | Path) -> tuple[dict[str, Any], torch.nn.Module]:
    """(meta, open_clip model with its weights) of a reward checkpoint folder."""
    from safetensors.torch import load_file

    root = Path(folder)
    if not root.exists():
        raise FileNotFoundError(f"reward checkpoint {str(folder)!r} does not exist: give a folder written by "
                                "`embodied reward fit` (reward.json + model.safetensors) or an open_clip weights file")
    for f in (CONFIG_FILE, WEIGHTS_FILE):
        if not (root / f).is_file():
            raise RewardCheckpointError(f"reward checkpoint {str(folder)!r} has no {f}: a reward folder holds "
                                        f"{CONFIG_FILE} and {WEIGHTS_FILE} (written by `embodied reward fit`)")
    try:
        meta = json.loads((root / CONFIG_FILE).read_text())
    except json.JSONDecodeError as e:
        raise RewardCheckpointError(f"{root / CONFIG_FILE} is not valid JSON: {e}") from None
    if meta.get("format") != FORMAT:
        raise RewardCheckpointError(f"{root / CONFIG_FILE}: format {meta.get('format')!r} is not {FORMAT!r}")
    if int(meta.get("version", 0)) > FORMAT_VERSION:
        raise RewardCheckpointError(f"{root / CONFIG_FILE}: version {meta.get('version')} is newer than this "
                                    f"package reads ({FORMAT_VERSION}); upgrade embodied")
    model = build_open_clip(meta["arch"], meta.get("overrides"))
    try:
        state = load_file(str(root / WEIGHTS_FILE))
        model.load_state_dict(state, strict=True)
    except Exception as e:  # a truncated file, or weights of another architecture
        raise RewardCheckpointError(f"{root / WEIGHTS_FILE} does not load into arch {meta['arch']!r}: "
                                    f"{str(e).splitlines()[0]}") from None
    return meta, model.eval()
