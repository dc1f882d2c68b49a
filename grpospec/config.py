"""The toy tasks' training configuration, one dataclass for both trainers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from grpospec.checks import AGG_MODES, IMPORTANCE_LEVELS, check_positive_int

VOCAB_SIZE = 8  # the digits 0..7 of the counting tasks
COMPLETION_LENGTH = 5
END_TOKEN = 8  # the variable-length task's end token (its vocabulary is 9)
VARIABLE_LENGTH = 8

TASKS = ("counting", "sparse", "variable")
ESTIMATORS = ("grpo", "dr_grpo", "rloo", "gae")


@dataclass(frozen=True)
class CountingConfig:
    """GRPO (and its variants) on a toy task; the defaults reproduce SPEC section 4.

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
      agg: loss aggregation, ``"token"`` (DAPO), ``"seq"`` (GRPO) or ``"constant"``
        (Dr. GRPO: divide by N x the task's maximum length).
      estimator: ``"grpo"`` (group std-normalised), ``"dr_grpo"`` (group mean only),
        ``"rloo"`` (leave-one-out mean) or ``"gae"`` (PPO: a learned value head, per-token
        GAE on the terminal reward, advantages whitened over the batch's valid tokens).
      gamma, lam: GAE's discount and lambda (``estimator="gae"``).
      vf_coef: weight of the value loss (``estimator="gae"``).
      dual_clip: dual-clip bound c > 1 for negative advantages, or ``None``.
      importance_level: ``"token"`` ratios, or ``"sequence"`` (GSPO).
      dynamic_sampling: DAPO's dynamic sampling: sample ``oversample`` times as many
        groups, keep groups whose rewards vary (in sampling order), fill the batch with
        zero-variance groups only when too few vary.
      oversample: the pool size factor of dynamic sampling.
      task: ``"counting"`` (fraction of correct positions), ``"sparse"`` (1 only for a
        fully correct completion) or ``"variable"`` (variable-length answers ended by an
        end token; see ``task_reward`` in either framework).
      completion_length: tokens per completion; ``None`` means the task's default
        (5 for counting and sparse, 8 for variable).
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
    estimator: str = "grpo"
    gamma: float = 1.0
    lam: float = 0.95
    vf_coef: float = 0.5
    dual_clip: float | None = None
    importance_level: str = "token"
    dynamic_sampling: bool = False
    oversample: int = 2
    task: str = "counting"
    completion_length: int | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "n_prompts", "group_size", "inner_epochs", "oversample"):
            check_positive_int(name, getattr(self, name))
        if self.completion_length is not None:
            check_positive_int("completion_length", self.completion_length)
        if not (self.learning_rate > 0):
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        if not (0.0 < self.clip_eps < 1.0):
            raise ValueError(f"clip_eps must lie in (0, 1), got {self.clip_eps!r}")
        if self.clip_eps_high is not None and not (self.clip_eps_high > 0):
            raise ValueError(f"clip_eps_high must be > 0 (or None), got {self.clip_eps_high!r}")
        if not (self.beta >= 0):
            raise ValueError(f"beta must be >= 0, got {self.beta!r}")
        if self.dual_clip is not None and not (self.dual_clip > 1):
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip!r}")
        for name in ("gamma", "lam"):
            if not (0.0 <= getattr(self, name) <= 1.0):
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)!r}")
        if not (self.vf_coef >= 0):
            raise ValueError(f"vf_coef must be >= 0, got {self.vf_coef!r}")
        for name, allowed in (("agg", AGG_MODES), ("estimator", ESTIMATORS), ("task", TASKS),
                              ("importance_level", IMPORTANCE_LEVELS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.estimator == "rloo" and self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for estimator='rloo', got {self.group_size}")

    @property
    def vocab_size(self) -> int:
        """The policy's vocabulary: 8 digits, plus the end token for the variable task."""
        return VOCAB_SIZE + 1 if self.task == "variable" else VOCAB_SIZE

    @property
    def length(self) -> int:
        """Tokens per completion."""
        if self.completion_length is not None:
            return self.completion_length
        return VARIABLE_LENGTH if self.task == "variable" else COMPLETION_LENGTH

    @property
    def value_head(self) -> bool:
        return self.estimator == "gae"

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The per-step metrics this configuration logs (a subset of ``METRIC_NAMES``)."""
        return logged_metrics(self.dual_clip, self.dynamic_sampling)

    def replace(self, **changes) -> CountingConfig:
        return dataclasses.replace(self, **changes)


# Per-step metrics both trainers log (``CountingConfig.metric_names`` picks those that exist
# for a configuration), with their definitions. Names follow TRL (``frac_reward_zero_std``,
# ``clip_ratio/*``) and verl (``pg_clipfrac_lower``) where the meaning is the same.
METRICS = {
    "mean_reward": "mean reward of the step's sampled completions, before the update",
    "frac_reward_zero_std": "share of the sampled groups whose rewards are all equal "
                            "(zero std: no learning signal)",
    "clip_ratio/low_mean": "share of trained tokens with A < 0 and ratio < 1 - eps_low "
                           "(the lower clip binds), last inner epoch",
    "clip_ratio/high_mean": "share of trained tokens with A > 0 and ratio > 1 + eps_high "
                            "(the upper clip binds), last inner epoch",
    "clip_ratio/region_mean": "share of trained tokens where either clip binds "
                              "(verl: pg_clipfrac), last inner epoch",
    "pg_clipfrac_lower": "share of trained tokens with A < 0 and ratio > c, where the "
                         "dual-clip bound binds (only with dual_clip)",
    "kl": "mean k3 estimate of KL to the initial policy over trained tokens, last inner "
          "epoch (nats)",
    "entropy": "mean token entropy of the policy over trained tokens, last inner epoch (nats)",
    "loss": "the loss of the last inner epoch, before its optimizer step",
    "correct_frac": "share of sampled completions that are fully correct",
    "mean_length": "mean completion length in tokens (up to and including the end token)",
    "len_correct": "mean length of correct completions (NaN when there are none)",
    "len_incorrect": "mean length of incorrect completions (NaN when there are none)",
    "sampled_tokens": "tokens sampled this step (the pool's response-mask sum)",
    "ds_dropped": "zero-variance groups of the sampled pool left out of the batch "
                  "(only with dynamic_sampling)",
    "ds_filled": "zero-variance groups put in the batch because too few groups varied "
                 "(0 = every trained group varies; only with dynamic_sampling)",
}
METRIC_NAMES = tuple(METRICS)  # every metric a configuration can log, in this order


def logged_metrics(dual_clip: float | None, dynamic_sampling: bool) -> tuple[str, ...]:
    """The per-step metrics a trainer logs (a subset of ``METRIC_NAMES``, in its order):
    ``pg_clipfrac_lower`` only with ``dual_clip``, ``ds_*`` only with dynamic sampling."""
    skip = set()
    if dual_clip is None:
        skip.add("pg_clipfrac_lower")
    if not dynamic_sampling:
        skip |= {"ds_dropped", "ds_filled"}
    return tuple(n for n in METRIC_NAMES if n not in skip)
