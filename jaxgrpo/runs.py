"""Running many seeds of a program (the counting task, or the LM lab) and writing what
they produced.

Used by the CLI, the experiments and the benchmark: one place for "train S seeds with
implementation X, timed, with progress, interruptible", the per-step metrics table, the
summary statistics (a bootstrap 95% interval over seeds) and the learning-curve plot.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import math
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from grpospec import METRICS, CountingConfig
from grpospec.lm import LMConfig

IMPLS = ("jax", "torch")


@dataclass(frozen=True)
class RunResult:
    """Metrics with a leading seed axis, ``{name: (n_seeds, steps_done)}``, and timings (s).

    ``steps_done < steps`` (``interrupted``) when the run was stopped (Ctrl-C): the
    metrics then hold the steps (JAX) or the seeds (torch) that finished."""

    impl: str
    seeds: list[int]
    metrics: dict[str, np.ndarray]
    compile_s: float  # JAX: lowering + XLA compile; torch: 0
    run_s: float  # training itself, compile excluded
    steps: int = 0  # the configured steps
    interrupted: bool = False

    @property
    def steps_done(self) -> int:
        return next(iter(self.metrics.values())).shape[1] if self.metrics else 0


def default_chunk(steps: int) -> int:
    """Steps per compiled call of a long JAX run: about a tenth of the run, so Ctrl-C
    takes effect within a tenth of it and the progress bar moves at least ten times."""
    return max(1, math.ceil(steps / 10))


def default_progress_every(steps: int) -> int:
    """How often (in steps) the compiled program reports progress: about 20 reports a
    run, two per chunk. Each report is one host callback of a few milliseconds on this
    2-core CPU (bench_counting.py measures them): a report every step cost 1.3x on the
    80-step counting run, 20 reports are within the noise."""
    return max(1, steps // 20)


@dataclass(frozen=True)
class CompiledRun:
    """A JAX run compiled for a list of seeds: ``init(keys) -> runner``,
    ``chunk(runner, start) -> (runner, metrics)`` for ``chunk_steps`` steps, ``last`` for
    the remaining ``steps % chunk_steps`` (or ``None``), and the input ``keys``."""

    init: Callable
    chunk: Callable
    last: Callable | None
    chunk_steps: int
    keys: object


@functools.lru_cache(maxsize=32)
def _compiled(cfg: CountingConfig | LMConfig, seeds: tuple[int, ...], mesh: tuple[int, int] | None,
              chunk_steps: int, progress_every: int) -> CompiledRun:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxgrpo.sharding import make_trainer  # the trainer of cfg's program

    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
    if mesh is None:
        trainer = make_trainer(cfg, progress_every=progress_every)
        init = jax.jit(jax.vmap(trainer.init))
        run = jax.jit(jax.vmap(trainer.run, in_axes=(0, None, None)), static_argnums=2)
    else:
        from jaxgrpo.sharding import check_mesh_fits, make_mesh

        device_mesh = make_mesh(*mesh)
        check_mesh_fits(cfg, len(seeds), device_mesh)
        batch = NamedSharding(device_mesh, P("data")) if mesh[1] > 1 else None
        by_seed, replicated = NamedSharding(device_mesh, P("seeds")), NamedSharding(
            device_mesh, P())
        trainer = make_trainer(cfg, batch_sharding=batch, progress_every=progress_every)
        init = jax.jit(jax.vmap(trainer.init, spmd_axis_name="seeds"),
                       in_shardings=by_seed, out_shardings=by_seed)
        run = jax.jit(jax.vmap(trainer.run, in_axes=(0, None, None), spmd_axis_name="seeds"),
                      static_argnums=2, in_shardings=(by_seed, replicated),
                      out_shardings=(by_seed, by_seed))
    init_c = init.lower(keys).compile()
    runner = jax.eval_shape(init, keys)
    chunk_c = run.lower(runner, 0, chunk_steps).compile()
    rest = cfg.steps % chunk_steps
    last_c = run.lower(runner, 0, rest).compile() if rest else None
    return CompiledRun(init_c, chunk_c, last_c, chunk_steps, keys)


def compile_jax_seeds(cfg: CountingConfig | LMConfig, seeds: Sequence[int],
                      mesh: tuple[int, int] | None = None, chunk_steps: int | None = None,
                      progress_every: int | None = None) -> CompiledRun:
    """The compiled program for these seeds (vmapped; sharded over a ``(seeds, data)``
    mesh when given), cached: a second run of the same configuration compiles nothing."""
    chunk = chunk_steps or default_chunk(cfg.steps)
    every = default_progress_every(cfg.steps) if progress_every is None else progress_every
    return _compiled(cfg, tuple(int(s) for s in seeds), mesh, min(chunk, cfg.steps), every)


@contextlib.contextmanager
def _ctrl_c_sets(stop: threading.Event):
    """While chunks run, the first Ctrl-C (SIGINT) sets ``stop`` instead of raising (the
    next one raises as usual). A ``KeyboardInterrupt`` raised inside the program's
    progress callback, where the main thread may be when the signal lands, is swallowed
    by the XLA runtime, and the run would not stop. Only in the main thread (where
    Python handles signals); elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_jax(program: CompiledRun, cfg: CountingConfig | LMConfig,
            on_steps: Callable[[int], None] | None = None
            ) -> tuple[dict[str, np.ndarray], bool]:
    """Run a compiled program chunk by chunk: ``({metric: (seeds, steps_done)},
    interrupted)``. Ctrl-C stops it at the end of the running chunk, keeping every
    finished chunk. ``on_steps(done)`` hears the in-program progress reports."""
    import jax

    from jaxgrpo.counting import progress_listener

    runner = program.init(program.keys)
    parts: list[dict] = []
    done, interrupted = 0, False
    listener = on_steps if on_steps is not None else (lambda _: None)
    stop = threading.Event()
    with progress_listener(listener), _ctrl_c_sets(stop):
        try:
            while done < cfg.steps and not stop.is_set():
                n = min(program.chunk_steps, cfg.steps - done)
                step = program.chunk if n == program.chunk_steps else program.last
                runner, metrics = step(runner, done)
                parts.append(jax.device_get(metrics))
                done += n
        except KeyboardInterrupt:
            interrupted = True
    interrupted = interrupted or (stop.is_set() and done < cfg.steps)
    names = cfg.metric_names
    if not parts:
        return {k: np.zeros((len(program.keys), 0)) for k in names}, interrupted
    return {k: np.concatenate([np.asarray(p[k]) for p in parts], axis=1) for k in names}, \
        interrupted


