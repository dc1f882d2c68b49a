"""The ``jaxgrpo`` command line: ``jaxgrpo bandit``, ``counting``, ``lm``, ``experiment``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import re
import typing
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="GRPO math in JAX, with a PyTorch reference.")
console = Console()


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code=2)


def _fresh_out_dir(out: Path | None, stem: str) -> Path:
    """The output folder: ``out`` if it does not exist or is empty, else an error;
    by default a new time-stamped folder under ``runs/``. Nothing is overwritten."""
    if out is None:
        out = Path("runs") / f"{stem}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        _fail(f"--out {out} already exists and is not an empty folder; "
              "refusing to overwrite it: pass a new path")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _train_and_report(impl: str, cfg, seeds: int, seed: int, mesh: str | None,
                      out: Path | None, stem: str, title: str) -> None:
    """Train ``seeds`` runs of ``cfg``'s program with a progress bar, print the summary
    table, write ``metrics.csv``, ``summary.json`` and ``curves.png`` into a new folder."""
    from jaxgrpo.runs import (
        plot_learning_curves,
        run_seeds,
        summarize,
        write_metrics_csv,
        write_summary_json,
    )

    mesh_shape = None
    if mesh is not None:
        from jaxgrpo.sharding import check_mesh_fits, make_mesh, parse_mesh

        if impl != "jax":
            _fail("--mesh is for --impl jax only")
        try:
            mesh_shape = parse_mesh(mesh)
            check_mesh_fits(cfg, seeds, make_mesh(*mesh_shape))
        except ValueError as e:
            _fail(f"--mesh: {e}")
    out = _fresh_out_dir(out, stem)
    seed_list = list(range(seed, seed + seeds))

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total} seeds"), TimeElapsedColumn(),
                  console=console) as progress:
        what = ("compiling and training, all seeds in one vmapped program" if impl == "jax"
                else "training seeds one after another")
        bar = progress.add_task(f"{impl}: {what}", total=seeds)
        result = run_seeds(impl, cfg, seed_list, lambda _: progress.advance(bar), mesh_shape)

    summary = summarize(result)
    table = Table(title=f"{title}, {impl}, {seeds} seeds x {cfg.steps} steps "
                        "(mean over seeds [95% interval]; end = mean of last 5 steps)")
    table.add_column("metric")
    table.add_column("start", justify="right")
    table.add_column("end", justify="right")
    for name, s in summary.items():
        table.add_row(name, f"{s['start']:.3f} [{s['start_lo']:.3f}, {s['start_hi']:.3f}]",
                      f"{s['end']:.3f} [{s['end_lo']:.3f}, {s['end_hi']:.3f}]")
    console.print(table)
    console.print(f"time: {result.run_s:.2f} s training"
                  + (f" + {result.compile_s:.2f} s compile" if impl == "jax" else ""))
    write_metrics_csv(result, out / "metrics.csv")
    write_summary_json(result, cfg, out / "summary.json")
    plot_learning_curves([result], out / "curves.png",
                         title=f"GRPO, {title}: mean over seeds, band = 95% interval")
    console.print(f"wrote {out}/metrics.csv, summary.json, curves.png")


@app.command()
def bandit(
    samples: Annotated[int, typer.Option(min=1, help="samples of the large REINFORCE estimate")]
    = 200_000,
    repeats: Annotated[int, typer.Option(min=2, help="repeats of the small-batch estimate")] = 600,
    batch: Annotated[int, typer.Option(min=1, help="samples per small-batch estimate")] = 32,
    seed: Annotated[int, typer.Option(help="seed of all sampling")] = 0,
) -> None:
    """Softmax bandit: REINFORCE against the exact gradient, with and without a baseline."""
    from jaxgrpo.runs import IMPLS, bandit_report

    table = Table(title=f"REINFORCE on a 5-armed softmax bandit ({samples:,} samples; "
                        f"{repeats} estimates of {batch} samples)")
    for col in ("impl", "max |estimate - exact|", "variance, b = 0", "variance, b = E[r]",
                "ratio"):
        table.add_column(col, justify="right")
    for impl in IMPLS:
        r = bandit_report(impl, samples, repeats, batch, seed)
        table.add_row(impl, f"{r['max_abs_error']:.4f}", f"{r['var_b0']:.4f}",
                      f"{r['var_mean_baseline']:.4f}", f"{r['variance_ratio']:.2f}")
    console.print(table)


@app.command()
def counting(
    impl: Annotated[str, typer.Option(help="implementation: jax (vmapped) or torch")] = "jax",
    seeds: Annotated[int, typer.Option(min=1, help="number of independent runs")] = 64,
    seed: Annotated[int, typer.Option(help="first seed; runs use seed .. seed + seeds - 1")] = 0,
    steps: Annotated[int, typer.Option(min=1, help="GRPO steps")] = 80,
    task: Annotated[str, typer.Option(help="counting, sparse or variable")] = "counting",
    completion_length: Annotated[int | None, typer.Option(
        help="tokens per completion (default: the task's)")] = None,
    n_prompts: Annotated[int, typer.Option(min=1, help="prompts per step (B)")] = 16,
    group_size: Annotated[int, typer.Option(min=1, help="completions per prompt (G)")] = 8,
    inner_epochs: Annotated[int, typer.Option(min=1, help="updates per batch of rollouts")] = 2,
    lr: Annotated[float, typer.Option(help="Adam learning rate")] = 0.05,
    beta: Annotated[float, typer.Option(help="k3 KL weight against the initial policy")] = 0.01,
    estimator: Annotated[str, typer.Option(
        help="advantages: grpo, dr_grpo, rloo or gae (PPO with a value head)")] = "grpo",
    agg: Annotated[str, typer.Option(help="loss aggregation: token, seq or constant")] = "token",
    clip_eps: Annotated[float, typer.Option(help="clip range eps_low, in (0, 1)")] = 0.2,
    clip_eps_high: Annotated[float | None, typer.Option(
        help="clip-higher eps_high (default: clip-eps)")] = None,
    dual_clip: Annotated[float | None, typer.Option(
        help="dual-clip bound c > 1 for negative advantages")] = None,
    importance_level: Annotated[str, typer.Option(
        help="token ratios, or sequence (GSPO)")] = "token",
    dynamic_sampling: Annotated[bool, typer.Option(
        help="DAPO dynamic sampling: drop zero-variance groups, refill from extra ones")] = False,
    oversample: Annotated[int, typer.Option(min=1, help="dynamic sampling's pool factor")] = 2,
    gamma: Annotated[float, typer.Option(help="GAE discount (estimator gae)")] = 1.0,
    lam: Annotated[float, typer.Option(help="GAE lambda (estimator gae)")] = 0.95,
    vf_coef: Annotated[float, typer.Option(help="value-loss weight (estimator gae)")] = 0.5,
    mesh: Annotated[str | None, typer.Option(
        help="JAX device mesh SEEDSxDATA, e.g. 2x4: seeds split over the first axis, each "
             "run's prompt groups over the second (default: one device)")] = None,
    out: Annotated[Path | None, typer.Option(
        help="output folder (new or empty); default runs/counting-<time>")] = None,
) -> None:
    """Train a toy task with GRPO (or a variant) over many seeds; write metrics and a plot."""
    from grpospec import CountingConfig
    from jaxgrpo.runs import IMPLS

    if impl not in IMPLS:
        _fail(f"--impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    try:
        cfg = CountingConfig(steps=steps, n_prompts=n_prompts, group_size=group_size,
                             inner_epochs=inner_epochs, learning_rate=lr, beta=beta,
                             clip_eps=clip_eps, clip_eps_high=clip_eps_high, agg=agg,
                             estimator=estimator, gamma=gamma, lam=lam, vf_coef=vf_coef,
                             dual_clip=dual_clip, importance_level=importance_level,
                             dynamic_sampling=dynamic_sampling, oversample=oversample,
                             task=task, completion_length=completion_length)
    except (TypeError, ValueError) as e:
        _fail(f"bad option: {e}")
    _train_and_report(impl, cfg, seeds, seed, mesh, out, "counting", f"{task} task")


def config_help(cls) -> dict[str, str]:
    """``{field: help}`` from the ``Attributes:`` section of a config dataclass's
    docstring (one ``name: text`` entry per field, continuation lines indented more)."""
    lines = (cls.__doc__ or "").split("Attributes:", 1)[-1].splitlines()
    helps: dict[str, list[str]] = {}
    current = None
    for line in lines:
        entry = re.match(r"^      (\w+): (.*)$", line)
        if entry:
            current = entry.group(1)
            helps[current] = [entry.group(2)]
        elif current and line.startswith("        "):
            helps[current].append(line.strip())
        elif line.strip():
            current = None
    return {k: escape(" ".join(v).replace("``", "")) for k, v in helps.items()}


def _config_parameters(cls) -> list[inspect.Parameter]:
    """One keyword-only CLI option per field of the dataclass ``cls``, with its type,
    default and help line (``config_help``): the CLI derived from the config."""
    hints = typing.get_type_hints(cls)
    helps = config_help(cls)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in helps]
    if missing:  # a field without a help line is a documentation bug
        raise RuntimeError(f"{cls.__name__} documents no help for {missing}")
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                              annotation=Annotated[hints[f.name],
                                                   typer.Option(help=helps[f.name])])
            for f in dataclasses.fields(cls)]


def lm(impl: str, seeds: int, seed: int, mesh: str | None, out: Path | None,
       **fields) -> None:
    """GRPO on a tiny Qwen2 language model (arithmetic with a checker), many seeds in one
    compiled JAX program (or the PyTorch reference); write metrics and a plot. Every
    field of grpospec.lm.LMConfig is an option."""
    from grpospec.lm import LMConfig
    from jaxgrpo.runs import IMPLS

    if impl not in IMPLS:
        _fail(f"--impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    try:
        cfg = LMConfig(**fields)
    except (TypeError, ValueError) as e:
        _fail(f"bad option: {e}")
    _train_and_report(impl, cfg, seeds, seed, mesh, out, "lm", f"tiny Qwen2, {cfg.task} task")


def _lm_signature() -> inspect.Signature:
    from grpospec.lm import LMConfig

    common = [
        ("impl", Annotated[str, typer.Option(help="implementation: jax (vmapped) or torch")],
         "jax"),
        ("seeds", Annotated[int, typer.Option(min=1, help="number of independent runs")], 64),
        ("seed", Annotated[int, typer.Option(
            help="first seed; runs use seed .. seed + seeds - 1")], 0),
        ("mesh", Annotated[str | None, typer.Option(
            help="JAX device mesh SEEDSxDATA, e.g. 2x4: seeds split over the first axis, "
                 "each run's prompt groups over the second (default: one device)")], None),
        ("out", Annotated[Path | None, typer.Option(
            help="output folder (new or empty); default runs/lm-<time>")], None),
    ]
    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=a)
              for n, a, d in common]
    return inspect.Signature(params + _config_parameters(LMConfig))


lm.__signature__ = _lm_signature()
app.command(name="lm")(lm)


@app.command()
def experiment(
    name: Annotated[str, typer.Argument(
        help="an experiment (length-bias, entropy, zero-signal, estimators; on the language "
             "model lm-length-bias, lm-entropy, lm-zero-signal, lm-estimators), or a group: "
             "counting, lm, all")],
    seeds: Annotated[int, typer.Option(min=2, help="seeds per arm (vmapped)")] = 64,
    seed: Annotated[int, typer.Option(help="first seed")] = 0,
    out: Annotated[Path | None, typer.Option(
        help="output folder (new or empty); default runs/experiment-<time>")] = None,
) -> None:
    """Reproduce a GRPO failure mode and its fix: a PNG of curves and a markdown table."""
    from jaxgrpo.experiments import EXPERIMENTS, GROUPS, run_experiment, write_experiment

    names = list(GROUPS[name]) if name in GROUPS else [name]
    if any(n not in EXPERIMENTS for n in names):
        _fail(f"NAME must be one of {', '.join(EXPERIMENTS)} or a group "
              f"({', '.join(GROUPS)}), got {name!r}")
    out = _fresh_out_dir(out, "experiment")
    for n in names:
        exp = EXPERIMENTS[n]
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total} arms"), TimeElapsedColumn(),
                      console=console) as progress:
            bar = progress.add_task(f"{n}: {seeds} seeds per arm, vmapped",
                                    total=len(exp.arms))
            results = run_experiment(n, seeds, seed,
                                     lambda _, bar=bar: progress.advance(bar))
        console.print(f"[bold]{n}[/]: {exp.question}")
        console.print(write_experiment(exp, results, out), soft_wrap=True)
    console.print(f"wrote {out}/")


def main() -> None:  # pragma: no cover
    app()

