"""Softmax-bandit policy gradients (SPEC section 1), plain PyTorch."""

from __future__ import annotations

import math

import torch

from grpospec import check_bandit, check_positive_int, scalar_or_none


def _check_tensor(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def exact_policy_gradient(theta: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """Exact ``dJ/dtheta = pi * (r - E_pi[r])`` of ``J = sum_a softmax(theta)_a r_a``.

    Args:
      theta: logits, shape (K,).
      rewards: reward of each action, shape (K,).
    Returns:
      the gradient, shape (K,).
    """
    _check_tensor("theta", theta)
    _check_tensor("rewards", rewards)
    check_bandit(tuple(theta.shape), tuple(rewards.shape))
    pi = torch.softmax(theta, dim=-1)
    return pi * (rewards - (pi * rewards).sum())


def reinforce_gradient(
    theta: torch.Tensor,
    rewards: torch.Tensor,
    n: int,
    baseline: float,
    rng: torch.Generator,
) -> torch.Tensor:
    """REINFORCE estimate ``mean_i (r(a_i) - b) * (onehot(a_i) - pi)``, a_i ~ softmax(theta).

    All ``n`` samples are drawn at once with ``torch.multinomial`` from ``rng``, and the
    score ``onehot(a) - pi`` (the gradient of ``log pi(a)`` wrt theta) is built for all
    of them together.

    Args:
      theta: logits, shape (K,).
      rewards: reward of each action, shape (K,).
      n: number of sampled actions, >= 1.
      baseline: a number b that does not depend on the sampled actions.
      rng: the ``torch.Generator`` all randomness comes from.
    Returns:
      the estimate, shape (K,).
    """
    _check_tensor("theta", theta)
    _check_tensor("rewards", rewards)
    check_bandit(tuple(theta.shape), tuple(rewards.shape))
    n = check_positive_int("n", n)
    b = scalar_or_none(baseline, "baseline")
    if b is None or not math.isfinite(b):
        raise ValueError(f"baseline must be a finite number, got {baseline!r}")
    if not isinstance(rng, torch.Generator):
        raise TypeError(f"rng must be a torch.Generator, got {type(rng).__name__}")
    pi = torch.softmax(theta, dim=-1)
    actions = torch.multinomial(pi, n, replacement=True, generator=rng)  # (n,)
    score = torch.nn.functional.one_hot(actions, theta.shape[0]).to(theta.dtype) - pi  # (n, K)
    return ((rewards[actions] - b)[:, None] * score).mean(dim=0)
