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
def loss_inputs(draw, *, max_n: int = 5, max_t: int = 7, equal_lengths: bool = False,
                near_policy: bool = True) -> LossInputs:
    """Inputs of ``grpo_loss``. With ``near_policy`` the new/old/ref log-probs differ by
    up to 0.5 nats, so ratios fall both inside and outside the clip band."""
    n, t = draw(st.integers(1, max_n)), draw(st.integers(1, max_t))
    logp_old = draw(hnp.arrays(np.float64, (n, t), elements=logprob_values))
    delta = st.floats(-0.5, 0.5, allow_nan=False, width=64) if near_policy else logprob_values
    logp_new = logp_old + draw(hnp.arrays(np.float64, (n, t), elements=delta))
    logp_ref = logp_old + draw(hnp.arrays(np.float64, (n, t), elements=delta))
    adv_shape = (n, t) if draw(st.booleans()) else (n,)  # per sequence or per token (GAE)
    adv = draw(hnp.arrays(np.float64, adv_shape, elements=st.floats(-2.0, 2.0, width=64)))
    mask = draw(masks(n, t, equal_lengths=equal_lengths))
    return LossInputs(logp_new, logp_old, logp_ref, adv, mask, draw(loss_kwargs(t)))


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
