"""Checkpoints: adapter, optimizer state, step, RNG states and config, every K steps.

Layout: ``<output_dir>/checkpoints/step_000010/`` holding ``adapter_model.safetensors`` +
``adapter_config.json`` (peft's ``save_pretrained``, loadable with
``PeftModel.from_pretrained``), ``optimizer.pt``, ``rng.pt``, ``state.json`` and
``config.json``. A checkpoint is written to a temporary folder and renamed into place,
so an interrupted save never leaves a half-written checkpoint behind.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from peft import set_peft_model_state_dict
from safetensors.torch import load_file

from scaleup.config import TrainConfig
from scaleup.distributed import is_distributed


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    """Folder of the checkpoint taken after ``step`` completed steps."""
    return Path(output_dir) / "checkpoints" / f"step_{step:06d}"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The checkpoint with the most steps, or ``None``."""
    root = Path(output_dir) / "checkpoints"
    found = sorted(p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit())
    return found[-1] if found else None


def rng_states() -> dict:
    """Every random state a step draws from: torch (CPU and CUDA), numpy, Python. In a
    K-process run, only the CUDA state of this rank's current device."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "python": random.getstate()}
    if torch.cuda.is_available():
        if is_distributed():  # one GPU per rank: touch only this rank's device
            state["cuda_current"] = torch.cuda.get_rng_state()
        else:
            state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_states(state: dict) -> None:
    """Restore what :func:`rng_states` returned."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
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
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def load_adapter(model, folder: str | Path) -> None:
    """Load the adapter weights saved in ``folder`` into ``model`` (a peft model)."""
    weights = load_file(str(Path(folder) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, weights)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"{folder}: adapter weights do not fit the model: {unexpected[:3]}")


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
    state = torch.load(folder / "rng.pt", weights_only=False)
    ranks = state.pop("ranks", None)
    if world_size > 1 and ranks is not None and len(ranks) == world_size:
        set_rng_states(ranks[rank])
    elif rank == 0:
        set_rng_states(state)
    else:
        seed = TrainConfig.from_json(folder / "config.json").seed
        torch.manual_seed(int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0]))
    return step
