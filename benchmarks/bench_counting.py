"""Benchmark: the PyTorch reference vs the compiled JAX program, measured side by side.

    python benchmarks/bench_counting.py [--seeds 64] [--repeats 3]

Measures, in one run on this machine:
  1. one seed of the counting task end to end (80 GRPO steps): torch vs JAX, JAX with
     compile included (a fresh jit: lowering + XLA compile + run) and excluded;
  2. 64 seeds: JAX vmapped in one program vs torch one seed after another;
  3. the REINFORCE variance check (600 estimates of 32 samples, twice): both ways.
  4. 64 seeds on a CPU device mesh with one device per core (``--mesh Kx1``), so that
     XLA runs the seed shards on all cores at once (torch also uses every core).
Prints a table of times and ratios (torch time / JAX time), with the machine it ran on.
Timings are the median of ``--repeats`` runs.

To get one JAX CPU device per core, the script sets
``XLA_FLAGS=--xla_force_host_platform_device_count=<cores>`` before JAX starts (unless
XLA_FLAGS is already set); the single-device rows run on the first device as usual.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={os.cpu_count()}")

import jax  # noqa: E402  (after XLA_FLAGS)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from grpospec import CountingConfig  # noqa: E402
from jaxgrpo.runs import bandit_report, compile_jax_seeds, run_seeds  # noqa: E402


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _settle() -> None:
    """Let the other framework's worker threads go idle: right after torch work, its
    spinning OpenMP threads slow XLA by a third on 2 cores (and vice versa)."""
    time.sleep(1.0)


def _jax_run_time(cfg: CountingConfig, seeds: list[int], repeats: int, mesh=None) -> float:
    """Median time of the compiled program (compiled once, one warm-up call first)."""
    compiled, keys = compile_jax_seeds(cfg, seeds, mesh)
    jax.block_until_ready(compiled(keys))
    _settle()
    return _median_time(lambda: jax.block_until_ready(compiled(keys)), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=64, help="seeds of the many-seed case")
    parser.add_argument("--repeats", type=int, default=7, help="timing repeats (median)")
    args = parser.parse_args()
    cfg = CountingConfig()

    rows = []
    # 1. one seed
    torch_one = _median_time(lambda: run_seeds("torch", cfg, [0]), args.repeats)
    _settle()
    jax_first = run_seeds("jax", cfg, [0])  # fresh jit of this config: compile + run
    jax_one = _jax_run_time(cfg, [0], args.repeats)
    rows.append(("1 seed, torch", torch_one, None))
    rows.append(("1 seed, JAX incl. compile", jax_first.compile_s + jax_first.run_s,
                 torch_one / (jax_first.compile_s + jax_first.run_s)))
    rows.append(("1 seed, JAX after compile", jax_one, torch_one / jax_one))

    # 2. many seeds
    seeds = list(range(args.seeds))
    _settle()
    t_many = run_seeds("torch", cfg, seeds)
    _settle()
    j_many_first = run_seeds("jax", cfg, seeds)
    j_many = _jax_run_time(cfg, seeds, args.repeats)
    rows.append((f"{args.seeds} seeds, torch sequential", t_many.run_s, None))
    rows.append((f"{args.seeds} seeds, JAX vmapped incl. compile",
                 j_many_first.compile_s + j_many_first.run_s,
                 t_many.run_s / (j_many_first.compile_s + j_many_first.run_s)))
    rows.append((f"{args.seeds} seeds, JAX vmapped after compile", j_many,
                 t_many.run_s / j_many))
    rows.append((f"{args.seeds} JAX seeds vs 1 torch seed", j_many, torch_one / j_many))
    n_dev = len(jax.devices())
    if n_dev > 1 and args.seeds % n_dev == 0:
        mesh = (n_dev, 1)
        j_mesh = _jax_run_time(cfg, seeds, args.repeats, mesh)
        rows.append((f"{args.seeds} seeds, JAX on a {n_dev}x1 CPU mesh (a device per core)",
                     j_mesh, t_many.run_s / j_mesh))
        rows.append((f"{args.seeds} JAX seeds on the mesh vs 1 torch seed", j_mesh,
                     torch_one / j_mesh))

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
          f"threads), jax {jax.__version__} on {jax.devices()[0].platform} "
          f"({len(jax.devices())} devices)")
    print(f"final reward over {args.seeds} seeds: torch {end_reward['torch']:.3f}, "
          f"JAX {end_reward['jax']:.3f}")
    print()
    print("| case | time (s) | speed-up vs torch |")
    print("|---|---:|---:|")
    for name, t, ratio in rows:
        print(f"| {name} | {t:.4f} | {'' if ratio is None else f'{ratio:.1f}x'} |")


if __name__ == "__main__":
    main()
