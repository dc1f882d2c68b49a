"""The clipped GRPO loss (SPEC section 3) and its diagnostics in JAX.

Masked positions may hold anything (inf, NaN): every input is replaced by 0 there
*before* any exponential, so they reach neither the loss nor a gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpospec import check_grpo_loss, check_kl_estimator, check_same_shape, scalar_or_none
from jaxgrpo._arrays import as_array, as_float_array


def selective_log_softmax(logits: jax.Array, index: jax.Array) -> jax.Array:
    """``log_softmax(logits)[..., index]``: gather minus logsumexp, in float32.

    Args:
      logits: (..., V).
      index: (...) integer token ids.
    Returns:
      (...) float32 log-probs (float64 if ``logits`` is float64).

    >>> import jax.numpy as jnp
    >>> round(float(selective_log_softmax(jnp.zeros((1, 4)), jnp.array([2]))[0]), 4)
    -1.3863
    """
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    picked = jnp.take_along_axis(logits, index[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def k3_kl(logp_new: jax.Array, logp_ref: jax.Array) -> jax.Array:
    """Per-token k3 estimator ``exp(ref - new) - (ref - new) - 1`` (>= 0, 0 iff equal).

    >>> import jax.numpy as jnp
    >>> float(k3_kl(jnp.array(0.0), jnp.array(0.0)))
    0.0
    """
    d = logp_ref - logp_new
    return jnp.exp(d) - d - 1


def kl_estimate(logp_new: jax.Array, logp_ref: jax.Array, kind: str = "k3") -> jax.Array:
    """Per-token estimate of KL(pi_new || pi_ref) from a token sampled from pi_new, with
    ``r = log pi_new - log pi_ref``: ``"k1"`` = r (verl's ``kl``; unbiased, can be < 0),
    ``"k2"`` = r^2 / 2 (``mse``), ``"k3"`` = exp(-r) - 1 + r (``low_var_kl``; unbiased,
    >= 0). What their *gradients* estimate differs: see ``docs/04-kl.md``.

    >>> import jax.numpy as jnp
    >>> new, ref = jnp.array([-1.0]), jnp.array([-1.5])
    >>> [round(float(kl_estimate(new, ref, k)[0]), 4) for k in ("k1", "k2", "k3")]
    [0.5, 0.125, 0.1065]
    """
    check_kl_estimator("kind", kind)
    r = logp_new - logp_ref
    if kind == "k1":
        return r
    if kind == "k2":
        return 0.5 * r**2
    return k3_kl(logp_new, logp_ref)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``x`` over positions where ``mask != 0`` (0 when there are none)."""
    valid = mask != 0
    return jnp.sum(jnp.where(valid, x, 0)) / jnp.maximum(jnp.sum(valid), 1)


def sequence_log_ratio(log_ratio: jax.Array, valid: jax.Array) -> jax.Array:
    """GSPO's per-sequence log-ratio ``mean_t(log_ratio)`` over valid tokens, broadcast to
    (N, T); masked positions must already hold 0. A row without valid tokens gets 0.

    >>> import jax.numpy as jnp
    >>> sequence_log_ratio(jnp.array([[0.5, 0.25, 0.0]]), jnp.array([[1, 1, 0]])).tolist()
    [[0.375, 0.375, 0.375]]
    """
    w = valid.astype(log_ratio.dtype)
    seq = jnp.sum(log_ratio, axis=1, keepdims=True) / jnp.maximum(
        jnp.sum(w, axis=1, keepdims=True), 1)
    return jnp.broadcast_to(seq, log_ratio.shape)


def _masked_log_ratio(logp_new, logp_old, valid, importance_level):
    """``new - old`` at valid tokens (0 elsewhere, before any exponential), per token or,
    for ``importance_level="sequence"``, its sequence mean."""
    dtype = logp_new.dtype
    new = jnp.where(valid, logp_new, 0)
    old = jnp.where(valid, jax.lax.stop_gradient(logp_old).astype(dtype), 0)
    log_ratio = new - old
    if importance_level == "sequence":
        log_ratio = sequence_log_ratio(log_ratio, valid)
    return log_ratio


def high_entropy_mask(entropy: jax.Array, valid: jax.Array, top_quantile: float) -> jax.Array:
    """TRL's ``top_entropy_quantile``: the valid tokens whose entropy is at least the
    ``1 - top_quantile`` quantile (linear interpolation) of the valid tokens' entropies.

    >>> import jax.numpy as jnp
    >>> high_entropy_mask(jnp.array([[0.1, 2.0, 1.0, 9.0]]), jnp.array([[1, 1, 1, 0]]),
    ...                   0.5).tolist()
    [[False, True, True, False]]
    """
    valid = jnp.asarray(valid) != 0
    values = jnp.where(valid, entropy, jnp.nan)
    threshold = jnp.nanquantile(values, 1 - top_quantile)
    return valid & (entropy >= threshold)


def _grpo_loss(logp_new, logp_old, logp_ref, adv, mask, entropy, logp_sampler, clip_eps, beta,
               agg, eps_high, use_dual_clip, dual_clip, importance_level, max_len, use_kl,
               kl_estimator, loss_mode, sapo_pos, sapo_neg, use_entropy_bonus, entropy_coef,
               top_quantile, use_tis, tis_cap):
    valid = mask != 0
    dtype = logp_new.dtype
    w = valid.astype(dtype)
    new = jnp.where(valid, logp_new, 0)
    a = jax.lax.stop_gradient(adv).astype(dtype)
    a = a[:, None] if a.ndim == 1 else jnp.where(valid, a, 0)

    ratio = jnp.exp(_masked_log_ratio(logp_new, logp_old, valid, importance_level))
    if loss_mode == "vanilla":  # PPO's clipped surrogate
        surrogate = jnp.minimum(ratio * a, jnp.clip(ratio, 1 - clip_eps, 1 + eps_high) * a)
        if use_dual_clip:
            surrogate = jnp.where(a < 0, jnp.maximum(surrogate, dual_clip * a), surrogate)
        policy = -surrogate
    elif loss_mode == "cispo":  # a clipped, constant importance weight on REINFORCE
        policy = -jax.lax.stop_gradient(jnp.minimum(ratio, 1 + eps_high)) * a * new
    elif loss_mode == "sapo":  # a soft gate instead of the hard clip
        tau = jnp.where(a > 0, sapo_pos, sapo_neg)
        policy = -jax.nn.sigmoid(tau * (ratio - 1)) * 4 / tau * a
    else:  # "gpg": the plain policy gradient, no ratio
        policy = -a * new
    if top_quantile is not None:  # only the high-entropy tokens carry the policy term
        ent = jax.lax.stop_gradient(jnp.where(valid, entropy, 0).astype(dtype))
        keep = high_entropy_mask(ent, valid, top_quantile).astype(dtype)
        policy = policy * keep
    if use_tis:  # truncated importance sampling: sampler != trainer
        gap = jax.lax.stop_gradient(jnp.where(valid, logp_old, 0).astype(dtype)
                                    - jnp.where(valid, logp_sampler, 0).astype(dtype))
        policy = policy * jnp.minimum(jnp.exp(gap), tis_cap)
    per_token = policy
    if use_entropy_bonus:
        bonus = jnp.where(valid, entropy, 0).astype(dtype)
        if top_quantile is not None:
            bonus = bonus * keep
        per_token = per_token - entropy_coef * bonus
    if use_kl:  # statically absent when beta == 0: 0 * inf would be NaN
        ref = jnp.where(valid, jax.lax.stop_gradient(logp_ref).astype(dtype), 0)
        ref = jnp.where(beta != 0, ref, jax.lax.stop_gradient(new))  # traced beta 0: KL = 0
        per_token = per_token + beta * kl_estimate(new, ref, kl_estimator)
    per_token = jnp.where(valid, per_token, 0)

    if agg == "token":
        return jnp.sum(per_token) / jnp.maximum(jnp.sum(w), 1)
    if agg == "seq":
        return jnp.mean(jnp.sum(per_token, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1))
    return jnp.sum(per_token) / (new.shape[0] * (new.shape[1] if max_len is None else max_len))


# jit applied by assignment, not as a decorator, so the mutation tester can mutate the body
_grpo_loss_jit = jax.jit(_grpo_loss, static_argnames=(
    "agg", "importance_level", "use_dual_clip", "max_len", "use_kl", "kl_estimator",
    "loss_mode", "use_entropy_bonus", "top_quantile", "use_tis"))


def grpo_loss(
    logp_new: jax.Array,
    logp_old: jax.Array,
    logp_ref: jax.Array,
    adv: jax.Array,
    mask: jax.Array,
    clip_eps: float = 0.2,
    beta: float = 0.0,
    agg: str = "token",
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    importance_level: str = "token",
    max_len: int | None = None,
    *,
    kl_estimator: str = "k3",
    loss_mode: str = "vanilla",
    entropy: jax.Array | None = None,
    entropy_coef: float = 0.0,
    top_entropy_quantile: float = 1.0,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    logp_sampler: jax.Array | None = None,
    tis_cap: float | None = None,
) -> jax.Array:
    """The clipped GRPO loss with a KL penalty, and its variants.

    ``ratio = exp(new - old)``;
    ``per_token = -(min(ratio A, clip(ratio, 1 - eps_low, 1 + eps_high) A) - beta k3)``.

    Aggregation ``agg``:
      ``"token"`` (DAPO): ``sum(per_token mask) / sum(mask)``;
      ``"seq"`` (GRPO): mean over rows of ``sum_t(per_token mask) / sum_t(mask)``;
      ``"constant"`` (Dr. GRPO): ``sum(per_token mask) / (N * max_len)``, ``max_len``
      defaulting to T, a normaliser that depends on no length.
    Variants: ``clip_eps_high`` (DAPO's clip-higher); ``dual_clip = c > 1`` bounds the
    surrogate from below by ``c A`` where ``A < 0`` (dual-clip PPO);
    ``importance_level="sequence"`` (GSPO) replaces each token's ratio by its sequence's
    length-normalised ratio ``exp(mean_t(new - old))``, clipped per sequence.
    ``kl_estimator``: the KL term's per-token estimate, ``"k1"``, ``"k2"`` or ``"k3"``
    (``kl_estimate``). ``loss_mode`` (verl's name) replaces the policy term
    ``-min(ratio A, clip(ratio) A)`` (``"vanilla"``) by
      ``"cispo"`` (MiniMax-M1): ``-sg(min(ratio, 1 + eps_high)) A new``, a clipped,
      stop-gradient importance weight on the REINFORCE term (no token's gradient is 0);
      ``"sapo"`` (Qwen's SAPO): ``-sigmoid(tau (ratio - 1)) 4 / tau A`` with
      ``tau = sapo_temperature_pos`` where A > 0, ``sapo_temperature_neg`` elsewhere (the
      gate's slope is 1 at ratio 1, as PPO's, and fades smoothly away from it);
      ``"gpg"``: ``-A new``, the plain policy gradient (no ratio, no clip).
    ``top_entropy_quantile = q < 1`` (TRL): the policy term acts only on the valid tokens
    whose ``entropy`` is at least the batch's ``1 - q`` quantile (``high_entropy_mask``);
    ``entropy_coef`` (verl's ``entropy_coeff``): a bonus ``- entropy_coef * entropy`` per
    token (on the same tokens), aggregated like the rest; ``entropy`` (N, T) comes from
    the training forward and carries its gradient. ``tis_cap = C`` with ``logp_sampler``
    (truncated importance sampling, as TRL's and verl's): the policy term of each token is
    weighted by ``min(exp(old - sampler), C)``, a constant, correcting for a sampler (an
    inference engine) whose log-probs differ from the trainer's ``logp_old``.

    ``logp_old``, ``logp_ref``, ``adv`` and ``logp_sampler`` are constants
    (``stop_gradient``): their gradients are exactly 0. With ``beta == 0`` the KL term is
    absent (not ``0 * k3``, which is NaN once ``ref - new`` overflows ``exp``); a ``beta``
    known when the call is made (a Python number) removes it statically, a traced ``beta``
    of 0 makes it exactly 0 (likewise ``entropy_coef``).
    ``agg``, ``importance_level``, ``max_len`` and whether ``dual_clip`` is set are
    static; the rest may be traced, so the function works under ``jax.jit``/``vmap``.
    Degenerate cases: a row with no valid token contributes 0 to the ``"seq"`` mean (it
    still counts in the number of rows, as in TRL); a batch with no valid token at all
    gives a loss of exactly 0 with zero gradient.

    Args:
      logp_new: (N, T) per-token log-probs under the policy being trained.
      logp_old: (N, T) under the sampling policy.
      logp_ref: (N, T) under the reference policy.
      adv: (N,) one advantage per sequence, or (N, T) one per token.
      mask: (N, T) nonzero where the token is a real response token.
      clip_eps: eps_low, in (0, 1).
      beta: KL weight, >= 0.
      agg: ``"token"``, ``"seq"`` or ``"constant"``.
      clip_eps_high: eps_high (> 0); ``None`` means ``clip_eps``.
      dual_clip: the dual-clip bound c (> 1), or ``None``.
      importance_level: ``"token"`` (PPO/GRPO) or ``"sequence"`` (GSPO).
      max_len: the constant length of ``agg="constant"``; ``None`` means T.
      kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"``.
      loss_mode: ``"vanilla"``, ``"cispo"``, ``"sapo"`` or ``"gpg"``.
      entropy: (N, T) per-token entropies (for ``entropy_coef``/``top_entropy_quantile``).
      entropy_coef: the entropy bonus's weight, >= 0.
      top_entropy_quantile: the share of highest-entropy tokens trained, in (0, 1].
      sapo_temperature_pos, sapo_temperature_neg: SAPO's gate temperatures, > 0.
      logp_sampler: (N, T) log-probs under the sampler (for ``tis_cap``).
      tis_cap: the truncation C >= 1 of the importance weights, or ``None``.
    Returns:
      a scalar of ``logp_new``'s dtype.

    Worked by hand (identical policies, ratio 1, A = +1 on two tokens, new = -1, -2):
    vanilla -min(1, 1) = -1; CISPO -1 * 1 * new, mean 1.5; SAPO -sigmoid(0) 4 / 1 = -2
    (a constant away from vanilla: its slope in the ratio is 1 there, as vanilla's); GPG
    -new, mean 1.5, CISPO's value at ratio 1.

    >>> import jax.numpy as jnp
    >>> lp = jnp.array([[-1.0, -2.0]])
    >>> [float(grpo_loss(lp, lp, lp, jnp.ones(1), jnp.ones((1, 2)), loss_mode=m))
    ...  for m in ("vanilla", "cispo", "sapo", "gpg")]
    [-1.0, 1.5, -2.0, 1.5]
    """
    logp_new = as_float_array("logp_new", logp_new)
    logp_old, logp_ref = as_array("logp_old", logp_old), as_array("logp_ref", logp_ref)
    adv, mask = as_array("adv", adv), as_array("mask", mask)
    entropy = None if entropy is None else as_float_array("entropy", entropy)
    logp_sampler = None if logp_sampler is None else as_array("logp_sampler", logp_sampler)
    check_grpo_loss(logp_new.shape, logp_old.shape, logp_ref.shape, adv.shape, mask.shape,
                    clip_eps, beta, agg, clip_eps_high, dual_clip, importance_level, max_len,
                    kl_estimator=kl_estimator, loss_mode=loss_mode,
                    entropy=None if entropy is None else entropy.shape,
                    entropy_coef=entropy_coef, top_entropy_quantile=top_entropy_quantile,
                    sapo_temperature_pos=sapo_temperature_pos,
                    sapo_temperature_neg=sapo_temperature_neg,
                    logp_sampler=None if logp_sampler is None else logp_sampler.shape,
                    tis_cap=tis_cap)
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    b, ec = scalar_or_none(beta), scalar_or_none(entropy_coef)
    q = float(top_entropy_quantile)
    zeros = jnp.zeros_like(logp_new)
    return _grpo_loss_jit(
        logp_new, logp_old, logp_ref, adv, mask, zeros if entropy is None else entropy,
        zeros if logp_sampler is None else logp_sampler, clip_eps, beta, agg, eps_high,
        dual_clip is not None, 0.0 if dual_clip is None else dual_clip, importance_level,
        None if max_len is None else int(max_len), use_kl=b is None or b != 0,
        kl_estimator=kl_estimator, loss_mode=loss_mode, sapo_pos=sapo_temperature_pos,
        sapo_neg=sapo_temperature_neg, use_entropy_bonus=ec is None or ec != 0,
        entropy_coef=entropy_coef, top_quantile=None if q >= 1.0 else q,
        use_tis=tis_cap is not None, tis_cap=1.0 if tis_cap is None else tis_cap)


def value_loss(values: jax.Array, returns: jax.Array, mask: jax.Array) -> jax.Array:
    """``0.5 * masked_mean((values - returns)^2)``; ``returns`` is a constant.

    Args:
      values: (N, T) value predictions.
      returns: (N, T) regression targets.
      mask: (N, T) nonzero at valid positions.

    >>> import jax.numpy as jnp
    >>> float(value_loss(jnp.array([[1.0, 5.0]]), jnp.array([[3.0, 0.0]]), jnp.array([[1, 0]])))
    2.0
    """
    check_same_shape(values=jnp.shape(values), returns=jnp.shape(returns), mask=jnp.shape(mask))
    err = jnp.where(mask != 0, values - jax.lax.stop_gradient(returns), 0)
    return 0.5 * masked_mean(err**2, mask)


def clip_metrics(
    logp_new: jax.Array,
    logp_old: jax.Array,
    adv: jax.Array,
    mask: jax.Array,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    importance_level: str = "token",
    dual_clip: float | None = None,
) -> dict[str, jax.Array]:
    """Where clipping binds, as shares of the valid tokens (TRL's and verl's metrics).

    With the ratio of ``grpo_loss`` (per token, or per sequence for GSPO) and ``A`` the
    token's advantage:

    * ``clip_ratio/low_mean``: ``A < 0`` and ``ratio < 1 - eps_low`` (the lower clip
      binds: the token's gradient is 0);
    * ``clip_ratio/high_mean``: ``A > 0`` and ``ratio > 1 + eps_high``;
    * ``clip_ratio/region_mean``: either (TRL's name; verl's ``pg_clipfrac``);
    * ``pg_clipfrac_lower`` (verl's name, only with ``dual_clip = c``): ``A < 0`` and
      ``ratio > c``, where the dual-clip bound binds.

    A ratio outside the band with the other sign of ``A`` is not clipped (the ``min``
    picks the unclipped term) and is not counted.

    >>> import jax.numpy as jnp
    >>> m = clip_metrics(jnp.log(jnp.array([[1.5, 0.5, 1.5]])), jnp.zeros((1, 3)),
    ...                  jnp.array([[1.0, -1.0, -1.0]]), jnp.ones((1, 3)))
    >>> [round(float(m[k]), 4) for k in ("clip_ratio/low_mean", "clip_ratio/high_mean",
    ...                                  "clip_ratio/region_mean")]
    [0.3333, 0.3333, 0.6667]
    """
    logp_new, logp_old = as_float_array("logp_new", logp_new), as_array("logp_old", logp_old)
    adv, mask = as_array("adv", adv), as_array("mask", mask)
    check_grpo_loss(logp_new.shape, logp_old.shape, logp_new.shape, adv.shape, mask.shape,
                    clip_eps, 0.0, "token", clip_eps_high, dual_clip, importance_level)
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    return _clip_metrics_jit(logp_new, logp_old, adv, mask, clip_eps, eps_high,
                             importance_level, dual_clip is not None,
                             0.0 if dual_clip is None else dual_clip)


def _clip_metrics(logp_new, logp_old, adv, mask, clip_eps, eps_high, importance_level,
                  use_dual_clip, dual_clip):
    valid = mask != 0
    dtype = jnp.promote_types(logp_new.dtype, jnp.float32)
    ratio = jnp.exp(_masked_log_ratio(logp_new.astype(dtype), logp_old, valid,
                                      importance_level))
    a = adv.astype(dtype)
    a = a[:, None] if a.ndim == 1 else a
    low = (ratio < 1 - clip_eps) & (a < 0)
    high = (ratio > 1 + eps_high) & (a > 0)
    out = {"clip_ratio/low_mean": masked_mean(low.astype(dtype), mask),
           "clip_ratio/high_mean": masked_mean(high.astype(dtype), mask),
           "clip_ratio/region_mean": masked_mean((low | high).astype(dtype), mask)}
    if use_dual_clip:
        out["pg_clipfrac_lower"] = masked_mean(((ratio > dual_clip) & (a < 0)).astype(dtype),
                                               mask)
    return out


_clip_metrics_jit = jax.jit(_clip_metrics, static_argnames=("importance_level", "use_dual_clip"))

