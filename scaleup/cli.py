"""``grpo-scaleup train|eval``: GRPO with LoRA from the command line (typer).

Errors in the user's input (a bad option, a missing model folder, a malformed data line,
an existing output folder) are printed as one clear message with exit code 2, never a
traceback from inside a library.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from scaleup.config import ConfigError, TrainConfig
from scaleup.modeling import ModelLoadError
from scaleup.tasks import TaskError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="GRPO with LoRA on a causal LM (default Qwen2.5-0.5B-Instruct).")
console = Console(stderr=True)
D = TrainConfig()  # defaults


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", soft_wrap=True, highlight=False)
    raise typer.Exit(code=2)


def _user_errors():
    from scaleup.train import OutputDirError
    return (ConfigError, ModelLoadError, TaskError, OutputDirError)


@app.command()
def train(
    model: str = typer.Option(D.model, help="Hub id or local folder of the model and tokenizer."),
    output_dir: str = typer.Option(D.output_dir, help="Run folder; refused if it exists "
                                   "and is not empty, unless --resume."),
    resume: bool = typer.Option(False, help="Continue the run in --output-dir from its last "
                                "checkpoint (its saved config is used)."),
    task: str = typer.Option(D.task, help="'arithmetic', 'gsm8k' (needs --data) or 'digit'."),
    data: str | None = typer.Option(D.data, help="GSM8K training JSONL file."),
    eval_data: str | None = typer.Option(D.eval_data, help="GSM8K held-out JSONL file."),
    digits: int = typer.Option(D.digits, help="Arithmetic: most digits of an operand."),
    operators: str = typer.Option(D.operators, help="Arithmetic: operators to draw from."),
    fallback_last_number: bool = typer.Option(D.fallback_last_number, help="Checker: use the "
                                              "last number when there is no \\boxed{}."),
    steps: int = typer.Option(D.steps, help="GRPO steps."),
    prompts_per_step: int = typer.Option(D.prompts_per_step, help="B, prompts per step."),
    group_size: int = typer.Option(D.group_size, help="G, completions per prompt."),
    max_new_tokens: int = typer.Option(D.max_new_tokens, help="Most tokens per completion."),
    micro_batch_size: int = typer.Option(D.micro_batch_size, help="Sequences per "
                                         "forward/backward (gradient accumulation)."),
    inner_epochs: int = typer.Option(D.inner_epochs, help="Optimizer steps per batch (1-2)."),
    learning_rate: float = typer.Option(D.learning_rate, help="AdamW learning rate."),
    weight_decay: float = typer.Option(D.weight_decay, help="AdamW weight decay."),
    max_grad_norm: float = typer.Option(D.max_grad_norm, help="Gradient clip norm (0: off)."),
    clip_eps: float = typer.Option(D.clip_eps, help="PPO clip range (low side)."),
    clip_eps_high: float | None = typer.Option(D.clip_eps_high, help="PPO clip range, high "
                                               "side (default: --clip-eps)."),
    beta: float = typer.Option(D.beta, help="KL penalty weight to the starting model."),
    agg: str = typer.Option(D.agg, help="Loss aggregation: 'token', 'seq' "
                              "or 'constant' (Dr. GRPO)."),
    std_norm: bool = typer.Option(D.std_norm, help="Divide advantages by the group std."),
    dynamic_sampling: bool = typer.Option(D.dynamic_sampling, help="Drop zero-variance "
                                          "groups before the update."),
    log_kl: bool = typer.Option(D.log_kl, help="Log the KL even when beta is 0."),
    lora_r: int = typer.Option(D.lora_r, help="LoRA rank."),
    lora_alpha: int = typer.Option(D.lora_alpha, help="LoRA alpha."),
    lora_dropout: float = typer.Option(D.lora_dropout, help="LoRA dropout."),
    lora_targets: str = typer.Option(D.lora_targets, help="'all-linear' or module names, "
                                     "comma-separated."),
    gradient_checkpointing: bool = typer.Option(D.gradient_checkpointing,
                                                help="Recompute activations (less memory)."),
    logprob_chunk: int = typer.Option(D.logprob_chunk, help="Positions per LM-head chunk."),
    device: str = typer.Option(D.device, help="'auto', 'cpu', 'cuda' or 'cuda:N'."),
    dtype: str = typer.Option(D.dtype, help="'auto' (bf16 on GPU), 'bfloat16', 'float32'."),
    seed: int = typer.Option(D.seed, help="Random seed."),
    save_every: int = typer.Option(D.save_every, help="Checkpoint every this many steps."),
) -> None:
    """Train a LoRA adapter with GRPO; logs to the console and <output-dir>/log.jsonl."""
    from scaleup.train import train as run_train

    values = dict(locals())
    values.pop("resume")
    values.pop("run_train")
    cfg = TrainConfig(**values)
    try:
        if resume:
            console.print(f"resuming {output_dir} with its saved config")
        result = run_train(cfg, resume=resume)
    except _user_errors() as e:
        _fail(str(e))
    log = result["log"]
    if log and result["rank"] == 0:
        console.print(f"done: {len(log)} steps, last mean reward "
                      f"{log[-1]['mean_reward']:.3f}; run in {result['output_dir']}")


@app.command("eval")
def evaluate(
    output_dir: str = typer.Option(D.output_dir, help="Run folder with checkpoints."),
    n_problems: int = typer.Option(200, help="Held-out problems."),
    batch_size: int = typer.Option(16, help="Problems per generate call."),
    max_new_tokens: int | None = typer.Option(None, help="Most tokens per completion "
                                              "(default: the run's)."),
    n_boot: int = typer.Option(10_000, help="Bootstrap resamples for the 95% interval."),
    n_samples: int = typer.Option(20, help="Completions of each model written to "
                                  "eval_samples.jsonl."),
    device: str | None = typer.Option(None, help="Override the run's device."),
) -> None:
    """Compare the last checkpoint with the starting model on a held-out set."""
    from scaleup.evaluate import evaluate_run

    for name, v in (("n_problems", n_problems), ("batch_size", batch_size), ("n_boot", n_boot)):
        if v < 1:
            _fail(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if not Path(output_dir).is_dir():
        _fail(f"--output-dir {output_dir!r} does not exist")
    try:
        r = evaluate_run(output_dir, n_problems, batch_size, max_new_tokens, n_boot, n_samples,
                         device)
    except _user_errors() as e:
        _fail(str(e))
    lo, hi = r["ci95"]
    console.print(f"accuracy final {r['accuracy_final']:.3f} vs start {r['accuracy_start']:.3f}"
                  f" on {r['n_problems']} problems; difference {r['difference']:+.3f} "
                  f"(95% CI {lo:+.3f} .. {hi:+.3f})")


if __name__ == "__main__":  # pragma: no cover
    app()
