"""The counting task's training configuration, one dataclass for both trainers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from grpospec.checks import AGG_MODES, check_positive_int

VOCAB_SIZE = 8
COMPLETION_LENGTH = 5


@dataclass(frozen=True)
class CountingConfig:
    """GRPO on the counting task (SPEC section 4); the defaults reproduce it.

    Attributes:
      steps: GRPO steps (each: sample, reward, advantages, ``inner_epochs`` updates).
      n_prompts: prompts per step (B).
      group_size: completions per prompt (G).
      inner_epochs: full-batch optimizer steps on each step's rollouts; from the second
        on, the policy is off-policy by one update, so the ratio and clipping act.
      learning_rate: Adam's step size.
      beta: weight of the k3 KL penalty against the frozen initial policy.
      clip_eps: lower clipping range (and upper, unless ``clip_eps_high`` is set).
      clip_eps_high: DAPO's clip-higher upper range; ``None`` means ``clip_eps``.
      agg: loss aggregation, ``"token"`` (DAPO) or ``"seq"`` (GRPO).
      std_norm: divide advantages by the group std (GRPO) or not (Dr. GRPO).
    """

    steps: int = 80
    n_prompts: int = 16
    group_size: int = 8
    inner_epochs: int = 2
    learning_rate: float = 0.05
    beta: float = 0.01
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    agg: str = "token"
    std_norm: bool = True

    def __post_init__(self) -> None:
        for name in ("steps", "n_prompts", "group_size", "inner_epochs"):
            check_positive_int(name, getattr(self, name))
        if not (self.learning_rate > 0):
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        if not (0.0 < self.clip_eps < 1.0):
            raise ValueError(f"clip_eps must lie in (0, 1), got {self.clip_eps!r}")
        if self.clip_eps_high is not None and not (self.clip_eps_high > 0):
            raise ValueError(f"clip_eps_high must be > 0 (or None), got {self.clip_eps_high!r}")
        if not (self.beta >= 0):
            raise ValueError(f"beta must be >= 0, got {self.beta!r}")
        if self.agg not in AGG_MODES:
            raise ValueError(f"agg must be one of {AGG_MODES}, got {self.agg!r}")

    def replace(self, **changes) -> CountingConfig:
        return dataclasses.replace(self, **changes)


# Per-step metric names both trainers log, in this order.
METRIC_NAMES = (
    "mean_reward",
    "zero_var_frac",
    "clip_frac",
    "kl",
    "entropy",
    "loss",
)
