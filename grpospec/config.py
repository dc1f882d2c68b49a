"""The toy tasks' training configuration, one dataclass for both trainers."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from dataclasses import dataclass
from typing import Literal

from grpospec.checks import (
    AGG_MODES,
    IMPORTANCE_LEVELS,
    KL_ESTIMATORS,
    LOSS_MODES,
    check_overlong,
    check_positive_int,
    check_scale_rewards,
)

VOCAB_SIZE = 8  # the digits 0..7 of the counting tasks
COMPLETION_LENGTH = 5
END_TOKEN = 8  # the variable-length task's end token (its vocabulary is 9)
VARIABLE_LENGTH = 8

TASKS = ("counting", "sparse", "variable")
ESTIMATORS = ("grpo", "dr_grpo", "rloo", "gae", "reinforce_pp")


_VALIDATE: contextvars.ContextVar[bool] = contextvars.ContextVar("validate", default=True)


@contextlib.contextmanager
def deferred_validation():
    """Build configs without checking them (a command-line parser constructs them before
    the caller can word an error with the option's name); call ``validate()`` after."""
    token = _VALIDATE.set(False)
    try:
        yield
    finally:
        _VALIDATE.reset(token)


class PolicyLossVariants:
    """What both trainers' configurations (``CountingConfig``, ``grpospec.lm.LMConfig``)
    share about the loss's variants: their checks, ``grpo_loss``'s keyword arguments and
    whether the loss needs the entropy. (A mixin without fields: each dataclass declares
    its own, with its own documentation.)"""

    def validate_variants(self) -> None:
        """Raise ``ValueError`` naming the first bad variant field."""
        for name, allowed in (("loss_mode", LOSS_MODES), ("kl_estimator", KL_ESTIMATORS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.scale_rewards is not None:
            check_scale_rewards(self.scale_rewards)
            if self.estimator not in ("grpo", "dr_grpo"):
                raise ValueError(f"scale_rewards applies to estimator 'grpo' or 'dr_grpo', got "
                                 f"estimator {self.estimator!r}")
        if self.dual_clip is not None and self.loss_mode != "vanilla":
            raise ValueError(f"dual_clip needs loss_mode 'vanilla', got {self.loss_mode!r}")
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            if not (getattr(self, name) > 0):
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not (self.entropy_coef >= 0):
            raise ValueError(f"entropy_coef must be >= 0, got {self.entropy_coef!r}")
        if not (0 < self.top_entropy_quantile <= 1):
            raise ValueError(f"top_entropy_quantile must lie in (0, 1], got "
                             f"{self.top_entropy_quantile!r}")
        if not isinstance(self.mask_truncated, bool):
            raise TypeError(f"mask_truncated must be a bool, got {self.mask_truncated!r}")
        if self.overlong_buffer is not None:
            check_overlong(self.length, self.overlong_buffer, self.overlong_penalty)

    def loss_options(self) -> dict:
        """The keyword arguments of ``grpo_loss`` this configuration trains with (the
        same for both frameworks' trainers; ``entropy`` is passed by the trainer)."""
        return dict(clip_eps=self.clip_eps, beta=self.beta, agg=self.agg,
                    clip_eps_high=self.clip_eps_high, dual_clip=self.dual_clip,
                    importance_level=self.importance_level, max_len=self.length,
                    kl_estimator=self.kl_estimator, loss_mode=self.loss_mode,
                    entropy_coef=self.entropy_coef,
                    top_entropy_quantile=self.top_entropy_quantile,
                    sapo_temperature_pos=self.sapo_temperature_pos,
                    sapo_temperature_neg=self.sapo_temperature_neg)

    @property
    def needs_entropy(self) -> bool:
        """Whether the loss needs the per-token entropy (a bonus, or the top quantile)."""
        return self.entropy_coef != 0 or self.top_entropy_quantile < 1


@dataclass(frozen=True)
class CountingConfig(PolicyLossVariants):
    """GRPO (and its variants) on a toy task; the defaults reproduce SPEC section 4.

    One typed dataclass for both trainers and the ``jaxgrpo counting`` command line (each
    field's docstring is its ``--help`` line).
    """

    steps: int = 80
    """GRPO steps (each: sample, reward, advantages, inner-epochs updates)"""
    n_prompts: int = 16
    """prompts per step (B)"""
    group_size: int = 8
    """completions per prompt (G)"""
    inner_epochs: int = 2
    """full-batch optimizer steps per batch of rollouts (from the second, off-policy)"""
    learning_rate: float = 0.05
    """Adam's step size"""
    beta: float = 0.01
    """weight of the k3 KL penalty against the frozen initial policy"""
    clip_eps: float = 0.2
    """lower clip range eps_low, in (0, 1) (and the upper one unless clip-eps-high is set)"""
    clip_eps_high: float | None = None
    """DAPO's clip-higher upper range eps_high; None: clip-eps"""
    agg: Literal["token", "seq", "constant"] = "token"
    """loss aggregation: token (DAPO), seq (GRPO) or constant (Dr. GRPO: / (N * max length))"""
    estimator: Literal["grpo", "dr_grpo", "rloo", "gae", "reinforce_pp"] = "grpo"
    """advantages: grpo, dr_grpo, rloo, gae (PPO, a value head), reinforce_pp (batch-normed)"""
    scale_rewards: Literal["group", "batch", "none"] | None = None
    """TRL's scale_rewards for grpo/dr_grpo: std of the group, of the batch, or none"""
    gamma: float = 1.0
    """GAE's discount (estimator gae)"""
    lam: float = 0.95
    """GAE's lambda (estimator gae)"""
    vf_coef: float = 0.5
    """weight of the value loss (estimator gae)"""
    dual_clip: float | None = None
    """dual-clip bound c > 1 for negative advantages; None: off"""
    importance_level: Literal["token", "sequence"] = "token"
    """token ratios (PPO/GRPO) or sequence ratios (GSPO)"""
    loss_mode: Literal["vanilla", "cispo", "sapo", "gpg"] = "vanilla"
    """policy term: vanilla (clipped ratio), cispo, sapo (soft gate) or gpg (no ratio)"""
    sapo_temperature_pos: float = 1.0
    """SAPO's gate temperature where A > 0"""
    sapo_temperature_neg: float = 1.05
    """SAPO's gate temperature where A <= 0"""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """the KL term's per-token estimate (verl: kl, mse, low_var_kl)"""
    entropy_coef: float = 0.0
    """weight of the entropy bonus (verl's entropy_coeff), aggregated like the loss"""
    top_entropy_quantile: float = 1.0
    """TRL's: train the policy term on this share of highest-entropy tokens only"""
    mask_truncated: bool = False
    """variable task: completions without an end token contribute no loss (TRL's)"""
    overlong_buffer: int | None = None
    """variable task: DAPO's overlong penalty over the last this-many tokens; None: off"""
    overlong_penalty: float = 1.0
    """the overlong penalty at the length limit (verl's penalty_factor)"""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: sample oversample x the groups, keep those whose rewards vary"""
    oversample: int = 2
    """the pool size factor of dynamic sampling"""
    task: Literal["counting", "sparse", "variable"] = "counting"
    """counting (share of right positions), sparse (all right or 0), variable (end token)"""
    completion_length: int | None = None
    """tokens per completion; None: the task's (5, or 8 for variable)"""

    def __post_init__(self) -> None:
        if _VALIDATE.get():
            self.validate()

    def validate(self) -> CountingConfig:
        """Raise ``ValueError``/``TypeError`` naming the first bad field; return ``self``.
        (Called on construction, except inside :func:`deferred_validation`.)"""
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
        if (self.mask_truncated or self.overlong_buffer is not None) and self.task != "variable":
            raise ValueError("mask_truncated and overlong_buffer need task 'variable' (the task "
                             f"whose completions can end early), got task {self.task!r}")
        self.validate_variants()
        return self

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