def run_seeds(impl: str, cfg: CountingConfig | LMConfig, seeds: Sequence[int],
              on_progress: Callable[[int], None] | None = None,
              mesh: tuple[int, int] | None = None, chunk_steps: int | None = None) -> RunResult:
    """Train ``len(seeds)`` independent runs: JAX vmapped in one compiled program (over a
    ``(seeds, data)`` device mesh when ``mesh`` is given), run in chunks of steps; torch
    one seed after another.

    ``on_progress(k)`` is called with the number of newly finished steps of all seeds
    together (JAX: as the program reports them) or of the current seed (torch); a progress
    bar's total is ``steps`` for JAX and ``len(seeds) * steps`` for torch. Ctrl-C stops
    the run at the next chunk boundary (JAX) or step (torch) and returns what finished,
    ``interrupted=True``.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if mesh is not None and impl != "jax":
        raise ValueError("mesh is for impl='jax' only")
    seeds = [int(s) for s in seeds]
    progress = on_progress or (lambda _: None)
    if impl == "jax":
        t0 = time.perf_counter()
        program = compile_jax_seeds(cfg, seeds, mesh, chunk_steps)
        t1 = time.perf_counter()
        reported = [0]

        def on_steps(done):
            if done > reported[0]:
                progress(done - reported[0])
                reported[0] = done

        metrics, interrupted = run_jax(program, cfg, on_steps)
        return RunResult(impl, seeds, metrics, t1 - t0, time.perf_counter() - t1, cfg.steps,
                         interrupted)
    if isinstance(cfg, LMConfig):
        from torchref.lm import train_lm as train
    else:
        from torchref import train_counting as train

    per_seed = []
    interrupted = False
    t0 = time.perf_counter()
    try:
        for s in seeds:
            per_seed.append(train(seed=s, **asdict(cfg), on_step=lambda: progress(1)))
    except KeyboardInterrupt:
        interrupted = True
    run_s = time.perf_counter() - t0
    metrics = ({k: np.stack([m[k] for m in per_seed]) for k in cfg.metric_names} if per_seed
               else {k: np.zeros((0, 0)) for k in cfg.metric_names})
    return RunResult(impl, seeds[:len(per_seed)], metrics, 0.0, run_s, cfg.steps, interrupted)


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


def mean_ci(values: np.ndarray, axis: int = 0, n_boot: int = 1000, seed: int = 0,
            level: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over ``axis`` (the seeds) and a percentile-bootstrap ``level`` interval of it:
    the seeds are resampled with replacement ``n_boot`` times. NaN entries (an undefined
    metric, e.g. ``len_correct`` of a step without a correct completion) are left out of
    each mean. The interval lies within the range of the data, so a bounded metric's band
    never leaves its bounds (a share stays in [0, 1]). One seed: the interval is the
    value itself; none: NaN."""
    values = np.moveaxis(np.asarray(values, dtype=np.float64), axis, 0)
    n = values.shape[0]
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(finite, values, 0.0).sum(0) / finite.sum(0)
    if n <= 1:
        return mean, mean.copy(), mean.copy()
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    flat = values.reshape(n, -1)
    lo, hi = np.empty(flat.shape[1]), np.empty(flat.shape[1])
    tail = (1 - level) / 2 * 100
    block = max(1, 4_000_000 // (n_boot * n))  # columns per block: bounded memory
    for start in range(0, flat.shape[1], block):
        cols = flat[:, start:start + block]
        draws = cols[idx]  # (n_boot, n, cols)
        ok = np.isfinite(draws)
        with np.errstate(invalid="ignore", divide="ignore"):
            boot = np.where(ok, draws, 0.0).sum(1) / ok.sum(1)
        with np.errstate(invalid="ignore"):
            lo[start:start + block], hi[start:start + block] = np.nanpercentile(
                boot, [tail, 100 - tail], axis=0) if np.isfinite(boot).any() else (np.nan,
                                                                                   np.nan)
    shape = values.shape[1:]
    return mean, lo.reshape(shape), hi.reshape(shape)


def diff_ci(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """``mean(b) - mean(a)`` over independent runs, with a normal-approximation 95%
    interval (``+- 1.96 sqrt(SE_a^2 + SE_b^2)``), ignoring NaN entries: the interval
    excludes 0 when the difference is real at that level.

    >>> [round(x, 3) for x in diff_ci(np.array([0.0, 2.0]), np.array([3.0, 5.0]))]  # SEs 1, 1
    [3.0, 0.228, 5.772]
    """
    def mean_se(x):
        x = np.asarray(x, dtype=np.float64)
        x = x[np.isfinite(x)]
        return x.mean(), (x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else 0.0)

    (ma, se_a), (mb, se_b) = mean_se(a), mean_se(b)
    d, se = float(mb - ma), float(np.hypot(se_a, se_b))
    return d, d - 1.96 * se, d + 1.96 * se


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
    over seeds with a bootstrap 95% interval."""
    out = {}
    if result.steps_done == 0:
        return out
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
        for i, seed in enumerate(result.seeds):
            for step in range(result.steps_done):
                writer.writerow([result.impl, seed, step,
                                 *(f"{result.metrics[k][i, step]:.6g}" for k in result.metrics)])


def write_summary_json(result: RunResult, cfg: CountingConfig | LMConfig, path: Path) -> None:
    path.write_text(json.dumps({
        "impl": result.impl, "seeds": result.seeds, "config": asdict(cfg),
        "steps_done": result.steps_done, "interrupted": result.interrupted,
        "compile_s": result.compile_s, "run_s": result.run_s,
        "interval": "bootstrap 95% interval of the mean over seeds",
        "summary": summarize(result),
    }, indent=2))


#: y-axis label (with units) of each metric in plots.
UNITS = {
    "mean_reward": "reward (0-1)", "frac_reward_zero_std": "share of groups",
    "clip_ratio/low_mean": "share of tokens", "clip_ratio/high_mean": "share of tokens",
    "clip_ratio/region_mean": "share of tokens", "pg_clipfrac_lower": "share of tokens",
    "kl": "nats per token", "entropy": "nats per token", "loss": "loss",
    "correct_frac": "share of completions", "mean_length": "tokens", "len_correct": "tokens",
    "len_incorrect": "tokens", "sampled_tokens": "tokens per step",
    "ds_dropped": "groups per step", "ds_filled": "groups per step",
}


def plot_metrics(cfg: CountingConfig) -> tuple[str, ...]:
    """The metrics that carry information for ``cfg``'s run: always the reward, the share
    of zero-variance groups, KL, entropy and loss; where a clip can bind (two or more
    inner epochs) the clip share; lengths on the variable-length task; the exact-answer
    share where the reward is not the per-position score; dual-clip and dynamic-sampling
    counts only when those are on."""
    names = ["mean_reward", "frac_reward_zero_std"]
    if cfg.inner_epochs > 1:
        names.append("clip_ratio/region_mean")
    if cfg.dual_clip is not None:
        names.append("pg_clipfrac_lower")
    names += ["kl", "entropy", "loss"]
    if cfg.task != "counting":
        names.append("correct_frac")
    if cfg.task == "variable":
        names += ["len_correct", "len_incorrect"]
    if cfg.dynamic_sampling:
        names += ["ds_dropped", "ds_filled"]
    return tuple(names)


def plot_learning_curves(results: Sequence[RunResult], path: Path, title: str = "",
                         names: Sequence[str] | None = None) -> None:
    """One panel per metric (``names``, default all): the mean over seeds with its
    bootstrap 95% interval as a band, y-axis labelled with the metric's unit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(names or results[0].metrics)
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.3 * cols, 3.1 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for r in results:
            if name not in r.metrics or r.steps_done == 0:
                continue
            mean, lo, hi = mean_ci(r.metrics[name])
            steps = np.arange(len(mean))
            ax.plot(steps, mean, label=f"{r.impl} ({len(r.seeds)} seeds)")
            ax.fill_between(steps, lo, hi, alpha=0.25)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(UNITS.get(name, ""))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title or "mean over seeds; band = bootstrap 95% interval over seeds",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def describe_metrics(names: Sequence[str]) -> str:
    """``name: definition`` lines for ``names`` (from ``grpospec.METRICS``)."""
    return "\n".join(f"{n}: {METRICS[n]}" for n in names)
