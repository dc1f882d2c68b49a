"""The language-model lab's tasks on tensors, plain PyTorch: prompts, the base model's
corpus, the checker. The rules are ``grpospec.lm``'s; ``jaxgrpo.lm_tasks`` is the same in
JAX, and both are tested against ``grpospec.lm.reference_reward``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

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

    a: torch.Tensor  # (N,) int64
    b: torch.Tensor  # (N,) int64
    tokens: torch.Tensor  # (N, P) prompt token ids
    mask: torch.Tensor  # (N, P) 1 at real prompt tokens, 0 at padding


def number_tokens(x: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical decimal digits of ``x`` (N,) >= 0, left-aligned in (N, width), then PAD;
    and the number of digits (N,). ``x`` must be below ``10^width``."""
    n = torch.ones_like(x)
    for k in range(1, width):
        n = n + (x >= 10**k).long()
    j = torch.arange(width)[None, :]
    power = (n[:, None] - 1 - j).clamp(min=0)
    digit = torch.div(x[:, None], 10**power, rounding_mode="floor") % 10
    return torch.where(j < n[:, None], digit, torch.full_like(digit, PAD)), n


def encode_prompts(a: torch.Tensor, b: torch.Tensor, digits: int) -> Problems:
    """``"a+b="`` left-padded to ``prompt_length(digits)`` tokens."""
    p = prompt_length(digits)
    da, la = number_tokens(a, digits)
    db, lb = number_tokens(b, digits)
    la, lb = la[:, None], lb[:, None]
    j = torch.arange(p)[None, :] - (p - (la + lb + 2))
    from_a = da.gather(1, j.clamp(0, digits - 1))
    from_b = db.gather(1, (j - la - 1).clamp(0, digits - 1))
    body = torch.where(j < la, from_a, torch.where(
        j == la, torch.full_like(j, PLUS), torch.where(j <= la + lb, from_b,
                                                       torch.full_like(j, EQUALS))))
    tokens = torch.where(j >= 0, body, torch.full_like(body, PAD))
    return Problems(a, b, tokens, (j >= 0).long())


def sample_problems(n: int, digits: int, generator: torch.Generator) -> Problems:
    """``n`` problems: each operand draws its number of digits uniformly in 1..digits,
    then a uniform number with that many digits (0..9 for one digit)."""
    n_dig = torch.randint(1, digits + 1, (2, n), generator=generator)
    low = torch.where(n_dig == 1, torch.zeros_like(n_dig), 10 ** (n_dig - 1))
    u = torch.rand((2, n), generator=generator, dtype=torch.float64)
    ab = low + (u * (10**n_dig - low)).long()
    return encode_prompts(ab[0], ab[1], digits)


def completion_mask(completions: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mask (N, L) float32, lengths (N,), ended (N,))``: the tokens up to and including
    the first end token; all L when there is none (truncated)."""
    length = completions.shape[1]
    is_end = completions == END
    ended = is_end.any(dim=1)
    end_idx = torch.where(ended, is_end.float().argmax(dim=1), torch.full_like(ended.long(),
                                                                              length - 1))
    mask = (torch.arange(length)[None, :] <= end_idx[:, None]).float()
    return mask, end_idx + 1, ended


def _answer_is(completions, content, rank, count, target, width) -> torch.Tensor:
    digits, n = number_tokens(target, width)
    expected = digits.gather(1, rank.clamp(0, width - 1))
    return (count == n) & (~content | (completions == expected)).all(dim=1)


def task_reward(task: str, problems: Problems, completions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reward, response mask, correctness and length of each completion.

    ``"arithmetic"``: 1 iff the completion ends and its content (scratch tokens dropped)
    is ``a + b``. ``"near"``: also ``NEAR_REWARD`` for ``a + b +- 1``. Same rules as
    ``grpospec.lm.reference_reward`` and ``jaxgrpo.lm_tasks.task_reward``.

    Returns:
      ``(rewards (N,) float32, mask (N, L) float32, correct (N,) bool, lengths (N,))``.
    """
    mask, lengths, ended = completion_mask(completions)
    before_end = torch.arange(completions.shape[1])[None, :] < (lengths - 1)[:, None]
    content = before_end & (completions != SCRATCH)
    rank = content.long().cumsum(dim=1) - 1
    count = content.sum(dim=1)
    width = 9  # sums stay below 10^9 (digits <= 4); a longer content never matches
    s = (problems.a + problems.b).long()
    correct = ended & _answer_is(completions, content, rank, count, s, width)
    rewards = correct.float()
    if task == "near":
        near = ended & (_answer_is(completions, content, rank, count, s + 1, width)
                        | ((s > 0) & _answer_is(completions, content, rank, count,
                                                (s - 1).clamp(min=0), width)))
        rewards = torch.where(correct, 1.0, torch.where(near, NEAR_REWARD, 0.0))
    return rewards, mask, correct, lengths


def corpus_completions(problems: Problems, cfg: LMConfig, generator: torch.Generator
                       ) -> torch.Tensor:
    """The base model's pretraining corpus: one demonstration (N, L) per problem.

    The answer is ``a + b`` with probability ``cfg.corpus_accuracy``, ``a + b +- 1`` with
    probability ``cfg.corpus_near`` (+1 when the sum is 0), else uniform in
    ``[0, 2 (10^digits - 1)]``; after it come k ~ U{0..max_scratch} scratch tokens (fewer
    when they would not fit), the end token, then padding: ``"7..#___"``.
    """
    n, length = problems.a.shape[0], cfg.completion_length
    s = problems.a + problems.b
    u = torch.rand(n, generator=generator)
    sign = torch.where((torch.rand(n, generator=generator) < 0.5) | (s == 0), 1, -1)
    random_answer = torch.randint(0, 2 * (10**cfg.digits - 1) + 1, (n,), generator=generator)
    answer = torch.where(u < cfg.corpus_accuracy, s,
                         torch.where(u < cfg.corpus_accuracy + cfg.corpus_near, s + sign,
                                     random_answer))
    width = answer_width(cfg.digits)
    digits, n_dig = number_tokens(answer, width)
    k = torch.minimum(torch.randint(0, cfg.max_scratch + 1, (n,), generator=generator),
                      length - n_dig - 1)[:, None]
    j = torch.arange(length)[None, :]
    n_dig = n_dig[:, None]
    body = digits.gather(1, j.clamp(0, width - 1).expand(n, length))
    full = torch.full_like(body, 0)
    return torch.where(j < n_dig, body, torch.where(
        j < n_dig + k, full + SCRATCH, torch.where(j == n_dig + k, full + END, full + PAD)))
