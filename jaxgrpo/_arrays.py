"""Input conversion with clear errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def as_array(name: str, x) -> jax.Array:
    """``jnp.asarray(x)``, or a ``TypeError`` naming ``name`` if ``x`` is not array-like."""
    if isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, list, tuple)):
        return jnp.asarray(x)
    raise TypeError(f"{name} must be an array, got {type(x).__name__}")


def as_float_array(name: str, x) -> jax.Array:
    """Like ``as_array``; integer/bool input is promoted to the default float dtype."""
    x = as_array(name, x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    return x
