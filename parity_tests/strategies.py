"""Reusable hypothesis strategies; arrays are drawn with NumPy (hypothesis.extra.numpy)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from grpospec import AGG_MODES, IMPORTANCE_LEVELS

logprob_values = st.floats(-6.0, 0.0, allow_nan=False, width=64)
class LossInputs(NamedTuple):
    logp_new: np.ndarray
    logp_old: np.ndarray
    logp_ref: np.ndarray
    adv: np.ndarray
    mask: np.ndarray
    kwargs: dict


#: Per-token log-ratios ``new - old`` drawn from four bands, so that every region of the
#: clipped objective occurs whatever ``clip_eps`` (0.1-0.3, upper up to 0.38) and
#: ``dual_clip`` (1.5 or 3) are drawn: inside the band, above the upper clip, below the
#: lower clip, and far above (beyond the dual-clip bound c = 3).
LOG_RATIO_BANDS = {"inside": (-0.09, 0.09), "above": (0.35, 0.8), "below": (-1.0, -0.4),
                   "far_above": (1.2, 2.0)}


@st.composite
def masks(draw, n: int, t: int, *, equal_lengths: bool = False) -> np.ndarray:
    """(n, t) 0/1 masks with at least one valid token per row.

    Rows are left-aligned (valid prefix), as in padded batches; ``equal_lengths`` gives
    every row the same number of valid tokens.
    """
    if equal_lengths:
        lengths = [draw(st.integers(1, t))] * n
    else:
        lengths = draw(st.lists(st.integers(1, t), min_size=n, max_size=n))
    return (np.arange(t)[None, :] < np.asarray(lengths)[:, None]).astype(np.float64)


@st.composite
def loss_kwargs(draw, t: int) -> dict:
    """Every option of ``grpo_loss``, variants included (``t``: the batch's T)."""
    clip_eps = draw(st.sampled_from([0.1, 0.2, 0.3]))
    return dict(
        clip_eps=clip_eps,
        beta=draw(st.sampled_from([0.0, 0.01, 0.1])),
        agg=draw(st.sampled_from(AGG_MODES)),
        clip_eps_high=draw(st.sampled_from([None, clip_eps + 0.08])),
        dual_clip=draw(st.sampled_from([None, 1.5, 3.0])),
        importance_level=draw(st.sampled_from(IMPORTANCE_LEVELS)),
        max_len=draw(st.sampled_from([None, t + 3])),
    )


@st.composite
def log_ratios(draw, shape: tuple[int, int]) -> np.ndarray:
    """(N, T) log-ratios, each token in one of ``LOG_RATIO_BANDS`` (drawn per token)."""
    bands = list(LOG_RATIO_BANDS.values())
    which = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, len(bands) - 1)))
    u = draw(hnp.arrays(np.float64, shape, elements=st.floats(0.0, 1.0, width=64)))
    lo = np.array([b[0] for b in bands])[which]
    hi = np.array([b[1] for b in bands])[which]
    return lo + u * (hi - lo)


@st.composite
def loss_inputs(draw, *, max_n: int = 5, max_t: int = 7, equal_lengths: bool = False,
                near_policy: bool = False) -> LossInputs:
    """Inputs of ``grpo_loss``: ``logp_old`` in [-6, 0]; ``logp_new = logp_old + `` a
    log-ratio from ``LOG_RATIO_BANDS`` (or, with ``near_policy``, within 0.5 nats);
    ``logp_ref`` within 0.5 nats of ``logp_new``; advantages in [-2, 2] per sequence or
    per token (GAE), nonzero; left-aligned masks of uneven lengths; every option."""
    n, t = draw(st.integers(1, max_n)), draw(st.integers(1, max_t))
    logp_old = draw(hnp.arrays(np.float64, (n, t), elements=logprob_values))
    if near_policy:
        delta = draw(hnp.arrays(np.float64, (n, t), elements=st.floats(-0.5, 0.5, width=64)))
    else:
        delta = draw(log_ratios((n, t)))
    logp_new = logp_old + delta
    ref_delta = draw(hnp.arrays(np.float64, (n, t), elements=st.floats(-0.5, 0.5, width=64)))
    logp_ref = logp_new + ref_delta
    adv_shape = (n, t) if draw(st.booleans()) else (n,)  # per sequence or per token (GAE)
    magnitude = draw(hnp.arrays(np.float64, adv_shape, elements=st.floats(0.1, 2.0, width=64)))
    sign = draw(hnp.arrays(np.float64, adv_shape, elements=st.sampled_from([-1.0, 1.0])))
    mask = draw(masks(n, t, equal_lengths=equal_lengths))
    return LossInputs(logp_new, logp_old, logp_ref, magnitude * sign, mask,
                      draw(loss_kwargs(t)))


