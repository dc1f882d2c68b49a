"""The ``jaxgrpo`` command line: ``bandit``, ``counting``, ``lm``, ``experiment``.

The options of ``counting`` are the fields of :class:`grpospec.CountingConfig` (of ``lm``:
:class:`grpospec.lm.LMConfig`) plus the run's own (implementation, seeds, mesh, output
folder), derived by tyro: each field's documentation is its help line, so an option is
declared once. Bad input gets one ``error:``
line naming the option, exit code 2; Ctrl-C stops a run at the next chunk of steps and
writes what finished (exit code 130).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import tyro
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from grpospec import CountingConfig
from grpospec.cli import option_message
from grpospec.config import deferred_validation
from grpospec.lm import LMConfig
from grpospec.outdir import OutputFolderError, claim_output_dir

console = Console()
err_console = Console(stderr=True)


def _fail(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}", soft_wrap=True, highlight=False)
    raise SystemExit(2)


def _claim(out: Path | None, stem: str):
    try:
        return claim_output_dir(out, stem, "--out")
    except OutputFolderError as e:
        _fail(str(e))


def _progress() -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total} {task.fields[unit]}"),
                    TimeElapsedColumn(), console=console)


@dataclass
class Bandit:
    """Softmax bandit: REINFORCE against the exact gradient, with and without a baseline."""

    samples: int = 200_000
    """samples of the large REINFORCE estimate"""
    repeats: int = 600
    """repeats of the small-batch estimate (>= 2)"""
    batch: int = 32
    """samples per small-batch estimate"""
    seed: int = 0
    """seed of all sampling"""


def bandit(args: Bandit) -> None:
    from jaxgrpo.runs import IMPLS, bandit_report

    for name, low in (("samples", 1), ("repeats", 2), ("batch", 1)):
        if getattr(args, name) < low:
            _fail(f"--{name} must be >= {low}, got {getattr(args, name)}")
    table = Table(title=f"REINFORCE on a 5-armed softmax bandit ({args.samples:,} samples; "
                        f"{args.repeats} estimates of {args.batch} samples)")
    for col in ("impl", "max |estimate - exact|", "variance, b = 0", "variance, b = E[r]",
                "ratio"):
        table.add_column(col, justify="right")
    for impl in IMPLS:
        r = bandit_report(impl, args.samples, args.repeats, args.batch, args.seed)
        table.add_row(impl, f"{r['max_abs_error']:.4f}", f"{r['var_b0']:.4f}",
                      f"{r['var_mean_baseline']:.4f}", f"{r['variance_ratio']:.2f}")
    console.print(table)


@dataclass
class _RunArgs:
    """The options of a training run besides its configuration."""

    impl: Literal["jax", "torch"] = "jax"
    """implementation: jax (all seeds in one vmapped program) or torch (one after another)"""
    seeds: int = 64
    """number of independent runs"""
    seed: int = 0
    """first seed; runs use seed .. seed + seeds - 1"""
    mesh: str | None = None
    """JAX device mesh SEEDSxDATA (e.g. 2x4: seeds, then prompt groups); None: one device"""
    out: Path | None = None
    """output folder, new or empty; None: a new runs/<command>-<time>"""
    chunk_steps: int | None = None
    """JAX: steps per compiled call (Ctrl-C stops after the chunk); None: steps / 10"""


@dataclass
class Counting(_RunArgs):
    """Train a toy task with GRPO (or a variant) over many seeds; write metrics and a plot."""

    config: Annotated[CountingConfig, tyro.conf.arg(name="")] = field(
        default_factory=CountingConfig)


@dataclass
class Lm(_RunArgs):
    """GRPO on a tiny Qwen2 language model (arithmetic with a checker), many seeds in one
    compiled JAX program (or the PyTorch reference); write metrics and a plot."""

    config: Annotated[LMConfig, tyro.conf.arg(name="")] = field(default_factory=LMConfig)


def counting(args: Counting) -> None:
    _train_and_report(args, "counting", lambda cfg: f"{cfg.task} task")


def lm(args: Lm) -> None:
    _train_and_report(args, "lm", lambda cfg: f"tiny Qwen2, {cfg.task} task")


def _train_and_report(args: _RunArgs, stem: str, title) -> None:
    """Check the options, train ``args.seeds`` runs of ``args.config``'s program with a
    progress bar, print the summary table, write ``metrics.csv``, ``summary.json`` and
    ``curves.png`` into a new folder (what finished, when interrupted: exit code 130)."""
    from jaxgrpo.runs import (
        plot_learning_curves,
        plot_metrics,
        run_seeds,
        summarize,
        write_metrics_csv,
        write_summary_json,
    )

    try:
        cfg = args.config.validate()
    except (TypeError, ValueError) as e:
        _fail(option_message(str(e), type(args.config)))
    if args.seeds < 1:
        _fail(f"--seeds must be >= 1, got {args.seeds}")
    if args.chunk_steps is not None and args.chunk_steps < 1:
        _fail(f"--chunk-steps must be >= 1, got {args.chunk_steps}")
    mesh_shape = None
    if args.mesh is not None:
        from jaxgrpo.sharding import check_mesh_fits, make_mesh, parse_mesh

        if args.impl != "jax":
            _fail("--mesh is for --impl jax only")
        try:
            mesh_shape = parse_mesh(args.mesh)
            check_mesh_fits(cfg, args.seeds, make_mesh(*mesh_shape))
        except ValueError as e:
            _fail(f"--mesh: {e}")
    folder = _claim(args.out, stem)
    out = folder.path
    seed_list = list(range(args.seed, args.seed + args.seeds))
    try:
        with _progress() as progress:
            if args.impl == "jax":
                bar = progress.add_task(f"jax: {args.seeds} seeds in one compiled program",
                                        total=cfg.steps, unit="steps")
            else:
                bar = progress.add_task("torch: seeds one after another",
                                        total=args.seeds * cfg.steps, unit="seed-steps")
            result = run_seeds(args.impl, cfg, seed_list, lambda k: progress.advance(bar, k),
                               mesh_shape, args.chunk_steps)
    except KeyboardInterrupt:  # while compiling: nothing ran yet
        folder.release_if_unused()
        err_console.print("interrupted before training started; nothing written")
        raise SystemExit(130) from None
    except BaseException:
        folder.release_if_unused()
        raise
    if result.steps_done == 0:
        folder.release_if_unused()
        err_console.print("interrupted before a step finished; nothing written")
        raise SystemExit(130)
    summary = summarize(result)
    done = (f"{result.steps_done} of {cfg.steps} steps (interrupted)" if result.interrupted
            else f"{cfg.steps} steps")
    table = Table(title=f"{title(cfg)}, {args.impl}, {len(result.seeds)} seeds x {done} "
                        "(mean over seeds [bootstrap 95% interval]; end = last 5 steps)")
    table.add_column("metric")
    table.add_column("start", justify="right")
    table.add_column("end", justify="right")
    for name, s in summary.items():
        table.add_row(name, f"{s['start']:.3f} [{s['start_lo']:.3f}, {s['start_hi']:.3f}]",
                      f"{s['end']:.3f} [{s['end_lo']:.3f}, {s['end_hi']:.3f}]")
    console.print(table)
    console.print(f"time: {result.run_s:.2f} s training"
                  + (f" + {result.compile_s:.2f} s compile" if args.impl == "jax" else ""))
    write_metrics_csv(result, out / "metrics.csv")
    write_summary_json(result, cfg, out / "summary.json")
    plot_learning_curves([result], out / "curves.png", names=plot_metrics(cfg),
                         title=f"GRPO, {title(cfg)}: mean over {len(result.seeds)} seeds, "
                               "band = bootstrap 95% interval over seeds")
    console.print(f"wrote {out}/metrics.csv, summary.json, curves.png")
    folder.release()
    if result.interrupted:
        err_console.print(f"interrupted: wrote the {done}")
        raise SystemExit(130)


@dataclass
class ExperimentArgs:
    """Reproduce a GRPO failure mode and its fix: a PNG of curves and a markdown table."""

    name: tyro.conf.Positional[str]
    """an experiment (length-bias, length-2x2, entropy, zero-signal, estimators, std-scale;
    on the language model lm-length-bias, lm-entropy, lm-zero-signal, lm-estimators), or a
    group: counting, lm, all"""
    seeds: int = 64
    """seeds per arm (vmapped), >= 2"""
    seed: int = 0
    """first seed"""
    out: Path | None = None
    """output folder, new or empty; None: a new runs/experiment-<time>"""


def experiment(args: ExperimentArgs) -> None:
    from jaxgrpo.experiments import EXPERIMENTS, GROUPS, run_experiment, write_experiment

    names = list(GROUPS[args.name]) if args.name in GROUPS else [args.name]
    if any(n not in EXPERIMENTS for n in names):
        _fail(f"NAME must be one of {', '.join(EXPERIMENTS)} or a group "
              f"({', '.join(GROUPS)}), got {args.name!r}")
    if args.seeds < 2:
        _fail(f"--seeds must be >= 2 (an interval needs two), got {args.seeds}")
    folder = _claim(args.out, "experiment")
    out = folder.path
    try:
        for n in names:
            exp = EXPERIMENTS[n]
            with _progress() as progress:
                bar = progress.add_task(f"{n}: {args.seeds} seeds per arm, vmapped",
                                        total=len(exp.arms), unit="arms")
                results = run_experiment(n, args.seeds, args.seed,
                                         lambda _, bar=bar: progress.advance(bar))
            console.print(f"[bold]{n}[/]: {exp.question}")
            console.print(write_experiment(exp, results, out), soft_wrap=True)
    except BaseException:
        folder.release_if_unused()
        raise
    folder.release()
    console.print(f"wrote {out}/")


COMMANDS = {"bandit": bandit, "counting": counting, "lm": lm, "experiment": experiment}


def main(argv: list[str] | None = None) -> None:
    """The ``jaxgrpo`` entry point."""
    with deferred_validation():  # checked in the command, to word errors as options
        command, args = tyro.extras.subcommand_cli_from_dict(
            {name: _Parsed.wrap(name, fn) for name, fn in COMMANDS.items()},
            args=argv if argv is not None else sys.argv[1:], prog="jaxgrpo",
            description="GRPO math in JAX, with a PyTorch reference.",
            config=(tyro.conf.OmitArgPrefixes, tyro.conf.OmitSubcommandPrefixes))
    COMMANDS[command](args)


class _Parsed:
    """tyro builds the arguments inside ``deferred_validation``; the command then runs
    outside it (so configs it builds itself are checked as usual)."""

    @staticmethod
    def wrap(name, fn):
        import functools

        @functools.wraps(fn)
        def parse_only(*args, **kwargs):
            return name, (args[0] if args else next(iter(kwargs.values())))

        return parse_only


if __name__ == "__main__":  # pragma: no cover
    main()
