"""Checkpoints: adapter, optimizer state, step, RNG states and config, every K steps.

Layout: ``<output_dir>/checkpoints/step_000010/`` holding

* ``adapter_model.safetensors`` + ``adapter_config.json`` (peft's ``save_pretrained``,
  loadable with ``PeftModel.from_pretrained``);
* ``optimizer.pt``: the optimizer's ``state_dict`` (tensors and numbers only);
* ``rng.pt``: every RNG state as tensors and plain numbers (torch, CUDA, numpy, Python;
  each rank's in a K-process run);
* ``state.json`` (the step), ``config.json`` (the run's ``TrainConfig``);
* ``manifest.json``, written last: the size and SHA-256 of every other file.

Nothing here unpickles code: both ``.pt`` files are read with ``torch.load(...,
weights_only=True)``, which only builds tensors, numbers, strings and containers, so a
checkpoint from someone else cannot run code when it is opened. A checkpoint is written
to a temporary folder and renamed into place, so an interrupted save leaves no
half-written ``step_*`` folder; a folder damaged later (a full disk, a node dying
mid-copy) fails :func:`validate_checkpoint` and resume falls back to the newest complete
one, saying which it skipped and why. Nothing is ever deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from peft import set_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import load_file

from scaleup.config import TrainConfig
from scaleup.distributed import is_distributed

MANIFEST = "manifest.json"
REQUIRED = ("adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "rng.pt",
            "state.json", "config.json")


class CheckpointError(ValueError):
    """No usable checkpoint (the message says which folders were tried and why)."""


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    """Folder of the checkpoint taken after ``step`` completed steps."""
    return Path(output_dir) / "checkpoints" / f"step_{step:06d}"


def checkpoints(output_dir: str | Path) -> list[Path]:
    """Every ``step_*`` checkpoint folder, newest (most steps) first."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]), reverse=True)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The checkpoint folder with the most steps, complete or not, or ``None``."""
    found = checkpoints(output_dir)
    return found[0] if found else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def validate_checkpoint(folder: str | Path) -> str | None:
    """Why ``folder`` cannot be resumed from, or ``None`` when it is complete.

    Checks that every file exists with the size and SHA-256 the manifest recorded, that
    ``state.json`` names the folder's step and ``config.json`` is a valid config, and that
    both ``.pt`` files load in safe (``weights_only``) mode.
    """
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
    except FileNotFoundError:
        return f"{MANIFEST} is missing (the save did not finish)"
    except (json.JSONDecodeError, KeyError, TypeError):
        return f"{MANIFEST} is not valid JSON"
    for name in REQUIRED:
        if name not in files:
            return f"{MANIFEST} does not list {name}"
    for name, meta in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != meta.get("size"):
            return (f"{name} has {path.stat().st_size} bytes, the manifest says "
                    f"{meta.get('size')} (truncated or replaced)")
        if _sha256(path) != meta.get("sha256"):
            return f"{name} does not match its SHA-256 in the manifest (corrupt)"
    try:
        step = int(json.loads((folder / "state.json").read_text())["step"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return "state.json does not hold a step"
    if folder.name[5:].isdigit() and step != int(folder.name[5:]):
        return f"state.json says step {step}, the folder name step {int(folder.name[5:])}"
    try:
        TrainConfig.from_json(folder / "config.json")
    except Exception as e:  # JSONDecodeError, unknown keys, wrong types
        return f"config.json is not a valid config ({type(e).__name__}: {e})"
    for name in ("optimizer.pt", "rng.pt"):
        try:
            torch.load(folder / name, weights_only=True)
        except Exception as e:  # an unpickling refusal, a truncated zip, ...
            return f"{name} does not load in safe mode ({type(e).__name__})"
    try:
        load_file(str(folder / "adapter_model.safetensors"))
    except (SafetensorError, OSError) as e:
        return f"adapter_model.safetensors does not load ({e})"
    return None


def usable_checkpoint(output_dir: str | Path, say=print) -> Path:
    """The newest checkpoint that passes :func:`validate_checkpoint`.

    Each newer one that fails is reported through ``say`` with its reason and skipped
    (not deleted). Raises :class:`CheckpointError` in one line when none is usable.
    """
    found = checkpoints(output_dir)
    if not found:
        raise CheckpointError(f"no checkpoint found in {str(output_dir)!r}")
    reasons = []
    for folder in found:
        problem = validate_checkpoint(folder)
        if problem is None:
            return folder
        reasons.append(f"{folder.name}: {problem}")
        say(f"skipping checkpoint {folder}: {problem}")
    raise CheckpointError(f"no usable checkpoint in {str(output_dir)!r} ("
                          + "; ".join(reasons) + ")")


def rng_states() -> dict:
    """Every random state a step draws from: torch (CPU and CUDA), numpy, Python, as
    tensors and plain numbers (so that they load with ``weights_only=True``). In a
    K-process run, only the CUDA state of this rank's current device."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"kind": kind, "keys": torch.from_numpy(np.asarray(keys, np.int64)),
                       "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
             "python": {"version": version, "internal": list(internal),
                        "gauss_next": gauss_next}}
    if torch.cuda.is_available():
        if is_distributed():  # one GPU per rank: touch only this rank's device
            state["cuda_current"] = torch.cuda.get_rng_state()
        else:
            state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_states(state: dict) -> None:
    """Restore what :func:`rng_states` returned."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "cuda_current" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_current"])


