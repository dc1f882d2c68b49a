"""Evaluation: the trained policy against the starting model on a fixed held-out set.

Both are the same peft model: the starting model is the adapter disabled (LoRA starts
at B = 0, so it equals the base). Decoding is greedy. The accuracy difference gets a
paired bootstrap 95% interval (problems resampled with replacement, both models' results
kept together); sample completions of each model are written with checker-exploit flags.
"""

from __future__ import annotations

import dataclasses
import json
import os
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from scaleup.checkpoint import load_adapter, usable_checkpoint
from scaleup.config import EvalConfig, TrainConfig
from scaleup.modeling import load_policy, stop_token_ids
from scaleup.rollout import sample_rollouts
from scaleup.tasks import (
    EVAL_SHARE,
    ArithmeticTask,
    DatasetTask,
    Problem,
    check_gsm8k_held_out,
    exploit_flags,
    load_gsm8k,
)
from scaleup.train import task_of


def held_out_problems(cfg: TrainConfig, n: int) -> tuple[list[Problem], dict]:
    """The evaluation set and how it was held out (the record ``eval.json`` keeps).

    * arithmetic: up to ``n`` problems of the reserved split (:func:`scaleup.tasks.held_out`),
      which training never draws; every training problem of the run is regenerated and
      checked against the set (the overlap is 0 by construction, and recorded);
    * GSM8K: the first ``n`` problems of ``--eval-data``, a file other than ``--data``
      with no question in common with it (:func:`scaleup.tasks.check_gsm8k_held_out`);
    * digit: its single instruction (nothing to hold out).
    """
    task = task_of(cfg)
    if isinstance(task, DatasetTask):
        record = check_gsm8k_held_out(cfg.data, cfg.eval_data, cfg.allow_overlap)
        return load_gsm8k(cfg.eval_data)[:n], record
    if isinstance(task, ArithmeticTask):
        problems = task.eval_problems(n, cfg.seed)
        trained = {p.prompt for step in range(cfg.steps)
                   for p in task.sample(cfg.prompts_per_step, cfg.seed, step)}
        overlap = sum(p.prompt in trained for p in problems)
        if overlap:  # impossible by construction; a guard against a future change
            raise RuntimeError(f"{overlap} evaluation problems were also trained on")
        return problems, {
            "rule": f"reserved split: blake2b('a op b') % {EVAL_SHARE} == 0, never drawn "
                    "for training", "share": 1 / EVAL_SHARE,
            "training_problems_checked": len(trained), "overlapping_problems": overlap}
    return task.sample(n, cfg.seed, 0), {"rule": "none: the digit task has one prompt"}


