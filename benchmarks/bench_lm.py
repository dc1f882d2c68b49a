"""Benchmark: GRPO on the tiny Qwen2, the PyTorch reference vs the compiled JAX program.

    python benchmarks/bench_lm.py [--seeds 64] [--repeats 3] [--quick]

Measures, side by side in one run on this machine, with ``LMConfig()``'s defaults (the
arithmetic task; each run pretrains the base model, then 120 GRPO steps of 16 prompts x
8 completions, two inner epochs):
  1. one seed end to end: torch (``torchref.lm.train_lm``, ``transformers``' Qwen2) vs
     JAX (``jaxgrpo.lm.make_train``), JAX with compile included and excluded;
  2. ``--seeds`` JAX seeds vmapped in one program vs 8 torch seeds one after another
     (the torch runs share one pretrained base model, as the JAX runs do);
  3. the learning check: 8 JAX seeds, each seed's mean reward at the start (step 0)
     and the end (mean of the last 5 steps), and the time for all 8 with compile;
  4. what a compiled step spends on sampling (``generate``) against the whole step;
  5. the same rows 1-2 for a smaller model (hidden 16, one layer, 8 prompts x 8), where
     the work per step is small and per-call overhead dominates the torch reference;
  6. for each model, the many seeds again over a seeds mesh of every CPU device (XLA
     gives each its own thread; ``--xla_force_host_platform_device_count`` = the cores);
  7. where a seed's compute goes: the forward and backward of the update's log-probs
     (``--seeds`` vmapped, and one seed), the number of XLA kernels it runs, and the
     same dense products alone (``products_seconds``): the floor no layout of the
     model's other operations can go below (each the fastest of 5, inside a compiled
     loop, as the run calls its step).
Prints a table of times and ratios (torch time / JAX time) and the machine it ran on.
Timings are medians of ``--repeats`` runs. ``--quick`` shortens every run (a smoke test
of the script).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import time

os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={os.cpu_count()}")

import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402

from grpospec.lm import LMConfig  # noqa: E402
from jaxgrpo import lm  # noqa: E402
from jaxgrpo.lm_tasks import sample_problems  # noqa: E402
from jaxgrpo.qwen2 import Qwen2  # noqa: E402
from jaxgrpo.sharding import make_mesh, sharded_train  # noqa: E402
from torchref import lm as tlm  # noqa: E402


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _settle() -> None:
    """Let the other framework's worker threads go idle before timing this one."""
    time.sleep(1.0)


def _keys(n: int):
    return jax.vmap(jax.random.key)(jnp.arange(n, dtype=jnp.uint32))


def _compile(cfg: LMConfig, n_seeds: int | None):
    """``(compiled program, its input, seconds to lower and compile)``."""
    t0 = time.perf_counter()
    if n_seeds is None:
        keys = jax.random.key(0)
        compiled = jax.jit(lm.make_train(cfg)).lower(keys).compile()
    else:
        keys = _keys(n_seeds)
        compiled = jax.jit(jax.vmap(lm.make_train(cfg))).lower(keys).compile()
    return compiled, keys, time.perf_counter() - t0


def _torch_seeds(cfg: LMConfig, seeds: list[int]) -> tuple[float, list[dict]]:
    """Train ``seeds`` one after another from one pretrained base model (pretrained
    inside the timing, once)."""
    tlm._base_state.cache_clear()
    t0 = time.perf_counter()
    out = [tlm.train_lm(seed=s, **_fields(cfg)) for s in seeds]
    return time.perf_counter() - t0, out


def _fields(cfg: LMConfig) -> dict:
    from dataclasses import asdict

    return asdict(cfg)


