"""Argument checks with one wording for both frameworks.

Every function takes shapes as tuples of ints and scalars as Python numbers (or ``None``
when the value is not known yet, e.g. a JAX tracer under ``jit``), and raises
``ValueError`` / ``TypeError`` naming the argument and what was expected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

AGG_MODES = ("token", "seq", "constant")
IMPORTANCE_LEVELS = ("token", "sequence")
KL_ESTIMATORS = ("k1", "k2", "k3")  # verl: "kl", "mse", "low_var_kl"
LOSS_MODES = ("vanilla", "cispo", "sapo", "gpg")  # verl's policy_loss.loss_mode names


def scalar_or_none(x: Any, name: str = "value") -> float | None:
    """``float(x)`` when ``x`` is a concrete scalar, ``None`` when it is not known yet.

    JAX tracers raise on conversion; we then skip value checks (shapes are still checked).
    A bool is refused with a ``TypeError`` naming ``name`` (the option it was given for).
    """
    if isinstance(x, bool):
        raise TypeError(f"{name} must be a number, got bool {x!r}")
    if isinstance(x, (int, float)):
        return float(x)
    try:
        return float(x)
    except Exception:  # a tracer under jit, or an array with more than one element
        return None


def _shape_str(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def check_positive_int(name: str, value: Any) -> int:
    """``value`` must be an ``int`` >= 1 (numpy ints accepted, bools and floats not)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int >= 1, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value}")
    return value


def check_kl_estimator(name: str, value: Any) -> None:
    """``value`` must be one of ``KL_ESTIMATORS`` (a str); the message names ``name``."""
    if not isinstance(value, str) or value not in KL_ESTIMATORS:
        raise ValueError(f"{name} must be one of {KL_ESTIMATORS}, got {value!r}")


def check_bandit(theta_shape: Sequence[int], rewards_shape: Sequence[int]) -> None:
    """theta and rewards are both 1-D of the same length K >= 1."""
    if len(theta_shape) != 1:
        raise ValueError(f"theta must be 1-D (K,), got shape {_shape_str(theta_shape)}")
    if tuple(rewards_shape) != tuple(theta_shape):
        raise ValueError(
            f"rewards must have the shape of theta {_shape_str(theta_shape)}, "
            f"got {_shape_str(rewards_shape)}"
        )
    if theta_shape[0] < 1:
        raise ValueError("theta must hold at least one action, got K = 0")


def check_group_rewards(rewards_shape: Sequence[int], eps: Any) -> None:
    """rewards is 2-D (B, G) with G >= 1; eps >= 0."""
    if len(rewards_shape) != 2:
        raise ValueError(
            f"rewards must be 2-D (B prompts, G samples), got shape {_shape_str(rewards_shape)}"
        )
    if rewards_shape[1] < 1:
        raise ValueError(
            f"rewards must have at least one sample per group, got G = {rewards_shape[1]}")
    e = scalar_or_none(eps, "eps")
    if e is not None and not (e >= 0 and math.isfinite(e)):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")


