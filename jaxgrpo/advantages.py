"""Group-relative advantages (SPEC section 2) in JAX."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from grpospec import check_group_rewards
from jaxgrpo._arrays import as_float_array


@functools.partial(jax.jit, static_argnames=("std_norm",))
def _group_advantages(rewards, std_norm, eps):
    centered = rewards - jnp.mean(rewards, axis=1, keepdims=True)
    if std_norm:
        centered = centered / (jnp.std(rewards, axis=1, keepdims=True) + eps)  # population std
    all_equal = jnp.max(rewards, axis=1, keepdims=True) == jnp.min(rewards, axis=1, keepdims=True)
    return jnp.where(all_equal, 0.0, centered)


def group_advantages(rewards: jax.Array, std_norm: bool = True, eps: float = 1e-6) -> jax.Array:
    """Per-group advantages: GRPO ``(r - mean) / (std + eps)`` or Dr. GRPO ``r - mean``.

    ``std`` is the population std (divide by G). A group whose rewards are all equal
    (G = 1 included) gets exactly zero advantages: it carries no learning signal.
    ``std_norm`` is static.

    Args:
      rewards: shape (B, G), B prompts with G sampled completions each.
      std_norm: divide by the group std (GRPO) or not (Dr. GRPO).
      eps: added to the std.
    Returns:
      advantages, shape (B, G).

    >>> import jax.numpy as jnp
    >>> group_advantages(jnp.array([[1.0, 0.0, 0.0, 1.0]]), std_norm=False).tolist()
    [[0.5, -0.5, -0.5, 0.5]]
    """
    rewards = as_float_array("rewards", rewards)
    check_group_rewards(rewards.shape, eps)
    return _group_advantages(rewards, bool(std_norm), jnp.asarray(eps, rewards.dtype))
