"""Group-relative advantages (SPEC section 2) in JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpospec import check_gae, check_group_rewards, check_rloo_rewards
from jaxgrpo._arrays import as_array, as_float_array


def _group_advantages(rewards, std_norm, eps):
    centered = rewards - jnp.mean(rewards, axis=1, keepdims=True)
    if std_norm:
        centered = centered / (jnp.std(rewards, axis=1, keepdims=True) + eps)  # population std
    all_equal = jnp.max(rewards, axis=1, keepdims=True) == jnp.min(rewards, axis=1, keepdims=True)
    return jnp.where(all_equal, 0.0, centered)


# jit by assignment (not a decorator) so that the mutation tester mutates the bodies
_group_advantages_jit = jax.jit(_group_advantages, static_argnames=("std_norm",))


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
    return _group_advantages_jit(rewards, bool(std_norm), jnp.asarray(eps, rewards.dtype))


def _rloo(rewards):
    g = rewards.shape[1]
    leave_one_out = (jnp.sum(rewards, axis=1, keepdims=True) - rewards) / (g - 1)
    all_equal = jnp.max(rewards, axis=1, keepdims=True) == jnp.min(rewards, axis=1, keepdims=True)
    return jnp.where(all_equal, 0.0, rewards - leave_one_out)


_rloo_jit = jax.jit(_rloo)


def rloo_advantages(rewards: jax.Array) -> jax.Array:
    """RLOO: ``A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean(r))``.

    Needs G >= 2. A group whose rewards are all equal gets exactly zero advantages.

    Args:
      rewards: shape (B, G).
    Returns:
      advantages, shape (B, G).

    >>> import jax.numpy as jnp
    >>> adv = rloo_advantages(jnp.array([[1.0, 0.0, 0.0, 1.0]]))  # G / (G - 1) * (r - 0.5)
    >>> [round(a, 4) for a in adv[0].tolist()]
    [0.6667, -0.6667, -0.6667, 0.6667]
    """
    rewards = as_float_array("rewards", rewards)
    check_rloo_rewards(rewards.shape)
    return _rloo_jit(rewards)


def _gae(rewards, values, mask, gamma, lam):
    valid = mask != 0
    w = valid.astype(values.dtype)
    r = jnp.where(valid, rewards, 0).astype(values.dtype)
    v = jnp.where(valid, jax.lax.stop_gradient(values), 0)

    def _gae_step(carry, x):
        next_adv, next_value, next_valid = carry
        r_t, v_t, w_t = x
        delta = r_t + gamma * next_value * next_valid - v_t
        adv_t = (delta + gamma * lam * next_valid * next_adv) * w_t
        return (adv_t, v_t, w_t), adv_t

    zeros = jnp.zeros_like(v[:, 0])
    _, adv = jax.lax.scan(_gae_step, (zeros, zeros, zeros), (r.T, v.T, w.T), reverse=True)
    adv = adv.T
    return adv, jnp.where(valid, adv + v, 0)


_gae_jit = jax.jit(_gae)


def gae_advantages(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float = 1.0,
                   lam: float = 0.95) -> tuple[jax.Array, jax.Array]:
    """Per-token GAE(gamma, lambda) and returns, as a reverse ``lax.scan`` over time.

    ``delta_t = r_t + gamma V_{t+1} m_{t+1} - V_t``;
    ``A_t = delta_t + gamma lam m_{t+1} A_{t+1}``; returns ``A + V``. The valid tokens of
    a row are a prefix (left-aligned); the value after the last valid token is 0 (the
    episode ends). Masked positions may hold anything and get 0.

    Args:
      rewards: (N, T) per-token rewards.
      values: (N, T) value predictions V_t (constants).
      mask: (N, T) nonzero at valid tokens.
      gamma: discount in [0, 1].
      lam: GAE lambda in [0, 1].
    Returns:
      ``(advantages, returns)``, both (N, T), 0 at masked positions.

    >>> import jax.numpy as jnp
    >>> adv, ret = gae_advantages(jnp.array([[0.0, 1.0]]), jnp.zeros((1, 2)), jnp.ones((1, 2)),
    ...                           gamma=1.0, lam=1.0)
    >>> adv.tolist(), ret.tolist()
    ([[1.0, 1.0]], [[1.0, 1.0]])
    """
    values = as_float_array("values", values)
    rewards, mask = as_float_array("rewards", rewards), as_array("mask", mask)
    check_gae(rewards.shape, values.shape, mask.shape, gamma, lam)
    return _gae_jit(rewards, values, mask, jnp.asarray(gamma, values.dtype),
                jnp.asarray(lam, values.dtype))


def estimator_advantages(estimator: str, rewards: jax.Array, group_size: int,
                         mask: jax.Array, lengths: jax.Array, values: jax.Array | None = None,
                         gamma: float = 1.0, lam: float = 0.95
                         ) -> tuple[jax.Array, jax.Array | None]:
    """The trainers' advantages for ``estimator``, and the value targets (or ``None``).

    ``rewards`` (N,) are laid out group by group (N = B * ``group_size``).
    ``"grpo"`` / ``"dr_grpo"``: ``group_advantages`` with / without the std;
    ``"rloo"``: ``rloo_advantages``; each gives one advantage per sequence, (N,).
    ``"gae"`` (PPO): the reward is paid at each sequence's last valid token
    (``lengths - 1``), ``gae_advantages`` with the constant ``values`` (N, T) gives one
    advantage per token, whitened over the valid tokens of the batch
    (``(A - mean) / (std + 1e-8)``, 0 at masked positions); returns ``(A, returns)``.
    ``estimator`` is static.

    >>> import jax.numpy as jnp
    >>> adv, _ = estimator_advantages("dr_grpo", jnp.array([1.0, 0.0, 0.0, 0.0]), 2,
    ...                               jnp.ones((4, 1)), jnp.ones(4, jnp.int32))
    >>> adv.tolist()
    [0.5, -0.5, 0.0, 0.0]
    """
    from jaxgrpo.loss import masked_mean

    grouped = rewards.reshape(-1, group_size)
    if estimator in ("grpo", "dr_grpo"):
        return group_advantages(grouped, std_norm=estimator == "grpo").reshape(-1), None
    if estimator == "rloo":
        return rloo_advantages(grouped).reshape(-1), None
    if estimator != "gae":
        raise ValueError(f"estimator must be one of grpo, dr_grpo, rloo, gae; got {estimator!r}")
    if values is None:
        raise ValueError("estimator='gae' needs values (N, T), got None")
    terminal = jax.nn.one_hot(lengths - 1, mask.shape[1]) * rewards[:, None]
    adv, returns = gae_advantages(terminal, jax.lax.stop_gradient(values), mask, gamma, lam)
    mean = masked_mean(adv, mask)
    std = jnp.sqrt(masked_mean((adv - mean) ** 2, mask))
    return jnp.where(mask != 0, (adv - mean) / (std + 1e-8), 0.0), returns