def check_grpo_loss(
    logp_new: Sequence[int],
    logp_old: Sequence[int],
    logp_ref: Sequence[int],
    adv: Sequence[int],
    mask: Sequence[int],
    clip_eps: Any,
    beta: Any,
    agg: Any,
    clip_eps_high: Any,
    dual_clip: Any = None,
    importance_level: Any = "token",
    max_len: Any = None,
    *,
    kl_estimator: Any = "k3",
    loss_mode: Any = "vanilla",
    entropy: Sequence[int] | None = None,
    entropy_coef: Any = 0.0,
    top_entropy_quantile: Any = 1.0,
    sapo_temperature_pos: Any = 1.0,
    sapo_temperature_neg: Any = 1.05,
    logp_sampler: Sequence[int] | None = None,
    tis_cap: Any = None,
) -> None:
    """Shapes: logp_* and mask (N, T), adv (N,) or (N, T), entropy and logp_sampler (N, T)
    when given. clip_eps in (0, 1), clip_eps_high > 0, beta >= 0, agg one of
    ``AGG_MODES``, dual_clip > 1 (only with loss_mode "vanilla"), importance_level one of
    ``IMPORTANCE_LEVELS``, max_len an int >= 1, kl_estimator one of ``KL_ESTIMATORS``,
    loss_mode one of ``LOSS_MODES``, entropy_coef >= 0, top_entropy_quantile in (0, 1]
    (either needs ``entropy``), SAPO temperatures > 0, tis_cap >= 1 (needs
    ``logp_sampler``)."""
    if len(logp_new) != 2:
        raise ValueError(f"logp_new must be 2-D (N, T), got shape {_shape_str(logp_new)}")
    for name, shape in (("logp_old", logp_old), ("logp_ref", logp_ref), ("mask", mask)):
        if tuple(shape) != tuple(logp_new):
            raise ValueError(
                f"{name} must have the shape of logp_new {_shape_str(logp_new)}, "
                f"got {_shape_str(shape)}"
            )
    if tuple(adv) not in ((logp_new[0],), tuple(logp_new)):
        raise ValueError(
            f"adv must be 1-D with one advantage per sequence, shape ({logp_new[0]},), "
            f"or one per token, shape {_shape_str(logp_new)}; got {_shape_str(adv)}"
        )
    if not isinstance(agg, str) or agg not in AGG_MODES:
        raise ValueError(f"agg must be one of {AGG_MODES}, got {agg!r}")
    c = scalar_or_none(clip_eps, "clip_eps")
    if clip_eps is None or (c is not None and not (0.0 < c < 1.0)):
        raise ValueError(f"clip_eps must lie in (0, 1), got {clip_eps!r}")
    if clip_eps_high is not None:
        h = scalar_or_none(clip_eps_high, "clip_eps_high")
        if h is not None and not (h > 0.0 and math.isfinite(h)):
            raise ValueError(
                f"clip_eps_high must be a finite number > 0 (or None), got {clip_eps_high!r}")
    b = scalar_or_none(beta, "beta")
    if beta is None or (b is not None and not (b >= 0.0 and math.isfinite(b))):
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    if dual_clip is not None:
        d = scalar_or_none(dual_clip, "dual_clip")
        if d is not None and not (d > 1.0 and math.isfinite(d)):
            raise ValueError(f"dual_clip must be a finite number > 1 (or None), got {dual_clip!r}")
    if not isinstance(importance_level, str) or importance_level not in IMPORTANCE_LEVELS:
        raise ValueError(
            f"importance_level must be one of {IMPORTANCE_LEVELS}, got {importance_level!r}")
    if max_len is not None:
        check_positive_int("max_len", max_len)
    check_kl_estimator("kl_estimator", kl_estimator)
    if not isinstance(loss_mode, str) or loss_mode not in LOSS_MODES:
        raise ValueError(f"loss_mode must be one of {LOSS_MODES}, got {loss_mode!r}")
    if dual_clip is not None and loss_mode != "vanilla":
        raise ValueError(f"dual_clip bounds the clipped objective: it needs loss_mode "
                         f"'vanilla', got loss_mode {loss_mode!r}")
    ec = scalar_or_none(entropy_coef, "entropy_coef")
    if entropy_coef is None or (ec is not None and not (ec >= 0.0 and math.isfinite(ec))):
        raise ValueError(f"entropy_coef must be a finite number >= 0, got {entropy_coef!r}")
    q = scalar_or_none(top_entropy_quantile, "top_entropy_quantile")
    if q is None or not (0.0 < q <= 1.0):
        raise ValueError(f"top_entropy_quantile must lie in (0, 1], got {top_entropy_quantile!r}")
    if (ec is None or ec != 0 or q < 1.0) and entropy is None:
        raise ValueError("entropy (N, T), the per-token entropy of the training forward, is "
                         "needed for entropy_coef > 0 or top_entropy_quantile < 1")
    if entropy is not None and tuple(entropy) != tuple(logp_new):
        raise ValueError(f"entropy must have the shape of logp_new {_shape_str(logp_new)}, "
                         f"got {_shape_str(entropy)}")
    for name, value in (("sapo_temperature_pos", sapo_temperature_pos),
                        ("sapo_temperature_neg", sapo_temperature_neg)):
        v = scalar_or_none(value, name)
        if v is not None and not (v > 0.0 and math.isfinite(v)):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if tis_cap is not None:
        c = scalar_or_none(tis_cap, "tis_cap")
        if c is not None and not (c >= 1.0 and math.isfinite(c)):
            raise ValueError(f"tis_cap must be a finite number >= 1 (or None), got {tis_cap!r}")
        if logp_sampler is None:
            raise ValueError("tis_cap needs logp_sampler (N, T), the sampler's log-probs")
    if logp_sampler is not None and tuple(logp_sampler) != tuple(logp_new):
        raise ValueError(f"logp_sampler must have the shape of logp_new "
                         f"{_shape_str(logp_new)}, got {_shape_str(logp_sampler)}")


SCALE_REWARDS = ("group", "batch", "none")  # TRL's scale_rewards


def check_scale_rewards(scale_rewards: Any) -> None:
    if not isinstance(scale_rewards, str) or scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")


def check_overlong(max_len: Any, buffer: Any, penalty: Any) -> None:
    """DAPO's overlong penalty: max_len >= 1, 1 <= buffer <= max_len, penalty >= 0."""
    check_positive_int("max_len", max_len)
    check_positive_int("overlong_buffer", buffer)
    if buffer > max_len:
        raise ValueError(f"overlong_buffer must be <= the maximum length ({max_len}), got {buffer}")
    p = scalar_or_none(penalty, "overlong_penalty")
    if p is not None and not (p >= 0 and math.isfinite(p)):
        raise ValueError(f"overlong_penalty must be a finite number >= 0, got {penalty!r}")


def check_rloo_rewards(rewards_shape: Sequence[int]) -> None:
    """RLOO needs (B, G) rewards with G >= 2 (the baseline is the mean of the others)."""
    check_group_rewards(rewards_shape, 0.0)
    if rewards_shape[1] < 2:
        raise ValueError(
            f"rewards must have G >= 2 samples per group for RLOO, got G = {rewards_shape[1]}")


def check_gae(rewards: Sequence[int], values: Sequence[int], mask: Sequence[int], gamma: Any,
              lam: Any) -> None:
    """rewards, values, mask all (N, T); gamma and lam in [0, 1]."""
    if len(rewards) != 2:
        raise ValueError(f"rewards must be 2-D (N, T), got shape {_shape_str(rewards)}")
    for name, shape in (("values", values), ("mask", mask)):
        if tuple(shape) != tuple(rewards):
            raise ValueError(f"{name} must have the shape of rewards {_shape_str(rewards)}, "
                             f"got {_shape_str(shape)}")
    for name, value in (("gamma", gamma), ("lam", lam)):
        v = scalar_or_none(value, name)
        if v is not None and not (0.0 <= v <= 1.0):
            raise ValueError(f"{name} must lie in [0, 1], got {value!r}")


def check_same_shape(**arrays: Sequence[int]) -> None:
    """All named shapes equal the first one."""
    (first, shape0), *rest = arrays.items()
    for name, shape in rest:
        if tuple(shape) != tuple(shape0):
            raise ValueError(f"{name} must have the shape of {first} {_shape_str(shape0)}, "
                             f"got {_shape_str(shape)}")