def token_ratio(x: LossInputs) -> np.ndarray:
    """The ratio each valid token of ``x`` enters the loss with (NumPy; 1 where masked):
    its own ``exp(new - old)``, or for GSPO its sequence's ``exp(mean_t(new - old))``."""
    d = np.where(x.mask != 0, x.logp_new - x.logp_old, 0.0)
    if x.kwargs.get("importance_level") == "sequence":
        d = np.broadcast_to(d.sum(1, keepdims=True) / np.maximum(x.mask.sum(1, keepdims=True),
                                                                    1), d.shape)
    return np.exp(d)


def loss_regions(x: LossInputs) -> set[str]:
    """Which regions of the clipped objective the valid tokens of ``x`` fall in, for the
    ratio they enter with (``token_ratio``) and their advantage's sign:
    ``inside`` the band; ``clipped_high`` (A > 0, above); ``clipped_low`` (A < 0, below);
    ``outside_unclipped`` (outside the band, the other sign: the min keeps the raw term);
    ``dual_clip`` (A < 0 and ratio > c with dual_clip set); plus ``sequence_level``,
    ``per_token_adv``, ``masked`` (padding present) and ``kl`` (beta > 0)."""
    kw = x.kwargs
    eps = kw.get("clip_eps", 0.2)
    high = 1 + (kw.get("clip_eps_high") or eps)
    r = token_ratio(x)
    a = np.broadcast_to(x.adv[:, None] if x.adv.ndim == 1 else x.adv, r.shape)
    v = x.mask != 0
    out = set()
    inside = (r >= 1 - eps) & (r <= high)
    if np.any(v & inside):
        out.add("inside")
    if np.any(v & (a > 0) & (r > high)):
        out.add("clipped_high")
    if np.any(v & (a < 0) & (r < 1 - eps)):
        out.add("clipped_low")
    if np.any(v & ~inside & ~(((a > 0) & (r > high)) | ((a < 0) & (r < 1 - eps)))):
        out.add("outside_unclipped")
    if kw.get("dual_clip") is not None and np.any(v & (a < 0) & (r > kw["dual_clip"])):
        out.add("dual_clip")
    if kw.get("importance_level") == "sequence":
        out.add("sequence_level")
    if x.adv.ndim == 2:
        out.add("per_token_adv")
    if np.any(~v):
        out.add("masked")
    if kw.get("beta", 0) > 0:
        out.add("kl")
    return out


#: The regions the loss strategies must reach within a test run (``assert_covers``).
LOSS_REGIONS = ("inside", "clipped_high", "clipped_low", "outside_unclipped", "dual_clip",
                "sequence_level", "per_token_adv", "masked", "kl")


def assert_reaches(seen: set[str], required) -> None:
    """The examples of a property test reached every region in ``required`` (checked
    when the profile draws enough examples for that to be expected: ci, dev, thorough)."""
    from hypothesis import settings

    if settings().max_examples < 20:
        return
    missing = sorted(set(required) - seen)
    assert not missing, f"no example reached the regions {missing}: widen the strategy"


def note_regions(x: LossInputs, seen: set | None = None) -> set[str]:
    """Report ``loss_regions(x)`` to hypothesis's statistics (``event``) and add them to
    ``seen``; returns them."""
    from hypothesis import event

    regions = loss_regions(x)
    for name in sorted(regions):
        event(f"region: {name}")
    if seen is not None:
        seen |= regions
    return regions


@st.composite
def group_rewards(draw, *, max_b: int = 4, max_g: int = 8, min_g: int = 1) -> np.ndarray:
    """(B, G) rewards, mixing binary and continuous groups (ties are common)."""
    b, g = draw(st.integers(1, max_b)), draw(st.integers(min_g, max_g))
    elements = draw(st.sampled_from([
        st.sampled_from([0.0, 1.0]),
        st.floats(-10.0, 10.0, allow_nan=False, width=64),
    ]))
    return draw(hnp.arrays(np.float64, (b, g), elements=elements))


@st.composite
def gae_inputs(draw, *, max_n: int = 4, max_t: int = 7):
    """(rewards, values, mask, gamma, lam): (N, T) arrays with left-aligned masks."""
    n, t = draw(st.integers(1, max_n)), draw(st.integers(1, max_t))
    floats = st.floats(-2.0, 2.0, width=64)
    rewards = draw(hnp.arrays(np.float64, (n, t), elements=floats))
    values = draw(hnp.arrays(np.float64, (n, t), elements=floats))
    mask = draw(masks(n, t))
    unit = st.sampled_from([0.0, 0.5, 0.9, 0.95, 1.0])
    return rewards, values, mask, draw(unit), draw(unit)


@st.composite
def bandits(draw, *, max_k: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(theta, rewards), both (K,)."""
    k = draw(st.integers(1, max_k))
    theta = draw(hnp.arrays(np.float64, (k,), elements=st.floats(-5.0, 5.0, width=64)))
    rewards = draw(hnp.arrays(np.float64, (k,), elements=st.floats(-3.0, 3.0, width=64)))
    return theta, rewards
