"""Evaluation: the trained policy against the starting model on a fixed held-out set.

Both are the same peft model: the starting model is the adapter disabled (LoRA starts
at B = 0, so it equals the base). Decoding is greedy. The accuracy difference gets a
paired bootstrap 95% interval (problems resampled with replacement, both models' results
kept together); sample completions of each model are written with checker-exploit flags.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from scaleup.checkpoint import latest_checkpoint, load_adapter
from scaleup.config import TrainConfig
from scaleup.modeling import load_policy, stop_token_ids
from scaleup.rollout import sample_rollouts
from scaleup.tasks import ArithmeticTask, DatasetTask, Problem, exploit_flags, load_gsm8k
from scaleup.train import OutputDirError, task_of

EVAL_STREAM = 1  # arithmetic training prompts use stream 0; the held-out set stream 1


def held_out_problems(cfg: TrainConfig, n: int) -> list[Problem]:
    """A fixed held-out set: arithmetic from its own random stream, GSM8K's first ``n``
    problems of ``--eval-data`` (else ``--data``), the digit task's instruction."""
    task = task_of(cfg)
    if isinstance(task, DatasetTask):
        return load_gsm8k(cfg.eval_data or cfg.data)[:n]
    if isinstance(task, ArithmeticTask):
        return task.sample(n, cfg.seed, 0, stream=EVAL_STREAM)
    return task.sample(n, cfg.seed, 0)


def paired_bootstrap(a: np.ndarray, b: np.ndarray, n_boot: int = 10_000, seed: int = 0,
                     level: float = 0.95) -> tuple[float, float, float]:
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
              adapter: bool = True) -> list[dict]:
    """Greedy completions of every problem, scored; ``adapter=False`` evaluates the
    starting model. Returns one record per problem."""
    records = []
    for start in range(0, len(problems), batch_size):
        chunk = problems[start:start + batch_size]
        ctx = nullcontext() if adapter else model.disable_adapter()
        with ctx:
            roll = sample_rollouts(model, tokenizer, chunk, 1, max_new_tokens, stop_ids, device,
                                   greedy=True)
        for text, prob, trunc in zip(roll.texts, chunk, roll.truncated.tolist(), strict=True):
            records.append({"prompt": prob.prompt, "answer": prob.answer, "completion": text,
                            "correct": task.score(text, prob), "truncated": bool(trunc),
                            "flags": exploit_flags(text, bool(trunc))})
    return records


def evaluate_run(output_dir: str | Path, n_problems: int = 200, batch_size: int = 16,
                 max_new_tokens: int | None = None, n_boot: int = 10_000, n_samples: int = 20,
                 device: str | None = None) -> dict:
    """Evaluate the last checkpoint of the run in ``output_dir`` against the starting model.

    Writes ``eval.json`` (accuracies, difference, 95% interval, exploit-flag counts) and
    ``eval_samples.jsonl`` (``n_samples`` completions of each model) into the folder.
    """
    out = Path(output_dir)
    ckpt = latest_checkpoint(out)
    if ckpt is None:
        raise OutputDirError(f"--output-dir {str(out)!r}: no checkpoint to evaluate")
    cfg = TrainConfig.from_json(ckpt / "config.json")
    if device is not None:
        cfg.device = device
    task = task_of(cfg)
    problems = held_out_problems(cfg, n_problems)
    model, tokenizer, dev = load_policy(cfg)
    load_adapter(model, ckpt)
    stops = stop_token_ids(tokenizer, model)
    max_new = max_new_tokens or cfg.max_new_tokens
    final = run_model(model, tokenizer, task, problems, max_new, batch_size, stops, dev, True)
    start = run_model(model, tokenizer, task, problems, max_new, batch_size, stops, dev, False)
    a = np.array([r["correct"] for r in final])
    b = np.array([r["correct"] for r in start])
    diff, lo, hi = paired_bootstrap(a, b, n_boot, cfg.seed)
    result = {
        "checkpoint": str(ckpt), "n_problems": len(problems),
        "accuracy_final": float(a.mean()), "accuracy_start": float(b.mean()),
        "difference": diff, "ci95": [lo, hi],
        "flags_final": _flag_counts(final), "flags_start": _flag_counts(start),
    }
    (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    with (out / "eval_samples.jsonl").open("w") as f:
        for name, recs in (("final", final), ("start", start)):
            for r in recs[:n_samples]:
                f.write(json.dumps({"model": name, **r}) + "\n")
    return result


def _flag_counts(records: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        for flag in r["flags"]:
            counts[flag] = counts.get(flag, 0) + 1
    return counts
