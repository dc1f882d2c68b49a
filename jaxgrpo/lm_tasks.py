"""The language-model lab's tasks on arrays, in JAX: prompts, the base model's corpus, the
checker. The rules are ``grpospec.lm``'s (see its docstring); ``torchref.lm_tasks`` is
the same in PyTorch, and both are tested against ``grpospec.lm.reference_reward``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpospec.lm import (
    END,
    EQUALS,
    NEAR_REWARD,
    PAD,
    PLUS,
    SCRATCH,
    LMConfig,
    answer_width,
    prompt_length,
)


class Problems(NamedTuple):
    """A batch of ``a + b`` problems and their left-padded prompts."""

    a: jax.Array  # (N,) int32
    b: jax.Array  # (N,) int32
    tokens: jax.Array  # (N, P) prompt token ids
    mask: jax.Array  # (N, P) 1 at real prompt tokens, 0 at padding


def _n_digits(x: jax.Array, width: int) -> jax.Array:
    return sum((x >= 10**k).astype(jnp.int32) for k in range(1, width)) + jnp.ones_like(x)


def number_tokens(x: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
    """Canonical decimal digits of ``x`` (N,) >= 0, left-aligned in (N, width), then PAD;
    and the number of digits (N,). ``x`` must be below ``10^width``."""
    n = _n_digits(x, width)
    j = jnp.arange(width)[None, :]
    power = jnp.maximum(n[:, None] - 1 - j, 0)
    digit = (x[:, None] // (10 ** power)) % 10
    return jnp.where(j < n[:, None], digit, PAD).astype(jnp.int32), n


def encode_prompts(a: jax.Array, b: jax.Array, digits: int) -> Problems:
    """``"a+b="`` left-padded to ``prompt_length(digits)`` tokens."""
    p = prompt_length(digits)
    da, la = number_tokens(a, digits)
    db, lb = number_tokens(b, digits)
    la, lb = la[:, None], lb[:, None]
    # left-aligned body, then shifted right by the padding
    j = jnp.arange(p)[None, :] - (p - (la + lb + 2))
    body = jnp.where(j < la, jnp.take_along_axis(da, jnp.clip(j, 0, digits - 1), axis=1),
                     jnp.where(j == la, PLUS,
                               jnp.where(j <= la + lb, jnp.take_along_axis(
                                   db, jnp.clip(j - la - 1, 0, digits - 1), axis=1), EQUALS)))
    mask = (j >= 0).astype(jnp.int32)
    return Problems(a, b, jnp.where(j >= 0, body, PAD).astype(jnp.int32), mask)


def sample_problems(key: jax.Array, n: int, digits: int) -> Problems:
    """``n`` problems: each operand draws its number of digits uniformly in 1..digits,
    then a uniform number with that many digits (0..9 for one digit)."""
    k_len, k_val = jax.random.split(key)
    n_dig = jax.random.randint(k_len, (2, n), 1, digits + 1)
    low = jnp.where(n_dig == 1, 0, 10 ** (n_dig - 1))
    ab = jax.random.randint(k_val, (2, n), low, 10**n_dig)
    return encode_prompts(ab[0], ab[1], digits)


def completion_mask(completions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(mask (N, L) float32, lengths (N,), ended (N,))``: the tokens up to and including
    the first end token; all L when there is none (truncated)."""
    length = completions.shape[1]
    is_end = completions == END
    ended = jnp.any(is_end, axis=1)
    end_idx = jnp.where(ended, jnp.argmax(is_end, axis=1), length - 1)
    mask = (jnp.arange(length)[None, :] <= end_idx[:, None]).astype(jnp.float32)
    return mask, end_idx + 1, ended


def _answer_is(completions, content, rank, count, target, width) -> jax.Array:
    """Whether each completion's content (the non-scratch tokens before its end token)
    is exactly the canonical decimal of ``target``."""
    digits, n = number_tokens(target, width)
    expected = jnp.take_along_axis(digits, jnp.clip(rank, 0, width - 1), axis=1)
    return (count == n) & jnp.all(~content | (completions == expected), axis=1)


def task_reward(task: str, problems: Problems, completions: jax.Array
                ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Reward, response mask, correctness and length of each completion (``task`` static).

    ``"arithmetic"``: 1 iff the completion ends and its content (scratch tokens dropped)
    is ``a + b``. ``"near"``: also ``NEAR_REWARD`` for ``a + b +- 1``. Same rules as
    ``grpospec.lm.reference_reward`` and ``torchref.lm_tasks.task_reward``.

    Returns:
      ``(rewards (N,) float32, mask (N, L) float32, correct (N,) bool, lengths (N,))``.
    """
    mask, lengths, ended = completion_mask(completions)
    before_end = jnp.arange(completions.shape[1])[None, :] < (lengths - 1)[:, None]
    content = before_end & (completions != SCRATCH)
    rank = jnp.cumsum(content, axis=1) - 1
    count = jnp.sum(content, axis=1)
    width = 9  # sums stay below 10^9 (digits <= 4); a longer content never matches
    s = problems.a + problems.b
    correct = ended & _answer_is(completions, content, rank, count, s, width)
    rewards = correct.astype(jnp.float32)
    if task == "near":
        near = ended & (_answer_is(completions, content, rank, count, s + 1, width)
                        | ((s > 0) & _answer_is(completions, content, rank, count,
                                                jnp.maximum(s - 1, 0), width)))
        rewards = jnp.where(correct, 1.0, jnp.where(near, NEAR_REWARD, 0.0))
    return rewards, mask, correct, lengths


def corpus_completions(key: jax.Array, problems: Problems, cfg: LMConfig) -> jax.Array:
    """The base model's pretraining corpus: one demonstration (N, L) per problem.

    The answer is ``a + b`` with probability ``cfg.corpus_accuracy``, ``a + b +- 1`` with
    probability ``cfg.corpus_near`` (+1 when the sum is 0), else uniform in
    ``[0, 2 (10^digits - 1)]``; after it come k ~ U{0..max_scratch} scratch tokens (fewer
    when they would not fit), the end token, then padding: ``"7..#___"``.
    """
    n, length = problems.a.shape[0], cfg.completion_length
    k_kind, k_sign, k_rand, k_scratch = jax.random.split(key, 4)
    s = problems.a + problems.b
    u = jax.random.uniform(k_kind, (n,))
    sign = jnp.where((jax.random.bernoulli(k_sign, 0.5, (n,))) | (s == 0), 1, -1)
    random_answer = jax.random.randint(k_rand, (n,), 0, 2 * (10**cfg.digits - 1) + 1)
    answer = jnp.where(u < cfg.corpus_accuracy, s,
                       jnp.where(u < cfg.corpus_accuracy + cfg.corpus_near, s + sign,
                                 random_answer))
    width = answer_width(cfg.digits)
    digits, n_dig = number_tokens(answer, width)
    k = jnp.minimum(jax.random.randint(k_scratch, (n,), 0, cfg.max_scratch + 1),
                    length - n_dig - 1)[:, None]
    j = jnp.arange(length)[None, :]
    n_dig = n_dig[:, None]
    body = jnp.take_along_axis(digits, jnp.clip(j, 0, width - 1), axis=1)
    return jnp.where(j < n_dig, body, jnp.where(j < n_dig + k, SCRATCH,
                                                 jnp.where(j == n_dig + k, END, PAD)))
