"""The clipped GRPO loss (SPEC section 3) and its diagnostics, plain PyTorch.

Masked positions may hold anything (inf, NaN): every input is replaced by 0 there
*before* any exponential, so they reach neither the loss nor a gradient.
"""

from __future__ import annotations

import torch

from grpospec import check_grpo_loss, check_kl_estimator, check_same_shape


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[..., index]``: gather minus logsumexp, in float32.

    Args:
      logits: (..., V).
      index: (...) integer token ids.
    Returns:
      (...) float32 log-probs.
    """
    logits = logits.float()
    picked = logits.gather(-1, index[..., None]).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def k3_kl(logp_new: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator ``exp(ref - new) - (ref - new) - 1`` (>= 0, 0 iff equal)."""
    d = logp_ref - logp_new
    return torch.exp(d) - d - 1


def kl_estimate(logp_new: torch.Tensor, logp_ref: torch.Tensor, kind: str = "k3"
                ) -> torch.Tensor:
    """Per-token estimate of KL(pi_new || pi_ref), ``r = new - ref``: ``"k1"`` = r,
    ``"k2"`` = r^2 / 2, ``"k3"`` = exp(-r) - 1 + r (verl: kl, mse, low_var_kl)."""
    check_kl_estimator("kind", kind)
    r = logp_new - logp_ref
    if kind == "k1":
        return r
    if kind == "k2":
        return 0.5 * r**2
    return k3_kl(logp_new, logp_ref)


