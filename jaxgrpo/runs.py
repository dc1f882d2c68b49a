"""Running many seeds of a program (the counting task, or the LM lab) and writing what
they produced.

Used by the CLI and the benchmark: one place for "train S seeds with implementation X,
timed", the per-step metrics table, the summary statistics and the learning-curve plot.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from grpospec import CountingConfig
from grpospec.lm import LMConfig

IMPLS = ("jax", "torch")


@dataclass(frozen=True)
class RunResult:
    """Metrics with a leading seed axis, ``{name: (n_seeds, steps)}``, and timings (s)."""

    impl: str
    seeds: list[int]
    metrics: dict[str, np.ndarray]
    compile_s: float  # JAX: lowering + XLA compile; torch: 0
    run_s: float  # training itself, compile excluded


def compile_jax_seeds(cfg: CountingConfig | LMConfig, seeds: Sequence[int],
                      mesh: tuple[int, int] | None = None):
    """The compiled ``jit(vmap(train))`` for these seeds (sharded over a ``(seeds, data)``
    mesh when given) and its input keys: ``compiled(keys) -> (state, metrics)``."""
    import jax
    import jax.numpy as jnp

    from jaxgrpo.sharding import make_train  # the trainer of cfg's program

    keys = jax.vmap(jax.random.key)(jnp.asarray([int(s) for s in seeds], jnp.uint32))
    if mesh is None:
        program = jax.jit(jax.vmap(make_train(cfg)))
    else:
        from jaxgrpo.sharding import check_mesh_fits, make_mesh, sharded_train

        device_mesh = make_mesh(*mesh)
        check_mesh_fits(cfg, len(keys), device_mesh)
        program = sharded_train(cfg, device_mesh)
    return program.lower(keys).compile(), keys


def run_seeds(impl: str, cfg: CountingConfig | LMConfig, seeds: Sequence[int],
              on_seed_done: Callable[[int], None] | None = None,
              mesh: tuple[int, int] | None = None) -> RunResult:
    """Train ``len(seeds)`` independent runs: JAX vmapped in one compiled program (over a
    ``(seeds, data)`` device mesh when ``mesh`` is given), torch one after another
    (calling ``on_seed_done`` after each)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if mesh is not None and impl != "jax":
        raise ValueError("mesh is for impl='jax' only")
    seeds = [int(s) for s in seeds]
    if impl == "jax":
        import jax

        t0 = time.perf_counter()
        compiled, keys = compile_jax_seeds(cfg, seeds, mesh)
        t1 = time.perf_counter()
        _, metrics = jax.block_until_ready(compiled(keys))
        t2 = time.perf_counter()
        if on_seed_done is not None:
            for s in seeds:
                on_seed_done(s)
        return RunResult(impl, seeds, {k: np.asarray(metrics[k]) for k in cfg.metric_names},
                         t1 - t0, t2 - t1)
    if isinstance(cfg, LMConfig):
        from torchref.lm import train_lm as train
    else:
        from torchref import train_counting as train

    per_seed = []
    t0 = time.perf_counter()
    for s in seeds:
        per_seed.append(train(seed=s, **asdict(cfg)))
        if on_seed_done is not None:
            on_seed_done(s)
    run_s = time.perf_counter() - t0
    return RunResult(impl, seeds, {k: np.stack([m[k] for m in per_seed]) for k in cfg.metric_names},
                     0.0, run_s)


BANDIT_THETA = (0.5, -0.3, 1.0, 0.0, -1.0)
BANDIT_REWARDS = (1.0, 0.2, 0.8, 0.5, 0.0)


def reinforce_estimates(impl: str, theta, rewards, n: int, baseline: float, repeats: int,
                        seed: int) -> np.ndarray:
    """``repeats`` independent REINFORCE estimates (repeats, K), all from one seed:
    JAX splits one key and vmaps; torch draws from one ``torch.Generator`` in turn."""
    theta = np.asarray(theta, np.float32)
    rewards = np.asarray(rewards, np.float32)
    if impl == "jax":
        import jax

        import jaxgrpo

        keys = jax.random.split(jax.random.key(seed), repeats)
        return np.asarray(jaxgrpo.reinforce_gradients(theta, rewards, n, baseline, keys))
    if impl == "torch":
        import torch

        import torchref

        gen = torch.Generator().manual_seed(seed)
        t, r = torch.from_numpy(theta), torch.from_numpy(rewards)
        return np.stack([torchref.reinforce_gradient(t, r, n, baseline, gen).numpy()
                         for _ in range(repeats)])
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def bandit_report(impl: str, samples: int = 200_000, repeats: int = 600, batch: int = 32,
                  seed: int = 0) -> dict[str, float]:
    """REINFORCE on a fixed 5-armed bandit: the large-sample error against the exact
    gradient, and the total variance of small-batch estimates with b = 0 and b = E_pi[r]."""
    theta, rewards = np.asarray(BANDIT_THETA), np.asarray(BANDIT_REWARDS)
    pi = np.exp(theta - theta.max())
    pi /= pi.sum()
    exact = pi * (rewards - pi @ rewards)
    big = reinforce_estimates(impl, theta, rewards, samples, 0.0, 1, seed)[0]
    t0 = time.perf_counter()
    var0 = reinforce_estimates(impl, theta, rewards, batch, 0.0, repeats, seed + 1).var(0).sum()
    var_b = reinforce_estimates(impl, theta, rewards, batch, float(pi @ rewards), repeats,
                                seed + 2).var(0).sum()
    return {"max_abs_error": float(np.abs(big - exact).max()), "var_b0": float(var0),
            "var_mean_baseline": float(var_b), "variance_ratio": float(var_b / var0),
            "variance_check_s": time.perf_counter() - t0}


