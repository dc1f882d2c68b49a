"""The language-model lab's framework-free rules: vocabulary, tasks, checker, sizes, config.

Both trainers (``jaxgrpo.lm``, ``torchref.lm``) implement these rules on arrays; the
plain-Python versions here (:func:`reference_reward`, :func:`prompt_text`) are the
independent truth the tests hold both against.

Vocabulary (15 tokens): the digits ``0``-``9`` are ids 0-9, then ``+`` (10), ``=`` (11),
the end token ``#`` (12), the free scratch token ``.`` (13) and padding ``_`` (14).

A prompt is ``a+b=`` left-padded to a fixed length. A completion is read up to and
including its first end token (the response mask covers exactly those tokens; all of
them when no end token comes: truncated, and then never correct). Scratch tokens are
free: the checker ignores them wherever they are, so a right or a wrong answer can be
short or long (the base model's corpus writes them after the answer, ``"7..#"``, so
that a policy can make its length depend on the answer it gave). What is left before
the end token must be the canonical decimal of a number (no sign, no leading zero) for
the answer to count.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from grpospec.checks import AGG_MODES, IMPORTANCE_LEVELS, check_positive_int
from grpospec.config import _VALIDATE, PolicyLossVariants, logged_metrics

PLUS, EQUALS, END, SCRATCH, PAD = 10, 11, 12, 13, 14
LM_VOCAB_SIZE = 15
TOKEN_TEXT = "0123456789+=#._"  # TOKEN_TEXT[id] is the character of token id

LM_TASKS = ("arithmetic", "near")
LM_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "gae", "reinforce_pp")
NEAR_REWARD = 0.5  # the "near" task's reward for an answer off by exactly one

_CANONICAL = re.compile(r"0|[1-9][0-9]*")


def prompt_length(digits: int) -> int:
    """Tokens of a padded prompt: two operands of up to ``digits`` digits, ``+`` and ``=``."""
    return 2 * digits + 2


def answer_width(digits: int) -> int:
    """Digits of the largest sum of two ``digits``-digit operands."""
    return digits + 1


def decode(tokens) -> str:
    """Token ids -> text, e.g. ``[1, 2, 12]`` -> ``"12#"``."""
    return "".join(TOKEN_TEXT[int(t)] for t in tokens)


def encode(text: str) -> list[int]:
    """Text over ``TOKEN_TEXT`` -> token ids (a clear error for any other character)."""
    bad = sorted(set(text) - set(TOKEN_TEXT))
    if bad:
        raise ValueError(f"text must use only the characters {TOKEN_TEXT!r}, got {bad}")
    return [TOKEN_TEXT.index(c) for c in text]


def prompt_text(a: int, b: int, digits: int) -> str:
    """The padded prompt of ``a + b``: ``"_3+45="`` for digits=2."""
    body = f"{a}+{b}="
    return "_" * (prompt_length(digits) - len(body)) + body


def parse_completion(text: str) -> tuple[int | None, int, bool]:
    """``(number or None, length, ended)`` of a completion's text.

    The completion is cut after its first ``#`` (length counts up to and including it;
    the whole text when there is none, and then ``ended`` is False and the number None).
    Scratch ``.`` are dropped; the rest must be a canonical decimal number.
    """
    cut = text.find("#")
    if cut < 0:
        return None, len(text), False
    content = text[:cut].replace(".", "")
    number = int(content) if _CANONICAL.fullmatch(content) else None
    return number, cut + 1, True


def reference_reward(task: str, a: int, b: int, completion_text: str) -> tuple[float, bool, int]:
    """``(reward, correct, length)`` of one completion, in plain Python.

    ``"arithmetic"``: reward 1 when the number equals ``a + b``, else 0.
    ``"near"``: 1 for ``a + b``, ``NEAR_REWARD`` for ``a + b +- 1``, else 0 (an exploration
    task: its base model is mostly off by one, so the exact sum is the rare better answer).
    ``correct`` is ``number == a + b``.
    """
    if task not in LM_TASKS:
        raise ValueError(f"task must be one of {LM_TASKS}, got {task!r}")
    number, length, _ = parse_completion(completion_text)
    correct = number is not None and number == a + b
    if task == "near" and not correct and number is not None and abs(number - (a + b)) == 1:
        return NEAR_REWARD, False, length
    return float(correct), correct, length


@dataclass(frozen=True)
class ModelSizes:
    """A Qwen2-architecture decoder's sizes (the fields of ``transformers.Qwen2Config``).

    ``head_dim = hidden_size // num_heads``; the embedding is tied to the output head.
    """

    vocab_size: int = LM_VOCAB_SIZE
    hidden_size: int = 32
    intermediate_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads"):
            check_positive_int(name, getattr(self, name))
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of "
                             f"num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"the head size hidden_size / num_heads must be even for rotary "
                             f"embeddings, got {self.head_dim}")
        for name in ("rope_theta", "rms_norm_eps", "init_std"):
            if not (getattr(self, name) > 0):
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def hf_config_kwargs(self) -> dict:
        """Keyword arguments of the equal ``transformers.Qwen2Config``.

        ``pad_token_id`` is ``None``: with one, ``transformers`` gives its embedding a
        ``padding_idx``, whose lookups get no gradient, while the padding token is an
        ordinary (if useless) token a policy can sample; both frameworks train every row.
        """
        return dict(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                    intermediate_size=self.intermediate_size,
                    num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
                    num_key_value_heads=self.num_kv_heads, rope_theta=self.rope_theta,
                    rms_norm_eps=self.rms_norm_eps, initializer_range=self.init_std,
                    tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
                    attention_dropout=0.0, max_position_embeddings=4096,
                    bos_token_id=None, eos_token_id=END, pad_token_id=None)

    @classmethod
    def from_hf_config(cls, config) -> ModelSizes:
        """The sizes of a ``transformers.Qwen2Config`` (tied embeddings, no sliding window)."""
        if not getattr(config, "tie_word_embeddings", False):
            raise ValueError("the Qwen2 config must tie its embeddings "
                             "(tie_word_embeddings=True): the model's head is the embedding")
        if getattr(config, "use_sliding_window", False):
            raise ValueError("the Qwen2 config must not use a sliding window "
                             "(use_sliding_window=False)")
        hd = getattr(config, "head_dim", None)
        if hd is not None and hd != config.hidden_size // config.num_attention_heads:
            raise ValueError(f"head_dim must be hidden_size / num_attention_heads, got {hd}")
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"only default rotary embeddings are supported, "
                             f"got rope_type {rope.get('rope_type')!r}")
        return cls(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                   intermediate_size=config.intermediate_size,
                   num_layers=config.num_hidden_layers, num_heads=config.num_attention_heads,
                   num_kv_heads=config.num_key_value_heads, rope_theta=float(theta),
                   rms_norm_eps=config.rms_norm_eps, init_std=config.initializer_range)


_SIZE_FIELDS = tuple(f.name for f in dataclasses.fields(ModelSizes) if f.name != "vocab_size")


@dataclass(frozen=True)
class LMConfig(PolicyLossVariants):
    """GRPO (and its variants) on a tiny Qwen2-architecture language model.

    A run first makes its *base model*: the randomly initialised decoder is pretrained
    for ``pretrain_steps`` Adam steps of next-token cross-entropy on a noisy corpus of
    solved prompts, whose answers are right with probability ``base_accuracy``, off by
    one with probability ``base_near``, else a uniformly random number in
    ``[0, 2 * (10^digits - 1)]``, each followed by 0..``max_scratch`` scratch tokens. The
    corpus sets the base model's pass rate, as pretraining does for a real LLM. GRPO then
    post-trains the base model, which is also the frozen reference of the KL term.

    Attributes:
      task: ``"arithmetic"`` (reward 1 for the right sum) or ``"near"`` (also
        ``NEAR_REWARD`` for an answer off by one; see ``reference_reward``).
      digits: operands draw their number of digits uniformly in 1..digits (difficulty).
      completion_length: tokens sampled per completion (L).
      max_scratch: the corpus puts 0..max_scratch scratch tokens after each answer.
      base_accuracy: the corpus's share of right answers; ``None``: the task's default
        (0.1 for arithmetic, 0 for near).
      base_near: the corpus's share of answers off by one; ``None``: the task's default
        (0.5 for arithmetic, 0.9 for near: after 2000 steps of pretraining that base model
        gives the exact sum about 1% of the time).
      hidden_size: the decoder's width.
      intermediate_size: the SwiGLU MLP's width.
      num_layers: decoder layers.
      num_heads: query heads.
      num_kv_heads: key/value heads (grouped-query attention: a divisor of num_heads).
      rope_theta: the rotary embeddings' base.
      rms_norm_eps: RMSNorm's epsilon.
      init_std: the initial weights' standard deviation.
      pretrain_steps: Adam steps of the base model's pretraining (0: a random base).
      pretrain_batch: demonstrations per pretraining step.
      pretrain_lr: the pretraining's Adam step size.
      base_seed: the seed of the base model (its initialisation, corpus and pretraining),
        shared by every run, as post-training runs start from one checkpoint; ``None``:
        each run pretrains its own base model from its own key.
      steps: GRPO steps (each: sample, reward, advantages, ``inner_epochs`` updates).
      n_prompts: prompts per step (B).
      group_size: completions per prompt (G).
      inner_epochs: full-batch optimizer steps on each step's rollouts.
      learning_rate: the post-training's Adam step size.
      beta: weight of the KL penalty (``kl_estimator``) against the base model (0: the
        term is dropped).
      clip_eps: lower clipping range (and upper, unless ``clip_eps_high`` is set).
      clip_eps_high: DAPO's clip-higher upper range; ``None`` means ``clip_eps``.
      agg: loss aggregation, ``"token"`` (DAPO), ``"seq"`` (GRPO) or ``"constant"``
        (Dr. GRPO: divide by N x completion_length).
      estimator: ``"grpo"``, ``"dr_grpo"``, ``"rloo"``, ``"gae"`` (PPO: a value head on
        the final hidden state, per-token GAE on the terminal reward, whitened) or
        ``"reinforce_pp"`` (REINFORCE++: the batch-normalised reward).
      scale_rewards: TRL's ``scale_rewards`` for grpo/dr_grpo: divide by the std of the
        ``"group"``, of the ``"batch"``, or ``"none"``; ``None``: the estimator's own.
      gamma: GAE's discount (estimator gae).
      lam: GAE's lambda (estimator gae).
      vf_coef: weight of the value loss (estimator gae).
      dual_clip: dual-clip bound c > 1 for negative advantages, or ``None``.
      importance_level: ``"token"`` ratios, or ``"sequence"`` (GSPO).
      dynamic_sampling: DAPO's dynamic sampling: sample ``oversample`` times as many
        groups, keep those whose rewards vary, fill up with zero-variance ones.
      oversample: the pool size factor of dynamic sampling.
      max_grad_norm: clip the gradient's global norm to this before each Adam step (as
        TRL's ``max_grad_norm``); ``None``: no clipping.
      entropy_coef: weight of the entropy bonus ``- entropy_coef * H`` in the loss
        (``H`` aggregated over tokens as the loss is; 0: no bonus, the term is skipped).
      loss_mode: the policy term: ``"vanilla"`` (the clipped ratio), ``"cispo"``,
        ``"sapo"`` (a soft gate) or ``"gpg"`` (no ratio).
      sapo_temperature_pos: SAPO's gate temperature where A > 0.
      sapo_temperature_neg: SAPO's gate temperature where A <= 0.
      kl_estimator: the KL term's per-token estimate, ``"k1"``, ``"k2"`` or ``"k3"``
        (verl: kl, mse, low_var_kl); also the logged ``kl``.
      top_entropy_quantile: TRL's: train the policy term on this share of the
        highest-entropy tokens only (1: every token).
      mask_truncated: completions without an end token contribute no loss (TRL's
        ``mask_truncated_completions``).
      overlong_buffer: DAPO's overlong penalty over the last this-many tokens of
        ``completion_length``; ``None``: off.
      overlong_penalty: the overlong penalty at the length limit (verl's
        ``penalty_factor``).
    """

    task: str = "arithmetic"
    digits: int = 1
    completion_length: int = 8
    max_scratch: int = 3
    base_accuracy: float | None = None
    base_near: float | None = None
    hidden_size: int = 32
    intermediate_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    init_std: float = 0.02
    pretrain_steps: int = 800
    pretrain_batch: int = 128
    pretrain_lr: float = 0.01
    base_seed: int | None = 0
    steps: int = 120
    n_prompts: int = 16
    group_size: int = 8
    inner_epochs: int = 2
    learning_rate: float = 0.002
    beta: float = 0.0
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
    max_grad_norm: float | None = 1.0
    entropy_coef: float = 0.0
    scale_rewards: str | None = None
    loss_mode: str = "vanilla"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    kl_estimator: str = "k3"
    top_entropy_quantile: float = 1.0
    mask_truncated: bool = False
    overlong_buffer: int | None = None
    overlong_penalty: float = 1.0

    def __post_init__(self) -> None:
        if _VALIDATE.get():
            self.validate()

    def validate(self) -> LMConfig:
        """Raise ``ValueError``/``TypeError`` naming the first bad field; return ``self``.
        (Called on construction, except inside ``grpospec.deferred_validation``.)"""
        for name in ("digits", "completion_length", "pretrain_batch", "steps", "n_prompts",
                     "group_size", "inner_epochs", "oversample"):
            check_positive_int(name, getattr(self, name))
        for name in ("max_scratch", "pretrain_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not hasattr(value, "__index__") or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.digits > 4:
            raise ValueError(f"digits must be at most 4, got {self.digits}")
        if self.completion_length < answer_width(self.digits) + 1:
            raise ValueError(f"completion_length must leave room for the answer and the end "
                             f"token: at least {answer_width(self.digits) + 1} for "
                             f"digits={self.digits}, got {self.completion_length}")
        if self.base_seed is not None and (isinstance(self.base_seed, bool)
                                           or not hasattr(self.base_seed, "__index__")):
            raise TypeError(f"base_seed must be an int or None, got {self.base_seed!r}")
        acc, near = self.corpus_accuracy, self.corpus_near
        for name, value in (("base_accuracy", acc), ("base_near", near)):
            if not (0.0 <= value <= 1.0):
                raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
        if acc + near > 1.0:
            raise ValueError(f"base_accuracy + base_near must be at most 1, got {acc + near}")
        for name in ("learning_rate", "pretrain_lr"):
            if not (getattr(self, name) > 0):
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not (0.0 < self.clip_eps < 1.0):
            raise ValueError(f"clip_eps must lie in (0, 1), got {self.clip_eps!r}")
        if self.clip_eps_high is not None and not (self.clip_eps_high > 0):
            raise ValueError(f"clip_eps_high must be > 0 (or None), got {self.clip_eps_high!r}")
        for name in ("beta", "vf_coef"):
            if not (getattr(self, name) >= 0):
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.dual_clip is not None and not (self.dual_clip > 1):
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip!r}")
        if self.max_grad_norm is not None and not (self.max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be > 0 (or None), got {self.max_grad_norm!r}")
        for name in ("gamma", "lam"):
            if not (0.0 <= getattr(self, name) <= 1.0):
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)!r}")
        for name, allowed in (("agg", AGG_MODES), ("estimator", LM_ESTIMATORS),
                              ("task", LM_TASKS), ("importance_level", IMPORTANCE_LEVELS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.estimator == "rloo" and self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for estimator='rloo', got {self.group_size}")
        self.validate_variants()
        self.model  # the sizes' own checks  # noqa: B018
        return self

    @property
    def model(self) -> ModelSizes:
        """The decoder's sizes."""
        return ModelSizes(**{name: getattr(self, name) for name in _SIZE_FIELDS})

    @property
    def corpus_accuracy(self) -> float:
        if self.base_accuracy is not None:
            return self.base_accuracy
        return 0.0 if self.task == "near" else 0.1

    @property
    def corpus_near(self) -> float:
        if self.base_near is not None:
            return self.base_near
        return 0.9 if self.task == "near" else 0.5

    @property
    def prompt_length(self) -> int:
        return prompt_length(self.digits)

    @property
    def length(self) -> int:
        """Tokens per completion (the name the shared loss code reads)."""
        return self.completion_length

    @property
    def value_head(self) -> bool:
        return self.estimator == "gae"

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The per-step metrics this configuration logs (``grpospec.logged_metrics``)."""
        return logged_metrics(self.dual_clip, self.dynamic_sampling)

    def replace(self, **changes) -> LMConfig:
        return dataclasses.replace(self, **changes)
