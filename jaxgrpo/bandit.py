"""Softmax-bandit policy gradients (SPEC section 1) in JAX."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from grpospec import check_bandit, check_positive_int, scalar_or_none
from jaxgrpo._arrays import as_float_array


def expected_reward(theta: jax.Array, rewards: jax.Array) -> jax.Array:
    """``J(theta) = sum_a softmax(theta)_a r_a``.

    Args:
      theta: logits, shape (K,).
      rewards: reward of each action, shape (K,).
    Returns:
      a scalar.

    >>> import jax.numpy as jnp
    >>> float(expected_reward(jnp.zeros(4), jnp.array([1.0, 0.0, 0.0, 1.0])))
    0.5
    """
    theta, rewards = as_float_array("theta", theta), as_float_array("rewards", rewards)
    check_bandit(theta.shape, rewards.shape)
    return jnp.sum(jax.nn.softmax(theta) * rewards)


def exact_policy_gradient(theta: jax.Array, rewards: jax.Array) -> jax.Array:
    """Closed form ``dJ/dtheta = pi * (r - E_pi[r])``; equals ``jax.grad(expected_reward)``.

    Args:
      theta: logits, shape (K,).
      rewards: reward of each action, shape (K,).
    Returns:
      the gradient, shape (K,).

    >>> import jax.numpy as jnp
    >>> exact_policy_gradient(jnp.zeros(2), jnp.array([1.0, 0.0])).tolist()
    [0.25, -0.25]
    """
    theta, rewards = as_float_array("theta", theta), as_float_array("rewards", rewards)
    check_bandit(theta.shape, rewards.shape)
    pi = jax.nn.softmax(theta)
    return pi * (rewards - jnp.sum(pi * rewards))


def _reinforce(theta, rewards, n, baseline, key):
    actions = jax.random.categorical(key, theta, shape=(n,))
    log_pi = lambda th, a: jax.nn.log_softmax(th)[a]  # noqa: E731
    score = jax.vmap(jax.grad(log_pi), in_axes=(None, 0))(theta, actions)  # (n, K)
    return jnp.mean((rewards[actions] - baseline)[:, None] * score, axis=0)


# jit by assignment (not a decorator) so that the mutation tester mutates the body
_reinforce_jit = jax.jit(_reinforce, static_argnames=("n",))


def _check_baseline(baseline) -> None:
    """A scalar, finite when concrete (a traced one, under ``jit``, is checked for its
    shape only)."""
    b = scalar_or_none(baseline, "baseline")  # None: traced, or not a scalar
    if baseline is None or jnp.ndim(baseline) != 0 or (b is not None and not math.isfinite(b)):
        raise ValueError(f"baseline must be a finite number, got {baseline!r}")


def reinforce_gradient(
    theta: jax.Array, rewards: jax.Array, n: int, baseline: float, rng: jax.Array
) -> jax.Array:
    """REINFORCE estimate ``mean_i (r(a_i) - b) * grad log pi(a_i)``, a_i ~ softmax(theta).

    The ``n`` actions come from one ``jax.random.categorical`` call on ``rng``; the score
    ``grad log pi(a)`` comes from ``jax.vmap(jax.grad(log_pi))`` over all of them at once.
    ``n`` is static (a new ``n`` compiles anew).

    Args:
      theta: logits, shape (K,).
      rewards: reward of each action, shape (K,).
      n: number of sampled actions, >= 1.
      baseline: a number b that does not depend on the sampled actions.
      rng: a JAX PRNG key.
    Returns:
      the estimate, shape (K,).
    """
    theta, rewards = as_float_array("theta", theta), as_float_array("rewards", rewards)
    check_bandit(theta.shape, rewards.shape)
    n = check_positive_int("n", n)
    _check_baseline(baseline)
    if not isinstance(rng, jax.Array) or not (
        jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) or rng.shape == (2,)
    ):
        raise TypeError(f"rng must be a JAX PRNG key, got {type(rng).__name__}")
    return _reinforce_jit(theta, rewards, n, jnp.asarray(baseline, theta.dtype), rng)


_reinforce_many = jax.jit(jax.vmap(_reinforce, in_axes=(None, None, None, None, 0)),
                          static_argnames=("n",))


def reinforce_gradients(theta: jax.Array, rewards: jax.Array, n: int, baseline: float,
                        keys: jax.Array) -> jax.Array:
    """Many independent REINFORCE estimates at once: ``reinforce_gradient`` vmapped over
    a batch of keys (R,), compiled once per ``n``. Returns (R, K)."""
    theta, rewards = as_float_array("theta", theta), as_float_array("rewards", rewards)
    check_bandit(theta.shape, rewards.shape)
    n = check_positive_int("n", n)
    _check_baseline(baseline)
    if not isinstance(keys, jax.Array) or keys.ndim != 1 or not jnp.issubdtype(
            keys.dtype, jax.dtypes.prng_key):
        raise TypeError("keys must be a 1-D array of JAX PRNG keys (jax.random.split(key, R))")
    return _reinforce_many(theta, rewards, n, jnp.asarray(baseline, theta.dtype), keys)