def mean_ci(values: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and a normal-approximation 95% interval of the mean (mean +- 1.96 SE) over
    ``axis``, ignoring NaN (undefined) entries; with one value the interval is the value
    itself, with none all three are NaN."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    n = finite.sum(axis=axis)
    safe = np.where(finite, values, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = safe.sum(axis=axis) / n
        dev = np.where(finite, values - np.expand_dims(mean, axis), 0.0)
        var = (dev**2).sum(axis=axis) / np.maximum(n - 1, 1)
        se = np.where(n > 1, np.sqrt(var / n), 0.0)
    return mean, mean - 1.96 * se, mean + 1.96 * se


def diff_ci(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """``mean(b) - mean(a)`` over independent runs, with a normal-approximation 95%
    interval (``+- 1.96 sqrt(SE_a^2 + SE_b^2)``), ignoring NaN entries: the interval
    excludes 0 when the difference is real at that level.

    >>> [round(x, 3) for x in diff_ci(np.array([0.0, 2.0]), np.array([3.0, 5.0]))]  # SEs 1, 1
    [3.0, 0.228, 5.772]
    """
    (ma, lo_a, _), (mb, lo_b, _) = mean_ci(a), mean_ci(b)
    se = np.hypot((ma - lo_a) / 1.96, (mb - lo_b) / 1.96)
    d = float(mb - ma)
    return d, d - 1.96 * float(se), d + 1.96 * float(se)


def seed_means(values: np.ndarray, last: int | None = None) -> np.ndarray:
    """Per-seed mean over steps (the last ``last`` steps, or all), ignoring NaN steps;
    NaN for a seed whose steps are all undefined. ``values``: (seeds, steps)."""
    values = np.asarray(values, dtype=np.float64)
    if last is not None:
        values = values[:, -last:]
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(finite, values, 0.0).sum(1) / finite.sum(1)


def summarize(result: RunResult, last: int = 5) -> dict[str, dict[str, float]]:
    """Start (step 0) and end (mean of the last ``last`` steps) of each metric, averaged
    over seeds with a 95% interval."""
    out = {}
    for name, m in result.metrics.items():
        start = mean_ci(m[:, 0])
        end = mean_ci(seed_means(m, last))
        out[name] = {"start": float(start[0]), "start_lo": float(start[1]),
                     "start_hi": float(start[2]), "end": float(end[0]),
                     "end_lo": float(end[1]), "end_hi": float(end[2])}
    return out


def write_metrics_csv(result: RunResult, path: Path) -> None:
    """One row per (seed, step): ``impl, seed, step, <metric>...``."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["impl", "seed", "step", *result.metrics])
        steps = next(iter(result.metrics.values())).shape[1]
        for i, seed in enumerate(result.seeds):
            for step in range(steps):
                writer.writerow([result.impl, seed, step,
                                 *(f"{result.metrics[k][i, step]:.6g}" for k in result.metrics)])


def write_summary_json(result: RunResult, cfg: CountingConfig | LMConfig, path: Path) -> None:
    path.write_text(json.dumps({
        "impl": result.impl, "seeds": result.seeds, "config": asdict(cfg),
        "compile_s": result.compile_s, "run_s": result.run_s, "summary": summarize(result),
    }, indent=2))


def plot_learning_curves(results: Sequence[RunResult], path: Path, title: str = "") -> None:
    """One panel per metric: the mean over seeds with its 95% interval as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results[0].metrics)
    cols = 3
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for r in results:
            mean, lo, hi = mean_ci(r.metrics[name])
            steps = np.arange(len(mean))
            label = f"{r.impl} ({len(r.seeds)} seeds)"
            ax.plot(steps, mean, label=label)
            ax.fill_between(steps, lo, hi, alpha=0.25)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title or "GRPO on the counting task: mean over seeds, band = 95% interval")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