def _speed_rows(cfg: LMConfig, label: str, n_seeds: int, repeats: int) -> list[tuple]:
    rows = []
    torch_one = _median(lambda: _torch_seeds(cfg, [0]), repeats)
    _settle()
    compiled, key, compile_s = _compile(cfg, None)
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(key))
    first = compile_s + time.perf_counter() - t0
    _settle()
    jax_one = _median(lambda: jax.block_until_ready(compiled(key)), repeats)
    rows += [(f"{label}: 1 seed, torch", torch_one, None),
             (f"{label}: 1 seed, JAX incl. compile", first, torch_one / first),
             (f"{label}: 1 seed, JAX after compile", jax_one, torch_one / jax_one)]
    _settle()
    torch_8, _ = _torch_seeds(cfg, list(range(8)))
    _settle()
    compiled, keys, compile_s = _compile(cfg, n_seeds)
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(keys))
    first = compile_s + time.perf_counter() - t0
    _settle()
    jax_many = _median(lambda: jax.block_until_ready(compiled(keys)), max(1, repeats // 2))
    rows += [(f"{label}: 8 seeds, torch one after another", torch_8, None),
             (f"{label}: {n_seeds} seeds, JAX vmapped incl. compile", first, torch_8 / first),
             (f"{label}: {n_seeds} seeds, JAX vmapped after compile", jax_many,
              torch_8 / jax_many)]
    n_dev = jax.device_count()
    if n_dev > 1 and n_seeds % n_dev == 0:  # the same seeds split over a seeds mesh
        del compiled
        _settle()
        mesh = make_mesh(seeds=n_dev)
        t0 = time.perf_counter()
        compiled = sharded_train(cfg, mesh).lower(keys).compile()
        jax.block_until_ready(compiled(keys))
        first = time.perf_counter() - t0
        _settle()
        jax_mesh = _median(lambda: jax.block_until_ready(compiled(keys)),
                           max(1, repeats // 2))
        rows += [(f"{label}: {n_seeds} seeds, JAX on a {n_dev}-device seeds mesh incl. "
                  "compile", first, torch_8 / first),
                 (f"{label}: {n_seeds} seeds, JAX on a {n_dev}-device seeds mesh after "
                  "compile", jax_mesh, torch_8 / jax_mesh)]
    return rows


def _sampling_share(cfg: LMConfig, repeats: int) -> tuple[float, float]:
    """Milliseconds per compiled step of one seed: ``generate`` alone, and a whole step
    (the run's time per step, pretraining excluded)."""
    model = lm.make_model(cfg, jax.random.key(0))
    graphdef, state = nnx.split(model)
    problems = lm._repeat(sample_problems(jax.random.key(1), cfg.n_prompts, cfg.digits),
                          cfg.group_size)

    @jax.jit
    def sample(state, key):
        return lm.generate(nnx.merge(graphdef, state), problems.tokens, problems.mask, key,
                           cfg.length)[0]

    jax.block_until_ready(sample(state, jax.random.key(2)))
    n = 50
    t_sample = _median(lambda: [jax.block_until_ready(sample(state, jax.random.key(i)))
                                for i in range(n)], repeats) / n
    # a step's time as the difference of two runs that differ only in their GRPO steps
    # (4x as many: 2 * steps against steps // 2), each the fastest of its repeats (the
    # minimum: the noise of a busy machine only ever adds time), the runs interleaved
    n_long, n_short = 2 * cfg.steps, max(1, cfg.steps // 2)
    long, key, _ = _compile(cfg.replace(steps=n_long), None)
    short, _, _ = _compile(cfg.replace(steps=n_short), None)
    jax.block_until_ready((long(key), short(key)))
    t_long, t_short = [], []
    for _ in range(max(3, repeats)):
        t_long.append(_median(lambda: jax.block_until_ready(long(key)), 1))
        t_short.append(_median(lambda: jax.block_until_ready(short(key)), 1))
    per_step = (min(t_long) - min(t_short)) / (n_long - n_short)
    return 1e3 * t_sample, 1e3 * per_step


def dense_products(model: Qwen2) -> list[tuple[int, int]]:
    """``(in, out)`` of each dense product a token goes through: every ``nnx.Linear``
    kernel of the model (q, k, v, o, gate, up, down in each layer; the value head if it
    has one) and the tied output head (hidden x vocab)."""
    shapes = [tuple(node.kernel.shape) for _, node in nnx.iter_graph(model)
              if isinstance(node, nnx.Linear)]
    return shapes + [tuple(model.embed_tokens.embedding.shape[::-1])]


def looped(body, args: tuple, n: int):
    """``(compiled, init)``: ``compiled(args, init)`` calls ``body(*args)`` ``n`` times in a
    ``lax.scan`` and returns the last call's outputs (``init``: zeros of their shapes). The
    inputs pass through ``optimization_barrier`` with the loop counter, so that XLA cannot
    hoist the body out of the loop; the outputs are carried."""
    init = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(body, *args))

    def run(args, init):
        def _iteration(carry, _):
            i, _ = carry
            inputs, i = jax.lax.optimization_barrier((args, i))
            return (i + 1, body(*inputs)), None

        return jax.lax.scan(_iteration, (jnp.int32(0), init), None, length=n)[0][1]

    return jax.jit(run).lower(args, init).compile(), init


def per_iteration_seconds(body, args: tuple, repeats: int = 5, short: int = 2,
                          long: int = 12) -> float:
    """Seconds of one call of ``body(*args)`` inside a compiled loop, as the training run's
    ``lax.scan`` calls its step: ``(T(long) - T(short)) / (long - short)``, ``T(n)`` the
    fastest of ``repeats`` runs (after a warm-up, interleaved) of ``looped(body, args, n)``.
    (A top-level call pays for its buffers too: at 64 seeds the update's forward and
    backward took 1.9x as long called alone as in a loop.)"""
    programs = {n: looped(body, args, n) for n in (short, long)}
    times: dict[int, list[float]] = {short: [], long: []}
    for compiled, init in programs.values():
        jax.block_until_ready(compiled(args, init))  # warm-up
    for _ in range(repeats):
        for n, (compiled, init) in programs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(args, init))
            times[n].append(time.perf_counter() - t0)
    return (min(times[long]) - min(times[short])) / (long - short)


def products_body(backward: bool):
    """The dense products of a forward (``X W`` for each ``(X, W, dY)`` of ``operands``)
    and, with ``backward``, the two products of its backward (``dY W^T``, ``X^T dY``);
    the leading axis of each operand is the seed (each its own weights, batched, as
    ``vmap`` makes them)."""
    def products(operands):
        out = []
        for x, w, dy in operands:
            out.append(jnp.einsum("snk,skm->snm", x, w))
            if backward:
                out += [jnp.einsum("snm,skm->snk", dy, w), jnp.einsum("snk,snm->skm", x, dy)]
        return out

    return products


def products_seconds(shapes: list[tuple[int, int]], rows: int, n_seeds: int,
                     backward: bool = True, repeats: int = 5) -> float:
    """Seconds of only the dense products (``products_body``) of a forward (and
    backward) of ``rows`` tokens through ``shapes``, ``(in, out)`` each, for ``n_seeds``
    seeds at once, in a compiled loop (``per_iteration_seconds``)."""
    operands = []
    for i, (n_in, n_out) in enumerate(shapes):
        kx, kw, ky = jax.random.split(jax.random.fold_in(jax.random.key(0), i), 3)
        operands.append((jax.random.normal(kx, (n_seeds, rows, n_in)),
                         jax.random.normal(kw, (n_seeds, n_in, n_out)),
                         jax.random.normal(ky, (n_seeds, rows, n_out))))
    return per_iteration_seconds(products_body(backward), (operands,), repeats)


def xla_kernels(hlo: str) -> int:
    """The operations of a compiled program's entry computation (``hlo``: the text of
    ``compiled.as_text()``) that run as kernels: everything but parameters, constants,
    tuples and bitcasts (a fusion is one kernel; the computations it calls, listed before
    the entry, are not counted)."""
    entry = hlo[hlo.index("\nENTRY "):]
    entry = entry[:entry.index("\n}")]
    free = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}
    ops = [re.search(r" ([a-z][a-z0-9-]*)\(", line.split(" = ", 1)[1]).group(1)
           for line in entry.splitlines()[1:] if " = " in line]
    return sum(op not in free for op in ops)


def update_core(cfg: LMConfig, n_seeds: int, repeats: int = 5) -> tuple[float, int, int]:
    """``(seconds, XLA kernels, tokens a seed)`` of the gradient of the teacher-forced
    log-probs (``completion_logprobs``, summed) of ``n_prompts * group_size`` completions,
    the forward and backward of each inner epoch, for ``n_seeds`` vmapped seeds (each its
    own initial weights): seconds in a compiled loop (``per_iteration_seconds``), the
    kernels of one call compiled alone (``xla_kernels``)."""
    graphdef, _ = nnx.split(lm.make_model(cfg, jax.random.key(0)))
    states = jax.vmap(lambda k: nnx.state(lm.make_model(cfg, k)))(
        jax.random.split(jax.random.key(1), n_seeds))
    rows = cfg.n_prompts * cfg.group_size
    problems = sample_problems(jax.random.key(2), rows, cfg.digits)
    completions = jax.random.randint(jax.random.key(3), (rows, cfg.length), 0,
                                     cfg.model.vocab_size)

    def grads(state):
        def total(model):
            return lm.completion_logprobs(model, problems.tokens, problems.mask,
                                          completions).sum()
        return nnx.grad(total)(nnx.merge(graphdef, state))

    kernels = xla_kernels(jax.jit(jax.vmap(grads)).lower(states).compile().as_text())
    tokens = rows * (problems.tokens.shape[1] + cfg.length - 1)
    return per_iteration_seconds(jax.vmap(grads), (states,), repeats), kernels, tokens


def _compute_split(cfg: LMConfig, n_seeds: int, repeats: int) -> str:
    """The line of section 7, times in ms a seed."""
    many, kernels, tokens = update_core(cfg, n_seeds, repeats)
    one, _, _ = update_core(cfg, 1, repeats)
    shapes = dense_products(lm.make_model(cfg, jax.random.key(0)))
    fwd_bwd = products_seconds(shapes, tokens, n_seeds, True, repeats)
    fwd = products_seconds(shapes, tokens, n_seeds, False, repeats)
    flops = 6 * tokens * sum(a * b for a, b in shapes)
    ms = 1e3 / n_seeds
    return (f"a seed's forward and backward of the update's log-probs ({tokens} tokens, in "
            f"a compiled loop): {many * ms:.2f} ms at {n_seeds} vmapped seeds, "
            f"{1e3 * one:.2f} ms at one seed, {kernels} XLA kernels; its dense products "
            f"alone {fwd_bwd * ms:.2f} ms ({fwd_bwd / many:.0%} of it, "
            f"{flops * n_seeds / fwd_bwd / 1e9:.0f} GFLOP/s); a step's products (sampling "
            f"and reference forward at the forward's {fwd * ms:.2f} ms, two inner epochs' "
            f"forward and backward): {(2 * fwd + 2 * fwd_bwd) * ms:.2f} ms a seed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=64, help="JAX seeds of the many-seed rows")
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats (median)")
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # see the README: threads spin on a busy 2-core machine
    cfg = LMConfig()
    small = LMConfig(hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                     num_kv_heads=1, n_prompts=8)
    if args.quick:
        cfg = cfg.replace(pretrain_steps=20, steps=4)
        small = small.replace(pretrain_steps=20, steps=4)

    _torch_seeds(cfg.replace(pretrain_steps=1, steps=1), [0])  # warm-up: imports, first calls

    # 3. the learning check first: 8 seeds of the default program, compile included
    t0 = time.perf_counter()
    compiled, keys, _ = _compile(cfg, 8)
    _, metrics = jax.block_until_ready(compiled(keys))
    learn_s = time.perf_counter() - t0
    reward = np.asarray(metrics["mean_reward"])
    start, end = reward[:, 0], reward[:, -5:].mean(axis=1)

    rows = _speed_rows(cfg, "default", args.seeds, args.repeats)
    t_sample, t_step = _sampling_share(cfg, args.repeats)
    rows += _speed_rows(small, "small", args.seeds, args.repeats)
    split = _compute_split(cfg, args.seeds, 2 if args.quick else 5)

    print(f"machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores; torch {torch.__version__} ({torch.get_num_threads()} "
          f"thread), jax {jax.__version__} on {jax.devices()[0].platform} (single-device "
          f"programs, except the mesh rows: {jax.device_count()} devices)")
    print(f"default: hidden {cfg.hidden_size}, {cfg.num_layers} layers, {cfg.num_heads} query "
          f"/ {cfg.num_kv_heads} key-value heads, {cfg.n_prompts} x {cfg.group_size} "
          f"completions of {cfg.length} tokens, {cfg.pretrain_steps} pretraining + "
          f"{cfg.steps} GRPO steps; small: hidden {small.hidden_size}, {small.num_layers} "
          f"layer, {small.n_prompts} x {small.group_size} completions")
    print(f"learning, 8 JAX seeds: mean reward at step 0 {[round(float(x), 3) for x in start]}, "
          f"at the end {[round(float(x), 3) for x in end]}; all below 0.3 at the start: "
          f"{bool(np.all(start < 0.3))}, all above 0.8 at the end: {bool(np.all(end > 0.8))}; "
          f"{learn_s:.1f} s for all 8 with compile")
    print(f"a compiled step of one seed: {t_step:.1f} ms, of which sampling "
          f"(generate, {cfg.n_prompts * cfg.group_size} completions) {t_sample:.1f} ms")
    print(split)
    print()
    print("| case | time (s) | speed-up vs torch |")
    print("|---|---:|---:|")
    for name, t, ratio in rows:
        print(f"| {name} | {t:.3f} | {'' if ratio is None else f'{ratio:.1f}x'} |")


if __name__ == "__main__":
    main()
