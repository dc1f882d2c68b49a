"""The run configuration: one typed, documented dataclass (CleanRL style)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from grpospec import AGG_MODES, check_positive_int
from grpospec.checks import (
    IMPORTANCE_LEVELS,
    KL_ESTIMATORS,
    LOSS_MODES,
    SCALE_REWARDS,
    check_overlong,
)
from scaleup.tasks import TASKS

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp")  # no value model: no "gae"
ROLLOUTS = ("hf", "vllm")
REPORT_TO = ("none", "tensorboard", "wandb", "trackio")  # TRL's report_to values


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
    estimator: str = "grpo"
    """advantages: 'grpo', 'dr_grpo' (no std), 'rloo' or 'reinforce_pp' (batch mean, std)"""
    scale_rewards: str | None = None
    """grpo/dr_grpo: std of the 'group', the 'batch' (all ranks) or 'none'; None: estimator's"""
    importance_level: str = "token"
    """'token' ratios (PPO/GRPO) or one length-normalised ratio per 'sequence' (GSPO)"""
    dual_clip: float | None = None
    """dual-clip bound c > 1: objective >= c * A where A < 0 (loss-mode vanilla); None: off"""
    loss_mode: str = "vanilla"
    """policy term: 'vanilla' (clipped ratio), 'cispo', 'sapo' (soft gate), 'gpg' (no ratio)"""
    sapo_temperature_pos: float = 1.0
    """SAPO's gate temperature where A > 0 (loss-mode sapo)"""
    sapo_temperature_neg: float = 1.05
    """SAPO's gate temperature where A <= 0 (loss-mode sapo)"""
    kl_estimator: str = "k3"
    """the penalty's per-token KL estimate: 'k1', 'k2', 'k3' (the logged kl stays k3)"""
    entropy_coef: float = 0.0
    """weight of an entropy bonus with its gradient (verl's entropy_coeff), aggregated as agg"""
    top_entropy_quantile: float = 1.0
    """policy term on this top share of tokens by entropy (quantile over the whole batch)"""
    mask_truncated: bool = False
    """completions with no end-of-turn token get no loss (TRL's mask_truncated_completions)"""
    overlong_buffer: int | None = None
    """DAPO's soft overlong penalty over the last this-many of max-new-tokens; None: off"""
    overlong_penalty: float = 1.0
    """the overlong penalty (subtracted from the reward) at max-new-tokens, >= 0"""
    dynamic_sampling: bool = False
    """drop groups whose rewards are all equal before the update (DAPO)"""
    log_kl: bool = False
    """compute the KL to the reference for the logs even when beta = 0 (one more forward)"""
    logprob_chunk: int = 64
    """positions per chunk when turning hidden states into log-probs"""
    separate_logp_old: bool = False
    """one inner epoch: compute logp_old in its own no-grad pass (else the forward's, detached)"""
    rollout: str = "hf"
    """sampler: 'hf' (transformers generate) or 'vllm' (a colocated vLLM engine, the adapter)"""
    tis_cap: float | None = None
    """truncated importance sampling C >= 1: policy term * min(exp(old - sampler), C); needs vllm"""
    vllm_gpu_memory_utilization: float | None = None
    """vLLM's share of GPU memory (on CPU: of RAM); None: 0.3 on GPU, 0.2 on CPU"""
    vllm_enable_sleep_mode: bool = False
    """GPU: vLLM frees its memory while the trainer updates (sleep / wake_up each step)"""
    vllm_weight_sync: str = "merged"
    """how vLLM gets each update: 'merged' (W + BA loaded into it) or 'lora' (a LoRARequest)"""
    vllm_enforce_eager: bool = False
    """vLLM without compilation / CUDA graphs: starts much faster, samples more slowly"""
    report_to: str = "none"
    """experiment tracking: 'none', 'tensorboard' (<output-dir>/tensorboard), 'wandb', 'trackio'"""
    threads: int | None = None
    """torch CPU threads, the vLLM engine's too with --rollout vllm; None: 1 on CPU (more can
    be 60x slower on a busy machine)"""
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
        _in(self.estimator, ESTIMATORS, "estimator")
        if self.scale_rewards is not None:
            _in(self.scale_rewards, SCALE_REWARDS, "scale_rewards")
            if self.estimator not in ("grpo", "dr_grpo"):
                raise ConfigError(f"scale_rewards applies to estimator 'grpo' or 'dr_grpo', "
                                  f"got estimator {self.estimator!r}")
        if self.estimator == "rloo" and self.group_size < 2:
            raise ConfigError(f"group_size must be >= 2 for estimator 'rloo', got "
                              f"{self.group_size}")
        _in(self.importance_level, IMPORTANCE_LEVELS, "importance_level")
        _in(self.loss_mode, LOSS_MODES, "loss_mode")
        _in(self.kl_estimator, KL_ESTIMATORS, "kl_estimator")
        if self.dual_clip is not None:
            _range(self.dual_clip, "dual_clip", 1, math.inf, low_open=True)
            if self.loss_mode != "vanilla":
                raise ConfigError(f"dual_clip needs loss_mode 'vanilla', got "
                                  f"{self.loss_mode!r}")
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            _range(getattr(self, name), name, 0, math.inf, low_open=True)
        _range(self.entropy_coef, "entropy_coef", 0, math.inf)
        _range(self.top_entropy_quantile, "top_entropy_quantile", 0, 1, low_open=True)
        if not isinstance(self.mask_truncated, bool):
            raise ConfigError(f"mask_truncated must be true or false, got "
                              f"{self.mask_truncated!r}")
        if self.overlong_buffer is not None:
            try:
                check_overlong(self.max_new_tokens, self.overlong_buffer, self.overlong_penalty)
            except (TypeError, ValueError) as e:
                msg = str(e).replace("the maximum length", "max_new_tokens")
                raise ConfigError(msg) from None
        _range(self.overlong_penalty, "overlong_penalty", 0, math.inf)
        _in(self.rollout, ROLLOUTS, "rollout")
        _in(self.report_to, REPORT_TO, "report_to")
        _in(self.vllm_weight_sync, ("merged", "lora"), "vllm_weight_sync")
        if self.tis_cap is not None:
            _range(self.tis_cap, "tis_cap", 1, math.inf)
            if self.rollout != "vllm":
                raise ConfigError("tis_cap corrects a sampler that differs from the trainer: it "
                                  f"needs --rollout vllm, got rollout {self.rollout!r}")
        if self.vllm_gpu_memory_utilization is not None:
            _range(self.vllm_gpu_memory_utilization, "vllm_gpu_memory_utilization", 0, 1,
                   low_open=True)
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
    def needs_entropy(self) -> bool:
        """The loss needs per-token entropies: a bonus (with gradient) or the top quantile."""
        return self.entropy_coef != 0 or self.top_entropy_quantile < 1

    def loss_options(self) -> dict:
        """The keyword arguments of ``torchref.grpo_loss`` this run trains with (``entropy``
        and the top-entropy mask are passed by :func:`scaleup.step.loss_backward`)."""
        return dict(clip_eps=self.clip_eps, beta=self.beta, agg=self.agg,
                    clip_eps_high=self.clip_eps_high, dual_clip=self.dual_clip,
                    importance_level=self.importance_level, max_len=self.max_new_tokens,
                    kl_estimator=self.kl_estimator, loss_mode=self.loss_mode,
                    entropy_coef=self.entropy_coef,
                    sapo_temperature_pos=self.sapo_temperature_pos,
                    sapo_temperature_neg=self.sapo_temperature_neg, tis_cap=self.tis_cap)

    @property
    def batch_size(self) -> int:
        """Sequences per step, B * G."""
        return self.prompts_per_step * self.group_size

    def to_json(self, path: str | Path) -> None:
        """Write the config as JSON."""
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> TrainConfig:
        """Read a config written by :meth:`to_json` (unknown keys are an error). A config
        saved before ``estimator`` existed has ``std_norm``: true reads as
        ``estimator="grpo"``, false as ``"dr_grpo"``."""
        data = json.loads(Path(path).read_text())
        if "std_norm" in data and "estimator" not in data:
            data["estimator"] = "grpo" if data.pop("std_norm") else "dr_grpo"
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


@dataclass
class EvalConfig:
    """``grpo-scaleup eval``: the final adapter against the starting model.

    Its defaults are also :func:`scaleup.evaluate.evaluate_run`'s (one place).
    """

    output_dir: str
    """run folder with checkpoints (the newest complete one is evaluated)"""
    n_problems: int = 200
    """held-out problems"""
    batch_size: int = 16
    """problems per generate call"""
    max_new_tokens: int | None = None
    """most tokens per completion; None: the run's"""
    n_boot: int = 10_000
    """bootstrap resamples for the 95% interval"""
    n_samples: int = 20
    """completions of each model written to eval_samples.jsonl"""
    device: str | None = None
    """the device; None: the run's"""
    eval_data: str | None = None
    """GSM8K evaluation JSONL; None: the run's --eval-data"""
    allow_overlap: bool | None = None
    """evaluate GSM8K even if --eval-data overlaps the training file; None: the run's"""
    rollout: str | None = None
    """decoder: 'hf' (generate) or 'vllm' (a vLLM engine serving the adapter); None: the run's"""
