"""The training loop: steps, logs (console + JSONL), checkpoints, resume."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch
from tqdm.auto import tqdm

from grpospec.outdir import OutputFolderError, claim_output_dir
from scaleup.checkpoint import (
    CheckpointError,
    load_checkpoint,
    rng_states,
    save_checkpoint,
    usable_checkpoint,
)
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
from scaleup.tasks import check_gsm8k_held_out, make_task

LOG_NAME = "log.jsonl"
CONSOLE_KEYS = ("mean_reward", "frac_reward_zero_std", "len_correct", "len_incorrect",
                "truncated_frac", "entropy", "clip_ratio/region_mean", "kl", "step_time_s",
                "sample_tokens_per_s", "peak_mem_gb")


#: tokens of prompt the vLLM engine has room for (its max_model_len less max-new-tokens)
PROMPT_ROOM = 2048

OutputDirError = OutputFolderError  # the output folder cannot be used as asked


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
    """A one-line summary of a step's metrics: the same step number as ``log.jsonl``
    (counted from 0); a metric that is not computed (null in the log) is left out."""
    parts = [f"step {m['step']}"]
    for k in CONSOLE_KEYS:
        v = m.get(k)
        if v is not None and math.isfinite(v):
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


def set_threads(cfg: TrainConfig, device: torch.device) -> int:
    """Torch's CPU threads for this run: ``--threads``, else 1 on CPU (see
    ``benchmarks/bench_threads.py``: on a machine that is doing anything else, torch's
    OpenMP threads spin and wait for each other, up to 60x slower than one thread), else
    torch's own default (a GPU run's CPU side does little). Returns the number set."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    elif device.type == "cpu":
        torch.set_num_threads(1)
    return torch.get_num_threads()


def make_sampler(cfg: TrainConfig, model, tokenizer, device: torch.device):
    """``--rollout vllm``: the colocated vLLM engine (:class:`scaleup.vllm_rollout.
    VllmSampler`), loaded from the base model; ``hf``: None (``generate``)."""
    if cfg.rollout != "vllm":
        return None
    from scaleup.vllm_rollout import VllmSampler, VllmUnavailable

    if world_size() > 1:
        raise VllmUnavailable(f"--rollout vllm runs in one process (an engine per rank is "
                              f"not supported yet); got {world_size()} processes")
    max_len = min(_model_max_len(model), PROMPT_ROOM + cfg.max_new_tokens)
    return VllmSampler(cfg.model, next(model.parameters()).dtype, device, cfg.lora_r, max_len,
                       cfg.vllm_gpu_memory_utilization, cfg.vllm_enable_sleep_mode, cfg.seed,
                       cfg.vllm_enforce_eager, cfg.vllm_weight_sync, cfg.threads)


def _model_max_len(model) -> int:
    return int(getattr(model.config, "max_position_embeddings", 32768) or 32768)


def make_tracker(cfg: TrainConfig, out: Path):
    """``--report-to``: a :class:`scaleup.tracking.Tracker` (None for ``none``)."""
    if cfg.report_to == "none":
        return None
    from scaleup.tracking import make_tracker as make

    return make(cfg, out)


def check_held_out(cfg: TrainConfig) -> None:
    """Fail before training when the GSM8K evaluation file given is not held out."""
    if cfg.task == "gsm8k" and cfg.eval_data:
        check_gsm8k_held_out(cfg.data, cfg.eval_data, cfg.allow_overlap)


