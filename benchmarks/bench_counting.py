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
import dataclasses
import os
import platform
import statistics
import time

os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={os.cpu_count()}")

import jax  # noqa: E402  (after XLA_FLAGS)
import torch  # noqa: E402

from grpospec import CountingConfig  # noqa: E402
from jaxgrpo.runs import (  # noqa: E402
    bandit_report,
    compile_jax_seeds,
    mean_ci,
    run_jax,
    run_seeds,
    seed_means,
)


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


def _jax_run_time(cfg: CountingConfig, seeds: list[int], repeats: int, mesh=None,
                  as_the_cli_runs: bool = False) -> float:
    """Median time of the compiled program (compiled once, one warm-up call first): the
    whole run in one call without progress reports, or (``as_the_cli_runs``) as
    ``jaxgrpo counting`` runs it: in chunks of a tenth of the steps, reporting progress
    from inside the program (about 20 reports a run)."""
    if as_the_cli_runs:
        program = compile_jax_seeds(cfg, seeds, mesh)
    else:
        program = compile_jax_seeds(cfg, seeds, mesh, chunk_steps=cfg.steps, progress_every=0)
    run_jax(program, cfg, lambda _: None)
    _settle()
    return _median_time(lambda: run_jax(program, cfg, lambda _: None), repeats)


def progress_overhead(cfg: CountingConfig, seeds: list[int], repeats: int) -> dict[str, float]:
    """What the CLI's chunks and progress reports cost: the run as the CLI runs it, and in
    the same chunks without reports, each timed right after the one-call run (calls
    interleaved, so a busy machine slows all three alike), as medians of the per-round
    ratios of wall time and of process CPU time."""
    programs = {"one call": compile_jax_seeds(cfg, seeds, chunk_steps=cfg.steps,
                                              progress_every=0),
                "chunks": compile_jax_seeds(cfg, seeds, progress_every=0),
                "cli": compile_jax_seeds(cfg, seeds)}
    for p in programs.values():
        run_jax(p, cfg, lambda _: None)
    wall = {k: [] for k in programs}
    cpu = {k: [] for k in programs}
    for _ in range(repeats):
        for k, p in programs.items():
            w, c = time.perf_counter(), time.process_time()
            run_jax(p, cfg, lambda _: None)
            wall[k].append(time.perf_counter() - w)
            cpu[k].append(time.process_time() - c)
    out = {}
    for k in ("chunks", "cli"):
        for name, t in (("wall", wall), ("cpu", cpu)):
            out[f"{k}/{name}"] = statistics.median(
                a / b for a, b in zip(t[k], t["one call"], strict=True))
    return out


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
    j_cli = _jax_run_time(cfg, seeds, args.repeats, as_the_cli_runs=True)
    rows.append((f"{args.seeds} seeds, JAX in 10 chunks with progress reports (the CLI)",
                 j_cli, t_many.run_s / j_cli))
    overhead = progress_overhead(cfg, seeds, max(args.repeats, 9))
    long_cfg = dataclasses.replace(cfg, steps=10 * cfg.steps)
    long_overhead = progress_overhead(long_cfg, seeds, 3)
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

    end_reward = {impl: mean_ci(seed_means(r.metrics["mean_reward"], 5))
                  for impl, r in (("torch", t_many), ("jax", j_many_first))}
    print(f"machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores; torch {torch.__version__} ({torch.get_num_threads()} "
          f"threads), jax {jax.__version__} on {jax.devices()[0].platform} "
          f"({len(jax.devices())} devices)")
    print(f"final reward (mean of the last 5 steps) over {args.seeds} seeds, with a bootstrap "
          "95% interval over seeds (the two frameworks sample different completions, so "
          "they agree in distribution, not seed by seed):")
    for impl, (m, lo, hi) in end_reward.items():
        print(f"  {impl:5s} {float(m):.3f} [{float(lo):.3f}, {float(hi):.3f}]")
    print()
    print("| case | time (s) | speed-up vs torch |")
    print("|---|---:|---:|")
    for name, t, ratio in rows:
        print(f"| {name} | {t:.4f} | {'' if ratio is None else f'{ratio:.1f}x'} |")
    for steps, o in ((cfg.steps, overhead), (long_cfg.steps, long_overhead)):
        print(f"\n{steps} steps, {args.seeds} seeds, as the CLI runs them (10 chunks, "
              f"~20 progress reports) vs one call without reports, median ratio of "
              f"interleaved runs: wall {o['cli/wall']:.3f}x, CPU {o['cli/cpu']:.3f}x "
              f"(the chunks alone: wall {o['chunks/wall']:.3f}x, CPU {o['chunks/cpu']:.3f}x)")


if __name__ == "__main__":
    main()
