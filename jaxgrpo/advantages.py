"""Group-relative advantages (SPEC section 2) in JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpospec import (
    check_gae,
    check_group_rewards,
    check_overlong,
    check_rloo_rewards,
    check_scale_rewards,
)
from jaxgrpo._arrays import as_array, as_float_array


def _group_advantages(rewards, scale, eps):
    centered = rewards - jnp.mean(rewards, axis=1, keepdims=True)
    if scale == "group":
        centered = centered / (jnp.std(rewards, axis=1, keepdims=True) + eps)  # population std
    elif scale == "batch":
        centered = centered / (jnp.std(rewards) + eps)  # one std over the whole batch
    all_equal = jnp.max(rewards, axis=1, keepdims=True) == jnp.min(rewards, axis=1, keepdims=True)
    return jnp.where(all_equal, 0.0, centered)


# jit by assignment (not a decorator) so that the mutation tester mutates the bodies
_group_advantages_jit = jax.jit(_group_advantages, static_argnames=("scale",))


def group_advantages(rewards: jax.Array, std_norm: bool = True, eps: float = 1e-6,
                     scale_rewards: str | None = None) -> jax.Array:
    """Per-group advantages: GRPO ``(r - mean) / (std + eps)`` or Dr. GRPO ``r - mean``.

    ``std`` is the population std (divide by G). A group whose rewards are all equal
    (G = 1 included) gets exactly zero advantages: it carries no learning signal.
    ``scale_rewards`` (TRL's option) overrides ``std_norm``: ``"group"`` (GRPO, the
    group's std), ``"batch"`` (the mean is still the group's, the std that of all B * G
    rewards) or ``"none"`` (Dr. GRPO). Static.

    Args:
      rewards: shape (B, G), B prompts with G sampled completions each.
      std_norm: divide by the group std (GRPO) or not (Dr. GRPO).
      eps: added to the std.
      scale_rewards: ``"group"``, ``"batch"``, ``"none"``, or ``None`` (from ``std_norm``).
    Returns:
      advantages, shape (B, G).

    >>> import jax.numpy as jnp
    >>> group_advantages(jnp.array([[1.0, 0.0, 0.0, 1.0]]), std_norm=False).tolist()
    [[0.5, -0.5, -0.5, 0.5]]
    >>> # batch std of [1, 0, 1, 1] is sqrt(3) / 4: the varying group gets +-0.5 / 0.433
    >>> a = group_advantages(jnp.array([[1.0, 0.0], [1.0, 1.0]]), scale_rewards="batch")
    >>> [[round(v, 4) for v in row] for row in a.tolist()]
    [[1.1547, -1.1547], [0.0, 0.0]]
    """
    rewards = as_float_array("rewards", rewards)
    check_group_rewards(rewards.shape, eps)
    scale = scale_rewards if scale_rewards is not None else ("group" if std_norm else "none")
    check_scale_rewards(scale)
    return _group_advantages_jit(rewards, scale, jnp.asarray(eps, rewards.dtype))


def _reinforce_pp(rewards, eps):
    centered = rewards - jnp.mean(rewards)
    return jnp.where(jnp.max(rewards) == jnp.min(rewards), 0.0,
                     centered / (jnp.std(rewards) + eps))


_reinforce_pp_jit = jax.jit(_reinforce_pp)


def reinforce_pp_advantages(rewards: jax.Array, eps: float = 1e-6) -> jax.Array:
    """REINFORCE++ (Hu et al.): no per-prompt baseline; the rewards of the whole batch are
    normalised together, ``A = (r - mean_batch) / (std_batch + eps)`` (population std), so
    a prompt the policy always solves still gets a positive advantage. A batch whose
    rewards are all equal gets exactly zeros.

    Args:
      rewards: (B, G) or any shape; the batch is all of its entries.
      eps: added to the std.
    Returns:
      advantages, the shape of ``rewards``.

    >>> import jax.numpy as jnp
    >>> a = reinforce_pp_advantages(jnp.array([[1.0, 1.0], [1.0, 0.0]]))  # (r - .75) / .433
    >>> [[round(v, 4) for v in row] for row in a.tolist()]
    [[0.5773, 0.5773], [0.5773, -1.732]]
    """
    rewards = as_float_array("rewards", rewards)
    check_group_rewards(rewards.reshape(1, -1).shape, eps)
    return _reinforce_pp_jit(rewards, jnp.asarray(eps, rewards.dtype))


def overlong_penalty(lengths: jax.Array, max_len: int, buffer: int,
                     penalty: float = 1.0) -> jax.Array:
    """DAPO's soft overlong punishment (verl's ``overlong_buffer``), added to the reward:
    0 up to ``max_len - buffer`` tokens, then falling linearly to ``-penalty`` at
    ``max_len``: ``penalty * min(0, (max_len - buffer - length) / buffer)``, and
    ``-penalty`` beyond ``max_len``.

    >>> import jax.numpy as jnp
    >>> overlong_penalty(jnp.array([4, 6, 7, 8]), max_len=8, buffer=4).tolist()
    [0.0, -0.5, -0.75, -1.0]
    """
    check_overlong(max_len, buffer, penalty)
    lengths = jnp.asarray(lengths, jnp.float32)
    return penalty * jnp.clip((max_len - buffer - lengths) / buffer, -1.0, 0.0)


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
                         gamma: float = 1.0, lam: float = 0.95, scale_rewards: str | None = None
                         ) -> tuple[jax.Array, jax.Array | None]:
    """The trainers' advantages for ``estimator``, and the value targets (or ``None``).

    ``rewards`` (N,) are laid out group by group (N = B * ``group_size``).
    ``"grpo"`` / ``"dr_grpo"``: ``group_advantages`` with / without the std (or as
    ``scale_rewards`` says, when set: ``"group"``, ``"batch"`` or ``"none"``); ``"rloo"``:
    ``rloo_advantages``; ``"reinforce_pp"``: ``reinforce_pp_advantages`` (over the whole
    batch); each gives one advantage per sequence, (N,).
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
        return group_advantages(grouped, std_norm=estimator == "grpo",
                                scale_rewards=scale_rewards).reshape(-1), None
    if estimator == "rloo":
        return rloo_advantages(grouped).reshape(-1), None
    if estimator == "reinforce_pp":
        return reinforce_pp_advantages(rewards), None
    if estimator != "gae":
        raise ValueError("estimator must be one of grpo, dr_grpo, rloo, reinforce_pp, gae; "
                         f"got {estimator!r}")
    if values is None:
        raise ValueError("estimator='gae' needs values (N, T), got None")
    terminal = jax.nn.one_hot(lengths - 1, mask.shape[1]) * rewards[:, None]
    adv, returns = gae_advantages(terminal, jax.lax.stop_gradient(values), mask, gamma, lam)
    mean = masked_mean(adv, mask)
    std = jnp.sqrt(masked_mean((adv - mean) ** 2, mask))
    return jnp.where(mask != 0, (adv - mean) / (std + 1e-8), 0.0), returns
