"""Sampling a categorical distribution from one uniform number per draw (inverse CDF).

``jax.random.categorical`` adds V Gumbel numbers to the logits of each draw (V random
words and two logarithms each); on a CPU that is most of a small policy's sampling
step. The inverse CDF needs one uniform per draw: with ``c_k = sum_{j <= k} p_j``, the
token is the number of ``c_k`` below ``u * c_{V-1}``. It draws exactly the same
distribution (``P(token = k) = P(c_{k-1} <= u c < c_k) = p_k``), not the same tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def categorical_icdf(u: jax.Array, logp: jax.Array) -> jax.Array:
    """Tokens drawn from ``softmax(logp)`` by the inverse CDF of uniforms ``u``.

    ``token = #{k < V - 1 : cumsum(p)_k <= u * sum(p)}`` with ``p = exp(logp - max)``
    (unnormalised is fine: ``u`` is scaled by the total). A token of probability 0
    (``logp = -inf``) is never drawn: the CDF does not rise at it, and the count stops
    before the last index.

    Args:
      u: (...) uniforms in [0, 1).
      logp: (..., V) log-probabilities or logits (float).
    Returns:
      (...) int32 token ids.

    >>> import jax.numpy as jnp
    >>> logp = jnp.log(jnp.array([0.25, 0.0, 0.75]))
    >>> categorical_icdf(jnp.array([0.0, 0.2, 0.25, 0.99]), jnp.broadcast_to(logp, (4, 3)))
    Array([0, 0, 2, 2], dtype=int32)
    """
    logp = logp.astype(jnp.promote_types(logp.dtype, jnp.float32))
    p = jnp.exp(logp - jnp.max(logp, axis=-1, keepdims=True))
    return icdf_from_cdf(u, jnp.cumsum(p, axis=-1))


def icdf_from_cdf(u: jax.Array, cdf: jax.Array) -> jax.Array:
    """The inverse-CDF draw from a (possibly unnormalised) cumulative sum ``cdf`` (..., V)
    of probabilities: ``#{k < V - 1 : cdf_k <= u * cdf_{V-1}}``. A policy with few
    distinct contexts computes its CDF table once and gathers rows of it.

    >>> import jax.numpy as jnp
    >>> icdf_from_cdf(jnp.array([0.1, 0.5]), jnp.array([[1.0, 1.0, 4.0], [1.0, 1.0, 4.0]]))
    Array([0, 2], dtype=int32)
    """
    threshold = u.astype(cdf.dtype)[..., None] * cdf[..., -1:]
    # the last index needs no test: every draw not counted below it lands on it
    return jnp.sum(cdf[..., :-1] <= threshold, axis=-1, dtype=jnp.int32)
