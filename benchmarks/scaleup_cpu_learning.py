"""Evidence that the scale-up GRPO loop learns, on CPU in under a minute.

The tiny random-initialised Qwen2 (``scaleup.tiny``: 2 layers, hidden 64, byte-level
vocabulary of 272) is trained with GRPO + LoRA through the same ``scaleup.train.train``
that the CLI runs, on the ``digit`` task: "Start your reply with a digit.", reward 1 when
the completion's first character is 0-9. The untrained model does so with probability
about 10/272; the script prints the reward curve, the mean of the first and last steps
for each seed, and the greedy evaluation against the starting model.

    python benchmarks/scaleup_cpu_learning.py [--steps 60] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from scaleup.config import TrainConfig
from scaleup.evaluate import evaluate_run
from scaleup.tiny import save_tiny
from scaleup.train import train


def run(seed: int, steps: int, root: Path) -> dict:
    """Train one seed; return its reward curve and evaluation."""
    model_dir = save_tiny(root / f"model_{seed}", seed=seed)
    cfg = TrainConfig(model=str(model_dir), output_dir=str(root / f"run_{seed}"), task="digit",
                      device="cpu", steps=steps, prompts_per_step=8, group_size=8,
                      max_new_tokens=4, micro_batch_size=64, lora_r=16, lora_alpha=32,
                      learning_rate=1e-2, save_every=steps, seed=seed)
    t0 = time.perf_counter()
    log = train(cfg, show_progress=False)["log"]
    seconds = time.perf_counter() - t0
    rewards = np.array([r["mean_reward"] for r in log])
    ev = evaluate_run(cfg.output_dir, n_problems=64, batch_size=64, n_boot=2000)
    return {"seed": seed, "seconds": seconds, "rewards": rewards.round(4).tolist(),
            "first5": float(rewards[:5].mean()), "last10": float(rewards[-10:].mean()),
            "entropy_first": log[0]["entropy"], "entropy_last": log[-1]["entropy"],
            "eval_start": ev["accuracy_start"], "eval_final": ev["accuracy_final"],
            "eval_ci95": ev["ci95"]}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60, help="GRPO steps per seed (default 60)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            r = run(seed, args.steps, Path(tmp))
            results.append(r)
            print(f"seed {seed}: mean reward first 5 steps {r['first5']:.3f} -> last 10 steps "
                  f"{r['last10']:.3f}; entropy {r['entropy_first']:.2f} -> "
                  f"{r['entropy_last']:.2f}; greedy eval {r['eval_start']:.2f} -> "
                  f"{r['eval_final']:.2f}; {r['seconds']:.1f} s")
            print("  rewards:", " ".join(f"{x:.2f}" for x in r["rewards"]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
