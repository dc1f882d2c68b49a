"""The run configuration: one typed, documented dataclass (CleanRL style)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from grpospec import AGG_MODES, check_positive_int
from scaleup.tasks import TASKS


class ConfigError(ValueError):
    """A configuration value is out of range (the message names the option)."""


@dataclass
class TrainConfig:
    """Everything a GRPO + LoRA run depends on. Saved next to every checkpoint."""

    # model
    model: str = "Qwen/Qwen2.5-0.5B-Instruct"
    """hub id or local folder of a causal LM and its tokenizer"""
    device: str = "auto"
    """'auto' (cuda when available, else cpu), 'cpu', 'cuda' or 'cuda:N'"""
    dtype: str = "auto"
    """'auto' (bfloat16 on GPU, float32 on CPU), 'bfloat16' or 'float32'"""
    lora_r: int = 16
    """LoRA rank"""
    lora_alpha: int = 32
    """LoRA scaling numerator (scale = alpha / r)"""
    lora_dropout: float = 0.0
    """LoRA dropout, in every training pass (the first epoch replays logp_old's masks)"""
    lora_targets: str = "all-linear"
    """peft target_modules: 'all-linear' or a comma-separated list of module names"""
    gradient_checkpointing: bool = False
    """recompute the decoder's activations in the backward pass (saves memory)"""

    # task
    task: str = "arithmetic"
    """'arithmetic' (generated from the seed), 'gsm8k' (needs --data) or 'digit' (trivial)"""
    data: str | None = None
    """GSM8K training JSONL (question, answer ending '#### N')"""
    eval_data: str | None = None
    """GSM8K JSONL to evaluate on (required for GSM8K); no question may be in --data"""
    allow_overlap: bool = False
    """evaluate GSM8K even if --eval-data shares questions with --data (not held out then)"""
    digits: int = 2
    """arithmetic: the most digits an operand has"""
    operators: str = "+-*"
    """arithmetic: operators to draw from"""
    fallback_last_number: bool = False
    """checker: without a \\boxed{}, take the last number in the completion"""

    # GRPO
    steps: int = 200
    """number of GRPO steps"""
    prompts_per_step: int = 8
    """B, prompts sampled per step"""
    group_size: int = 8
    """G, completions per prompt"""
    max_new_tokens: int = 256
    """the most tokens a completion may have (longer ones are truncated)"""
    micro_batch_size: int = 8
    """sequences per forward/backward pass (gradient accumulation over the batch)"""
    inner_epochs: int = 1
    """optimizer steps on the same rollouts (1 or 2), one per pass over the micro-batches"""
    learning_rate: float = 2e-5
    """AdamW learning rate"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """clip the gradient's global norm to this (0 disables)"""
    clip_eps: float = 0.2
    """PPO clip range, low side"""
    clip_eps_high: float | None = None
    """PPO clip range, high side (DAPO clip-higher); None: clip-eps"""
    beta: float = 0.0
    """weight of the k3 KL penalty to the starting model (the adapter disabled)"""
    agg: str = "token"
    """loss aggregation: 'token' (batch token mean), 'seq' (mean of row means) or 'constant'"""
    std_norm: bool = True
    """divide advantages by the group std (GRPO) or not (Dr. GRPO)"""
    dynamic_sampling: bool = False
    """drop groups whose rewards are all equal before the update (DAPO)"""
    log_kl: bool = False
    """compute the KL to the reference for the logs even when beta = 0 (one more forward)"""
    logprob_chunk: int = 64
    """positions per chunk when turning hidden states into log-probs"""
    threads: int | None = None
    """torch CPU threads; None: 1 on CPU (more can be 60x slower on a busy machine)"""
    seed: int = 0
    """seeds the prompts, the LoRA init and the sampling"""

    # bookkeeping
    output_dir: str | None = None
    """run folder, new or empty; None: a new runs/grpo-scaleup-<time>"""
    save_every: int = 50
    """save a checkpoint every this many steps (and at the end)"""

    def validate(self) -> TrainConfig:
        """Raise :class:`ConfigError` naming the first bad option; return ``self``."""
        for name in ("lora_r", "lora_alpha", "digits", "steps", "prompts_per_step", "group_size",
                     "max_new_tokens", "micro_batch_size", "logprob_chunk", "save_every"):
            try:
                check_positive_int(name, getattr(self, name))
            except (TypeError, ValueError) as e:
                raise ConfigError(str(e)) from None
        _in(self.inner_epochs, (1, 2), "inner_epochs")
        _in(self.agg, AGG_MODES, "agg")
        _in(self.dtype, ("auto", "bfloat16", "float32"), "dtype")
        _in(self.task, TASKS, "task")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got "
                              f"{self.device!r}")
        _range(self.learning_rate, "learning_rate", 0, math.inf, low_open=True)
        _range(self.clip_eps, "clip_eps", 0, 1, low_open=True, high_open=True)
        if self.clip_eps_high is not None:
            _range(self.clip_eps_high, "clip_eps_high", 0, math.inf, low_open=True)
        _range(self.beta, "beta", 0, math.inf)
        _range(self.weight_decay, "weight_decay", 0, math.inf)
        _range(self.max_grad_norm, "max_grad_norm", 0, math.inf)
        _range(self.lora_dropout, "lora_dropout", 0, 1, high_open=True)
        if self.threads is not None:
            try:
                check_positive_int("threads", self.threads)
            except (TypeError, ValueError) as e:
                raise ConfigError(str(e)) from None
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        if self.task == "gsm8k" and not self.data:
            raise ConfigError("task 'gsm8k' needs --data, a GSM8K JSONL file")
        return self

    @property
    def batch_size(self) -> int:
        """Sequences per step, B * G."""
        return self.prompts_per_step * self.group_size

    def to_json(self, path: str | Path) -> None:
        """Write the config as JSON."""
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> TrainConfig:
        """Read a config written by :meth:`to_json` (unknown keys are an error)."""
        data = json.loads(Path(path).read_text())
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ConfigError(f"{path}: unknown config keys {sorted(unknown)}")
        return cls(**data)


def _in(value, allowed, name):
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


def _range(value, name, low, high, low_open=False, high_open=False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low)
    ok = ok and (value < high if high_open else value <= high)
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise ConfigError(f"{name} must be a number in {lo}{low}, {high}{hi}, got {value!r}")
