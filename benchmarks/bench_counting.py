"""Benchmark: the PyTorch reference vs the compiled JAX program, measured side by side.

    python benchmarks/bench_counting.py [--seeds 64] [--repeats 3]

Measures, in one run on this machine:
  1. one seed of the counting task end to end (80 GRPO steps): torch vs JAX, JAX with
     compile included (a fresh jit: lowering + XLA compile + run) and excluded;
  2. 64 seeds: JAX vmapped in one program vs torch one seed after another;
  3. the REINFORCE variance check (600 estimates of 32 samples, twice): both ways.
Prints a table of times and ratios (torch time / JAX time), with the machine it ran on.
Timings are the median of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import jax
import numpy as np
import torch

from grpospec import CountingConfig
from jaxgrpo.runs import bandit_report, run_seeds


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=64, help="seeds of the many-seed case")
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats (median)")
    args = parser.parse_args()
    cfg = CountingConfig()

    rows = []
    # 1. one seed
    torch_one = _median_time(lambda: run_seeds("torch", cfg, [0]), args.repeats)
    jax_first = run_seeds("jax", cfg, [0])  # fresh jit of this config: compile + run
    jax_one = statistics.median(run_seeds("jax", cfg, [0]).run_s for _ in range(args.repeats))
    rows.append(("1 seed, torch", torch_one, None))
    rows.append(("1 seed, JAX incl. compile", jax_first.compile_s + jax_first.run_s,
                 torch_one / (jax_first.compile_s + jax_first.run_s)))
    rows.append(("1 seed, JAX after compile", jax_one, torch_one / jax_one))

    # 2. many seeds
    seeds = list(range(args.seeds))
    t_many = run_seeds("torch", cfg, seeds)
    j_many_first = run_seeds("jax", cfg, seeds)
    j_many = statistics.median(run_seeds("jax", cfg, seeds).run_s for _ in range(args.repeats))
    rows.append((f"{args.seeds} seeds, torch sequential", t_many.run_s, None))
    rows.append((f"{args.seeds} seeds, JAX vmapped incl. compile",
                 j_many_first.compile_s + j_many_first.run_s,
                 t_many.run_s / (j_many_first.compile_s + j_many_first.run_s)))
    rows.append((f"{args.seeds} seeds, JAX vmapped after compile", j_many,
                 t_many.run_s / j_many))
    rows.append((f"{args.seeds} JAX seeds vs 1 torch seed", j_many, torch_one / j_many))

    # 3. REINFORCE variance check (first JAX call compiles; the second is timed)
    t_var = statistics.median(bandit_report("torch")["variance_check_s"]
                              for _ in range(args.repeats))
    bandit_report("jax")
    j_var = statistics.median(bandit_report("jax")["variance_check_s"]
                              for _ in range(args.repeats))
    rows.append(("REINFORCE 2x600x32, torch", t_var, None))
    rows.append(("REINFORCE 2x600x32, JAX after compile", j_var, t_var / j_var))

    end_reward = {
        "torch": float(np.mean(t_many.metrics["mean_reward"][:, -5:])),
        "jax": float(np.mean(j_many_first.metrics["mean_reward"][:, -5:])),
    }
    print(f"machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores; torch {torch.__version__} ({torch.get_num_threads()} "
          f"threads), jax {jax.__version__} on {jax.devices()[0].platform}")
    print(f"final reward over {args.seeds} seeds: torch {end_reward['torch']:.3f}, "
          f"JAX {end_reward['jax']:.3f}")
    print()
    print("| case | time (s) | speed-up vs torch |")
    print("|---|---:|---:|")
    for name, t, ratio in rows:
        print(f"| {name} | {t:.4f} | {'' if ratio is None else f'{ratio:.1f}x'} |")


if __name__ == "__main__":
    main()