def paired_bootstrap(a: np.ndarray, b: np.ndarray, n_boot: int = EvalConfig.n_boot,
                     seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """``mean(a - b)`` and its percentile bootstrap interval, resampling pairs.

    Args:
      a, b: per-problem scores of two models on the same problems, shape (n,).
      n_boot: bootstrap resamples.
      seed: seeds the resampling.
      level: the interval's coverage.
    Returns:
      ``(difference, low, high)``.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"a and b must be 1-D of the same non-zero length, got shapes "
                         f"{a.shape} and {b.shape}")
    d = a - b
    idx = np.random.default_rng(seed).integers(0, d.size, size=(n_boot, d.size))
    means = d[idx].mean(axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(d.mean()), float(lo), float(hi)


def run_model(model, tokenizer, task, problems: list[Problem], max_new_tokens: int,
              batch_size: int, stop_ids: list[int], device: torch.device,
              adapter: bool = True, progress=None, sampler=None) -> list[dict]:
    """Greedy completions of every problem, scored; ``adapter=False`` evaluates the
    starting model. Returns one record per problem; ``progress(k)`` is called after each
    batch of ``k`` problems. ``sampler`` (``--rollout vllm``, serving the adapter)
    decodes instead of ``generate``."""
    records = []
    for start in range(0, len(problems), batch_size):
        chunk = problems[start:start + batch_size]
        if sampler is not None:
            roll = sampler.sample(tokenizer, chunk, 1, max_new_tokens, stop_ids, device,
                                  greedy=True, adapter=adapter)
        else:
            ctx = nullcontext() if adapter else model.disable_adapter()
            with ctx:
                roll = sample_rollouts(model, tokenizer, chunk, 1, max_new_tokens, stop_ids,
                                       device, greedy=True)
        for text, prob, trunc in zip(roll.texts, chunk, roll.truncated.tolist(), strict=True):
            records.append({"prompt": prob.prompt, "answer": prob.answer, "completion": text,
                            "correct": task.score(text, prob), "truncated": bool(trunc),
                            "flags": exploit_flags(text, bool(trunc))})
        if progress is not None:
            progress(len(chunk))
    return records


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so a reader (or
    a second run at the same moment) never sees a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def evaluate_run(output_dir: str | Path, n_problems: int = EvalConfig.n_problems,
                 batch_size: int = EvalConfig.batch_size, max_new_tokens: int | None = None,
                 n_boot: int = EvalConfig.n_boot, n_samples: int = EvalConfig.n_samples,
                 device: str | None = None, eval_data: str | None = None,
                 allow_overlap: bool | None = None, show_progress: bool = False,
                 rollout: str | None = None) -> dict:
    """Evaluate the newest complete checkpoint of the run in ``output_dir`` against the
    starting model, on a held-out set (:func:`held_out_problems`).

    ``eval_data`` / ``allow_overlap`` / ``rollout`` override the run's ``--eval-data`` /
    ``--allow-overlap`` / ``--rollout`` (``vllm``: greedy decoding by a vLLM engine
    serving the checkpoint's adapter; the starting model is the engine without it).
    Writes ``eval.json`` (accuracies, difference, 95% interval, exploit-flag counts,
    and how the set was held out) and ``eval_samples.jsonl`` (``n_samples`` completions
    of each model) into the folder.
    """
    out = Path(output_dir)
    ckpt = usable_checkpoint(out, say=lambda m: tqdm.write(m))
    cfg = TrainConfig.from_json(ckpt / "config.json")
    if device is not None:
        cfg.device = device
    if eval_data is not None:
        cfg.eval_data = eval_data
    if allow_overlap is not None:
        cfg.allow_overlap = allow_overlap
    if rollout is not None:
        cfg.rollout = rollout
        cfg.validate()
    task = task_of(cfg)
    problems, held_out = held_out_problems(cfg, n_problems)
    model, tokenizer, dev = load_policy(cfg)
    load_adapter(model, ckpt)
    stops = stop_token_ids(tokenizer, model)
    max_new = max_new_tokens or cfg.max_new_tokens
    sampler = None
    if cfg.rollout == "vllm":
        from scaleup.train import make_sampler

        sampler = make_sampler(dataclasses.replace(cfg, max_new_tokens=max_new), model,
                               tokenizer, dev)
        sampler.sync(model)  # the checkpoint's adapter, loaded above
    with tqdm(total=2 * len(problems), desc="eval", unit="problem",
              disable=not show_progress, dynamic_ncols=True) as bar:
        final = run_model(model, tokenizer, task, problems, max_new, batch_size, stops, dev,
                          True, bar.update, sampler)
        start = run_model(model, tokenizer, task, problems, max_new, batch_size, stops, dev,
                          False, bar.update, sampler)
    if sampler is not None:
        sampler.close()
    a = np.array([r["correct"] for r in final])
    b = np.array([r["correct"] for r in start])
    diff, lo, hi = paired_bootstrap(a, b, n_boot, cfg.seed)
    result = {
        "checkpoint": str(ckpt), "n_problems": len(problems), "rollout": cfg.rollout,
        "accuracy_final": float(a.mean()), "accuracy_start": float(b.mean()),
        "difference": diff, "ci95": [lo, hi], "held_out": held_out,
        "flags_final": _flag_counts(final), "flags_start": _flag_counts(start),
    }
    write_atomic(out / "eval.json", json.dumps(result, indent=2) + "\n")
    write_atomic(out / "eval_samples.jsonl", "".join(
        json.dumps({"model": name, **r}) + "\n"
        for name, recs in (("final", final), ("start", start)) for r in recs[:n_samples]))
    return result


def _flag_counts(records: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        for flag in r["flags"]:
            counts[flag] = counts.get(flag, 0) + 1
    return counts
