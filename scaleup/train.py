"""The training loop: steps, logs (console + JSONL), checkpoints, resume."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch
from tqdm.auto import tqdm

from scaleup.checkpoint import latest_checkpoint, load_checkpoint, rng_states, save_checkpoint
from scaleup.config import ConfigError, TrainConfig
from scaleup.distributed import (
    barrier,
    check_divisible,
    finish_distributed,
    gather_to_main,
    init_distributed,
    is_main,
    on_main_then_share,
    rank,
    world_size,
    wrap_ddp,
)
from scaleup.modeling import load_policy, stop_token_ids
from scaleup.step import grpo_step
from scaleup.tasks import make_task

LOG_NAME = "log.jsonl"
CONSOLE_KEYS = ("mean_reward", "frac_reward_zero_std", "len_correct", "len_incorrect",
                "truncated_frac", "entropy", "clip_ratio/region_mean", "kl", "step_time_s",
                "sample_tokens_per_s", "peak_mem_gb")


class OutputDirError(ValueError):
    """The output folder cannot be used as asked (exists without --resume, or no checkpoint)."""


def prepare_output_dir(path: str | Path, resume: bool) -> Path:
    """Create ``path`` for a new run, refusing one that exists and is not empty; with
    ``resume``, require a run folder that holds a checkpoint."""
    path = Path(path)
    if resume:
        if latest_checkpoint(path) is None:
            raise OutputDirError(f"--resume: no checkpoint found in {str(path)!r}")
        return path
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise OutputDirError(f"output folder {str(path)!r} already exists and is not empty; "
                             "choose another --output-dir or pass --resume to continue it")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def append_log(path: Path, metrics: dict) -> None:
    """One JSON object a line; NaN (e.g. KL when it is not computed) is written as null."""
    with path.open("a") as f:
        f.write(json.dumps({k: _jsonable(v) for k, v in metrics.items()}) + "\n")


def read_log(path: str | Path) -> list[dict]:
    """The records of a ``log.jsonl``."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _truncate_log(path: Path, step: int) -> None:
    """Keep only the records of steps before ``step`` (those the checkpoint contains)."""
    keep = [r for r in read_log(path) if r["step"] < step]
    path.write_text("".join(json.dumps(r) + "\n" for r in keep))


def console_line(m: dict) -> str:
    """A one-line summary of a step's metrics."""
    parts = [f"step {m['step'] + 1}"]
    for k in CONSOLE_KEYS:
        v = m.get(k)
        if v is not None:
            parts.append(f"{k}={v:.4g}")
    return " ".join(parts)


def task_of(cfg: TrainConfig):
    """The training task ``cfg`` names."""
    return make_task(cfg.task, digits=cfg.digits, operators=cfg.operators, data_path=cfg.data,
                     fallback_last_number=cfg.fallback_last_number)


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable (LoRA) parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)


def train(cfg: TrainConfig, resume: bool = False, stop_after: int | None = None,
          show_progress: bool = True) -> dict:
    """Run (or, with ``resume``, continue) GRPO training as ``cfg`` says.

    With ``resume`` the run's saved config is used (``cfg`` only names the folder) and
    training continues from the last checkpoint with its adapter, optimizer and RNG
    states, so the result equals that of an uninterrupted run.

    Under ``torchrun --nproc_per_node=K`` (WORLD_SIZE > 1 in the environment) this joins
    the process group (gloo on CPU, NCCL on GPU, one GPU per rank), and each rank samples
    and trains ``prompts_per_step / K`` prompts a step with its own sampling RNG
    (``seed + rank``), under DDP (see :mod:`scaleup.distributed`). Only rank 0 creates the
    run folder, writes the log, prints and checkpoints; every rank resumes from the same
    checkpoint.

    Args:
      cfg: the configuration.
      resume: continue the run in ``cfg.output_dir``.
      stop_after: stop after this many steps of this call, as if interrupted (for tests).
      show_progress: draw a progress bar and print one line per step (rank 0 only).
    Returns:
      ``{"model", "tokenizer", "log", "output_dir", "rank", "world_size"}``.
    """
    if resume:
        out = prepare_output_dir(cfg.output_dir, resume)
        cfg = TrainConfig.from_json(out / "config.json")
        cfg.output_dir = str(out)
    cfg.validate()
    setup = init_distributed(cfg.device)
    try:
        result = _train(cfg, resume, stop_after, show_progress, setup.device)
    except BaseException:
        finish_distributed(setup, ok=False)
        raise
    finish_distributed(setup)
    return result


def _train(cfg: TrainConfig, resume: bool, stop_after: int | None, show_progress: bool,
           device_name: str) -> dict:
    k, r, main = world_size(), rank(), is_main()
    check_divisible(cfg, k)
    task = task_of(cfg)
    out = Path(cfg.output_dir)
    if not resume:
        on_main_then_share(lambda: prepare_output_dir(cfg.output_dir, resume))
    model, tokenizer, device = load_policy(dataclasses.replace(cfg, device=device_name))
    optimizer = make_optimizer(model, cfg)
    stops = stop_token_ids(tokenizer, model)
    log_path = out / LOG_NAME
    start = 0
    if resume:
        start = load_checkpoint(latest_checkpoint(out), model, optimizer, r, k)
        if main:
            _truncate_log(log_path, start)
    else:
        if main:
            cfg.to_json(out / "config.json")
        torch.manual_seed(cfg.seed + r)  # each rank its own sampling stream
    ddp = wrap_ddp(model, device)
    show = show_progress and main
    bar = tqdm(total=cfg.steps, initial=start, desc="GRPO", disable=not show, dynamic_ncols=True)
    done = 0
    for step in range(start, cfg.steps):
        if stop_after is not None and done >= stop_after:
            break
        metrics = grpo_step(model, tokenizer, optimizer, task, step, cfg, stops, device, ddp)
        if main:
            append_log(log_path, metrics)
        if show:
            tqdm.write(console_line(metrics))
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['mean_reward']:.3f}")
        done += 1
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            rngs = gather_to_main(rng_states())  # a collective: every rank takes part
            if main:
                save_checkpoint(out, step + 1, model, optimizer, cfg, rngs)
    bar.close()
    barrier()  # rank 0's last log line and checkpoint are written before anyone reads them
    return {"model": model, "tokenizer": tokenizer, "log": read_log(log_path),
            "output_dir": out, "rank": r, "world_size": k}


__all__ = ["ConfigError", "OutputDirError", "read_log", "train"]