def train(cfg: TrainConfig, resume: bool = False, stop_after: int | None = None,
          show_progress: bool = True, say=None) -> dict:
    """Run (or, with ``resume``, continue) GRPO training as ``cfg`` says.

    A new run claims a new (or empty) ``cfg.output_dir``; by default a fresh
    ``runs/grpo-scaleup-<time>``. It holds a lock on the folder while it runs, so a second
    run started at the same moment is refused rather than writing into it, and a start
    that fails before the first step leaves no empty folder behind.

    With ``resume`` the run's saved config is used (``cfg`` only names the folder) and
    training continues from its newest complete checkpoint (a damaged newer one is
    reported and skipped, never deleted) with its adapter, optimizer and RNG states, so
    the result equals that of an uninterrupted run.

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
      say: where messages go (default: ``tqdm.write`` on rank 0).
    Returns:
      ``{"model", "tokenizer", "log", "output_dir", "rank", "world_size"}``.
    """
    say = say or (lambda m: tqdm.write(m) if is_main() else None)
    if resume:
        if not cfg.output_dir:
            raise OutputDirError("--resume needs --output-dir, the run folder to continue")
        out = Path(cfg.output_dir)
        if not out.is_dir():
            raise OutputDirError(f"--output-dir {str(out)!r} does not exist: nothing to resume")
        ckpt = usable_checkpoint(out, say)
        cfg = TrainConfig.from_json(ckpt / "config.json")  # validated with the checkpoint
        cfg.output_dir = str(out)
        say(f"resuming {out} from {ckpt.name} with its saved config")
    cfg.validate()
    check_held_out(cfg)
    if cfg.rollout == "vllm":  # before anything is loaded or created
        from scaleup.vllm_rollout import import_vllm

        import_vllm(torch.device("cuda" if cfg.device.startswith("cuda") or (
            cfg.device == "auto" and torch.cuda.is_available()) else "cpu"))
    setup = init_distributed(cfg.device)
    try:
        result = _train(cfg, resume, stop_after, show_progress, setup.device, say)
    except BaseException:
        finish_distributed(setup, ok=False)
        raise
    finish_distributed(setup)
    return result


def _train(cfg: TrainConfig, resume: bool, stop_after: int | None, show_progress: bool,
           device_name: str, say) -> dict:
    k, r, main = world_size(), rank(), is_main()
    check_divisible(cfg, k)
    task = task_of(cfg)
    folder = on_main_then_share(lambda: claim_output_dir(
        cfg.output_dir, "grpo-scaleup", "--output-dir", resume=resume))
    out = Path(folder.path)
    cfg.output_dir = str(out)
    started = False
    try:
        model, tokenizer, device = load_policy(dataclasses.replace(cfg, device=device_name))
        set_threads(cfg, device)
        optimizer = make_optimizer(model, cfg)
        stops = stop_token_ids(tokenizer, model)
        sampler = make_sampler(cfg, model, tokenizer, device)
        set_threads(cfg, device)  # again: vLLM's CPU worker binds its own threads
        tracker = make_tracker(cfg, out) if main else None
        log_path = out / LOG_NAME
        start = 0
        if resume:
            start = load_checkpoint(usable_checkpoint(out, lambda m: None), model, optimizer,
                                    r, k)
            if main:
                _truncate_log(log_path, start)
        else:
            if main:
                cfg.to_json(out / "config.json")
            torch.manual_seed(cfg.seed + r)  # each rank its own sampling stream
        ddp = wrap_ddp(model, device)
        show = show_progress and main
        bar = tqdm(total=cfg.steps, initial=start, desc="GRPO", disable=not show,
                   dynamic_ncols=True)
        done = 0
        for step in range(start, cfg.steps):
            if stop_after is not None and done >= stop_after:
                break
            metrics = grpo_step(model, tokenizer, optimizer, task, step, cfg, stops, device,
                                ddp, sampler)
            started = True
            if main:
                append_log(log_path, metrics)
                if tracker is not None:
                    tracker.log(metrics, step)
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
        if tracker is not None:
            tracker.close()
    except BaseException:
        if main and not resume and not started:
            (out / "config.json").unlink(missing_ok=True)
            folder.release_if_unused()
        raise
    finally:
        if main:
            folder.release()
        if "sampler" in locals() and sampler is not None:
            sampler.close()
    barrier()  # rank 0's last log line and checkpoint are written before anyone reads them
    return {"model": model, "tokenizer": tokenizer, "log": read_log(log_path),
            "output_dir": out, "rank": r, "world_size": k}


__all__ = ["CheckpointError", "ConfigError", "OutputDirError", "read_log", "train"]
