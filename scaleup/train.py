"""The training loop: steps, logs (console + JSONL), checkpoints, resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from tqdm.auto import tqdm

from scaleup.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from scaleup.config import ConfigError, TrainConfig
from scaleup.modeling import load_policy, stop_token_ids
from scaleup.step import grpo_step
from scaleup.tasks import make_task

LOG_NAME = "log.jsonl"
CONSOLE_KEYS = ("mean_reward", "zero_var_frac", "len_correct", "len_incorrect",
                "truncated_frac", "entropy", "clip_frac", "kl", "step_time_s",
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

    Args:
      cfg: the configuration.
      resume: continue the run in ``cfg.output_dir``.
      stop_after: stop after this many steps of this call, as if interrupted (for tests).
      show_progress: draw a progress bar and print one line per step.
    Returns:
      ``{"model", "tokenizer", "log", "output_dir"}``.
    """
    if resume:
        out = prepare_output_dir(cfg.output_dir, resume)
        cfg = TrainConfig.from_json(out / "config.json")
        cfg.output_dir = str(out)
    cfg.validate()
    task = task_of(cfg)
    if not resume:
        out = prepare_output_dir(cfg.output_dir, resume)
    model, tokenizer, device = load_policy(cfg)
    optimizer = make_optimizer(model, cfg)
    stops = stop_token_ids(tokenizer, model)
    log_path = out / LOG_NAME
    start = 0
    if resume:
        start = load_checkpoint(latest_checkpoint(out), model, optimizer)
        _truncate_log(log_path, start)
    else:
        cfg.to_json(out / "config.json")
        torch.manual_seed(cfg.seed)
    bar = tqdm(total=cfg.steps, initial=start, desc="GRPO", disable=not show_progress,
               dynamic_ncols=True)
    done = 0
    for step in range(start, cfg.steps):
        if stop_after is not None and done >= stop_after:
            break
        metrics = grpo_step(model, tokenizer, optimizer, task, step, cfg, stops, device)
        append_log(log_path, metrics)
        if show_progress:
            tqdm.write(console_line(metrics))
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['mean_reward']:.3f}")
        done += 1
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(out, step + 1, model, optimizer, cfg)
    bar.close()
    return {"model": model, "tokenizer": tokenizer, "log": read_log(log_path),
            "output_dir": out}


__all__ = ["ConfigError", "OutputDirError", "read_log", "train"]
