"""``grpo-scaleup train|eval``: GRPO with LoRA from the command line.

The options of ``train`` are the fields of :class:`scaleup.config.TrainConfig`, derived
by tyro (each field's docstring is its help line), so an option is declared once. Errors
in the user's input (a bad option, a missing model folder, a malformed data line, an
output folder in use, no usable checkpoint) are printed as one ``error:`` line naming the
option, with exit code 2, never a traceback from inside a library.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tyro
from rich.console import Console
from rich.markup import escape

from grpospec.cli import option_message
from scaleup.config import ConfigError, EvalConfig, TrainConfig

console = Console(stderr=True)


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, highlight=False,
                  markup=True)
    raise SystemExit(2)


def _user_errors():
    from scaleup.checkpoint import CheckpointError
    from scaleup.modeling import ModelLoadError
    from scaleup.tasks import TaskError
    from scaleup.train import OutputDirError
    from scaleup.vllm_rollout import VllmUnavailable

    return (ConfigError, ModelLoadError, TaskError, OutputDirError, CheckpointError,
            VllmUnavailable)


def train(cfg: TrainConfig, resume: bool = False) -> None:
    """Train a LoRA adapter with GRPO; logs to the console and <output-dir>/log.jsonl.

    Args:
        cfg: the run's configuration.
        resume: continue the run in --output-dir from its newest complete checkpoint (its
            saved config is used; the other options are ignored).
    """
    from scaleup.train import train as run_train

    try:
        result = run_train(cfg, resume=resume)
    except _user_errors() as e:
        _fail(option_message(str(e), TrainConfig))
    log = result["log"]
    if log and result["rank"] == 0:
        console.print(f"done: {len(log)} steps, last mean reward "
                      f"{log[-1]['mean_reward']:.3f}; run in {result['output_dir']}")


def evaluate(cfg: EvalConfig) -> None:
    """Compare the newest complete checkpoint with the starting model on a held-out set."""
    from scaleup.evaluate import evaluate_run

    for name in ("n_problems", "batch_size", "n_boot"):
        if getattr(cfg, name) < 1:
            _fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if not Path(cfg.output_dir).is_dir():
        _fail(f"--output-dir {cfg.output_dir!r} does not exist")
    try:
        r = evaluate_run(cfg.output_dir, cfg.n_problems, cfg.batch_size, cfg.max_new_tokens,
                         cfg.n_boot, cfg.n_samples, cfg.device, cfg.eval_data,
                         cfg.allow_overlap, show_progress=True, rollout=cfg.rollout)
    except _user_errors() as e:
        _fail(option_message(str(e), EvalConfig))
    lo, hi = r["ci95"]
    console.print(f"accuracy final {r['accuracy_final']:.3f} vs start {r['accuracy_start']:.3f}"
                  f" on {r['n_problems']} held-out problems; difference {r['difference']:+.3f}"
                  f" (95% CI {lo:+.3f} .. {hi:+.3f})")


def main(argv: list[str] | None = None) -> None:
    """The ``grpo-scaleup`` entry point."""
    tyro.extras.subcommand_cli_from_dict(
        {"train": train, "eval": evaluate}, args=argv if argv is not None else sys.argv[1:],
        prog="grpo-scaleup", description="GRPO with LoRA on a causal LM (default "
        "Qwen2.5-0.5B-Instruct).", config=(tyro.conf.OmitArgPrefixes,))


if __name__ == "__main__":  # pragma: no cover
    main()