def save_checkpoint(output_dir: str | Path, step: int, model, optimizer,
                    cfg: TrainConfig, rank_rngs: list[dict] | None = None) -> Path:
    """Save everything needed to continue after ``step`` completed steps.

    With K processes, rank 0 saves (adapter and optimizer state are the same on every
    rank) and ``rank_rngs`` holds every rank's :func:`rng_states`, in rank order: rank 0's
    are ``rng.pt`` as in a single-process run, all K under its key ``"ranks"``.
    """
    final = checkpoint_dir(output_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    rng = dict(rank_rngs[0]) if rank_rngs else rng_states()
    if rank_rngs and len(rank_rngs) > 1:
        rng["ranks"] = rank_rngs
    torch.save(rng, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step}) + "\n")
    cfg.to_json(tmp / "config.json")
    files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(tmp.iterdir()) if p.is_file()}
    (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=1) + "\n")
    if final.exists():  # a previous save of the same step (a resumed run): keep it aside
        final.rename(final.with_name(f"{final.name}.replaced-{os.getpid()}"))
    os.replace(tmp, final)
    return final


def load_adapter(model, folder: str | Path) -> None:
    """Load the adapter weights saved in ``folder`` into ``model`` (a peft model)."""
    weights = load_file(str(Path(folder) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, weights)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise CheckpointError(f"{folder}: adapter weights do not fit the model: "
                              f"{unexpected[:3]}")


def load_checkpoint(folder: str | Path, model, optimizer, rank: int = 0,
                    world_size: int = 1) -> int:
    """Restore adapter, optimizer and RNG states from ``folder``; return its step.

    Every rank of a K-process run loads the same folder; rank ``r`` takes its own RNG
    states when the checkpoint was written by a run with the same K. Otherwise (K
    changed) rank 0 takes the saved ones and rank ``r > 0`` reseeds from (seed, rank,
    step): the run continues, but not as it would have with the old K.
    """
    folder = Path(folder)
    load_adapter(model, folder)
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    step = int(json.loads((folder / "state.json").read_text())["step"])
    state = torch.load(folder / "rng.pt", weights_only=True)
    ranks = state.pop("ranks", None)
    if world_size > 1 and ranks is not None and len(ranks) == world_size:
        set_rng_states(ranks[rank])
    elif rank == 0:
        set_rng_states(state)
    else:
        seed = TrainConfig.from_json(folder / "config.json").seed
        torch.manual_seed(int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0]))
    return step