def high_entropy_mask(entropy: torch.Tensor, valid: torch.Tensor, top_quantile: float
                      ) -> torch.Tensor:
    """TRL's ``top_entropy_quantile``: valid tokens whose entropy is at least the
    ``1 - top_quantile`` quantile (linear interpolation) of the valid tokens' entropies."""
    valid = valid != 0
    if not valid.any():
        return valid
    threshold = torch.quantile(entropy[valid], 1 - top_quantile)
    return valid & (entropy >= threshold)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask != 0`` (0 when there are none)."""
    valid = mask != 0
    x = torch.where(valid, x, torch.zeros_like(x))
    return x.sum() / valid.sum().clamp(min=1)


def sequence_log_ratio(log_ratio: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """GSPO's per-sequence log-ratio ``mean_t(log_ratio)`` over valid tokens, broadcast to
    (N, T); masked positions must already hold 0. A row without valid tokens gets 0."""
    w = valid.to(log_ratio.dtype)
    seq = log_ratio.sum(dim=1, keepdim=True) / w.sum(dim=1, keepdim=True).clamp(min=1)
    return seq.expand_as(log_ratio)


def _masked_log_ratio(logp_new, logp_old, valid, importance_level):
    """``new - old`` at valid tokens (0 elsewhere, before any exponential), per token or,
    for ``importance_level="sequence"``, its sequence mean."""
    zero = torch.zeros((), dtype=logp_new.dtype, device=logp_new.device)
    new = torch.where(valid, logp_new, zero)
    old = torch.where(valid, logp_old.detach().to(logp_new.dtype), zero)
    log_ratio = new - old
    if importance_level == "sequence":
        log_ratio = sequence_log_ratio(log_ratio, valid)
    return log_ratio


def _check(logp_new, logp_old, logp_ref, adv, mask, *options, **keywords):
    for name, x in (("logp_new", logp_new), ("logp_old", logp_old), ("logp_ref", logp_ref),
                    ("adv", adv), ("mask", mask)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not logp_new.dtype.is_floating_point:
        raise TypeError(f"logp_new must be a floating-point tensor, got dtype {logp_new.dtype}")
    for name in ("entropy", "logp_sampler"):
        x = keywords.get(name)
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x is not None:
            keywords[name] = tuple(x.shape)
    check_grpo_loss(tuple(logp_new.shape), tuple(logp_old.shape), tuple(logp_ref.shape),
                    tuple(adv.shape), tuple(mask.shape), *options, **keywords)


def grpo_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    logp_ref: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
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
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    top_entropy_quantile: float = 1.0,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    logp_sampler: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> torch.Tensor:
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
    ``kl_estimator`` (``"k1"``, ``"k2"``, ``"k3"``) picks the KL term's estimate.
    ``loss_mode``: ``"vanilla"`` (the clipped surrogate), ``"cispo"``
    (``-sg(min(ratio, 1 + eps_high)) A new``), ``"sapo"``
    (``-sigmoid(tau (ratio - 1)) 4 / tau A``, ``tau`` by the sign of A) or ``"gpg"``
    (``-A new``). ``top_entropy_quantile = q < 1``: the policy term only on the valid
    tokens with entropy >= the batch's ``1 - q`` quantile; ``entropy_coef``: a bonus
    ``- entropy_coef * entropy`` per token (on the same tokens), aggregated like the rest.
    ``tis_cap = C``: each token's policy term weighted by ``min(exp(old - sampler), C)``
    (truncated importance sampling against ``logp_sampler``). Same meaning, word for
    word, as ``jaxgrpo.grpo_loss``.

    ``logp_old``, ``logp_ref``, ``adv`` and ``logp_sampler`` are constants (detached):
    their gradients are exactly 0. With ``beta == 0`` the KL term is absent, not
    ``0 * k3`` (which is NaN once ``ref - new`` overflows ``exp``).
    Degenerate cases: a row with no valid token contributes 0 to the ``"seq"`` mean (it
    still counts in the number of rows, as in TRL); a batch with no valid token at all
    gives a loss of exactly 0 with zero gradient.

    Args:
      logp_new: (N, T) per-token log-probs under the policy being trained.
      logp_old: (N, T) under the sampling policy; treated as a constant.
      logp_ref: (N, T) under the reference policy; treated as a constant.
      adv: (N,) one advantage per sequence, or (N, T) one per token; a constant.
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
      a scalar tensor of ``logp_new``'s dtype.
    """
    _check(logp_new, logp_old, logp_ref, adv, mask, clip_eps, beta, agg, clip_eps_high,
           dual_clip, importance_level, max_len, kl_estimator=kl_estimator,
           loss_mode=loss_mode, entropy=entropy, entropy_coef=entropy_coef,
           top_entropy_quantile=top_entropy_quantile,
           sapo_temperature_pos=sapo_temperature_pos,
           sapo_temperature_neg=sapo_temperature_neg, logp_sampler=logp_sampler,
           tis_cap=tis_cap)
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    valid = mask != 0
    w = valid.to(logp_new.dtype)
    zero = torch.zeros((), dtype=logp_new.dtype, device=logp_new.device)
    new = torch.where(valid, logp_new, zero)
    a = adv.detach().to(logp_new.dtype)
    a = a[:, None] if a.dim() == 1 else torch.where(valid, a, zero)

    ratio = torch.exp(_masked_log_ratio(logp_new, logp_old, valid, importance_level))
    if loss_mode == "vanilla":  # PPO's clipped surrogate
        surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + eps_high) * a)
        if dual_clip is not None:
            surrogate = torch.where(a < 0, torch.maximum(surrogate, dual_clip * a), surrogate)
        policy = -surrogate
    elif loss_mode == "cispo":  # a clipped, constant importance weight on REINFORCE
        policy = -torch.clamp(ratio, max=1 + eps_high).detach() * a * new
    elif loss_mode == "sapo":  # a soft gate instead of the hard clip
        tau = torch.where(a > 0, torch.as_tensor(sapo_temperature_pos, dtype=a.dtype),
                          torch.as_tensor(sapo_temperature_neg, dtype=a.dtype))
        policy = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * a
    else:  # "gpg": the plain policy gradient, no ratio
        policy = -a * new
    keep = None
    if top_entropy_quantile < 1.0:  # only the high-entropy tokens carry the policy term
        ent = torch.where(valid, entropy.detach().to(logp_new.dtype), zero)
        keep = high_entropy_mask(ent, valid, top_entropy_quantile).to(logp_new.dtype)
        policy = policy * keep
    if tis_cap is not None:  # truncated importance sampling: sampler != trainer
        gap = (torch.where(valid, logp_old.detach().to(logp_new.dtype), zero)
               - torch.where(valid, logp_sampler.detach().to(logp_new.dtype), zero))
        policy = policy * torch.clamp(torch.exp(gap), max=tis_cap)
    per_token = policy
    if entropy_coef != 0:
        bonus = torch.where(valid, entropy.to(logp_new.dtype), zero)
        if keep is not None:
            bonus = bonus * keep
        per_token = per_token - entropy_coef * bonus
    if beta != 0:  # absent, not 0 * KL (NaN once ref - new overflows exp)
        ref = torch.where(valid, logp_ref.detach().to(logp_new.dtype), zero)
        per_token = per_token + beta * kl_estimate(new, ref, kl_estimator)
    per_token = torch.where(valid, per_token, zero)

    if agg == "token":
        return per_token.sum() / w.sum().clamp(min=1)
    if agg == "seq":
        return (per_token.sum(dim=1) / w.sum(dim=1).clamp(min=1)).mean()
    return per_token.sum() / (logp_new.shape[0] * (logp_new.shape[1] if max_len is None
                                                   else max_len))


