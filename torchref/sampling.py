"""Sampling a categorical distribution from one uniform number per draw (inverse CDF).

``torch.multinomial`` does more work per draw than a small policy needs; the inverse
CDF needs one uniform per draw: with ``c_k = sum_{j <= k} p_j``, the token is the number
of ``c_k`` below ``u * c_{V-1}``. It draws exactly the distribution ``p``
(``P(token = k) = P(c_{k-1} <= u c < c_k) = p_k``). ``jaxgrpo.sampling`` is the same.
"""

from __future__ import annotations

import torch


def categorical_icdf(u: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Tokens drawn from ``softmax(logp)`` by the inverse CDF of uniforms ``u``.

    ``token = #{k < V - 1 : cumsum(p)_k <= u * sum(p)}`` with ``p = exp(logp - max)``.
    A token of probability 0 (``logp = -inf``) is never drawn.

    Args:
      u: (...) uniforms in [0, 1).
      logp: (..., V) log-probabilities or logits.
    Returns:
      (...) int64 token ids.

    >>> logp = torch.tensor([0.25, 0.0, 0.75]).log().expand(4, 3)
    >>> categorical_icdf(torch.tensor([0.0, 0.2, 0.25, 0.99]), logp).tolist()
    [0, 0, 2, 2]
    """
    if logp.dtype != torch.float64:
        logp = logp.float()
    p = torch.exp(logp - logp.amax(dim=-1, keepdim=True))
    cdf = p.cumsum(dim=-1)
    threshold = u.to(cdf.dtype)[..., None] * cdf[..., -1:]
    return (cdf[..., :-1] <= threshold).sum(dim=-1)