def value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``0.5 * masked_mean((values - returns)^2)``; ``returns`` is a constant.

    Args:
      values: (N, T) value predictions.
      returns: (N, T) regression targets.
      mask: (N, T) nonzero at valid positions.
    """
    check_same_shape(values=tuple(values.shape), returns=tuple(returns.shape),
                     mask=tuple(mask.shape))
    valid = mask != 0
    err = torch.where(valid, values - returns.detach(), torch.zeros((), dtype=values.dtype))
    return 0.5 * masked_mean(err**2, mask)


def clip_metrics(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    importance_level: str = "token",
    dual_clip: float | None = None,
) -> dict[str, torch.Tensor]:
    """Where clipping binds, as shares of the valid tokens (TRL's and verl's metrics).

    ``clip_ratio/low_mean``: ``A < 0`` and ``ratio < 1 - eps_low``;
    ``clip_ratio/high_mean``: ``A > 0`` and ``ratio > 1 + eps_high``;
    ``clip_ratio/region_mean``: either (verl's ``pg_clipfrac``); with ``dual_clip = c``,
    ``pg_clipfrac_lower``: ``A < 0`` and ``ratio > c``. The ratio is ``grpo_loss``'s (per
    token, or per sequence for GSPO). Same meaning as ``jaxgrpo.clip_metrics``.
    """
    _check(logp_new, logp_old, logp_new, adv, mask, clip_eps, 0.0, "token", clip_eps_high,
           dual_clip, importance_level)
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    valid = mask != 0
    with torch.no_grad():
        logp_new = logp_new.detach()
        if not logp_new.dtype.is_floating_point or logp_new.dtype in (torch.float16,
                                                                      torch.bfloat16):
            logp_new = logp_new.float()
        ratio = torch.exp(_masked_log_ratio(logp_new, logp_old, valid, importance_level))
        a = adv.detach().to(logp_new.dtype)
        a = a[:, None] if a.dim() == 1 else a
        low = (ratio < 1 - clip_eps) & (a < 0)
        high = (ratio > 1 + eps_high) & (a > 0)
        out = {"clip_ratio/low_mean": masked_mean(low.to(logp_new.dtype), mask),
               "clip_ratio/high_mean": masked_mean(high.to(logp_new.dtype), mask),
               "clip_ratio/region_mean": masked_mean((low | high).to(logp_new.dtype), mask)}
        if dual_clip is not None:
            out["pg_clipfrac_lower"] = masked_mean(
                ((ratio > dual_clip) & (a < 0)).to(logp_new.dtype), mask)
    return out

