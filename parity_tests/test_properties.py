"""Properties of the math, each its own test, run against ``--impl=jax|torch``.

Inputs are float64 (JAX under ``jax.enable_x64``), so tolerances can be tight.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from parity_tests.strategies import (
    gae_inputs,
    group_rewards,
    logprob_values,
    loss_inputs,
    note_regions,
)


@pytest.fixture(autouse=True)
def _x64():
    import jax

    with jax.enable_x64(True):
        yield


@given(st.lists(st.tuples(logprob_values, logprob_values), min_size=1, max_size=16))
def test_k3_is_nonnegative_and_zero_iff_equal(impl, pairs):
    new, ref = np.array(pairs, dtype=np.float64).T
    kl = impl.numpy(impl.mod.k3_kl(impl.array(new, np.float64), impl.array(ref, np.float64)))
    assert np.all(kl >= 0)
    assert np.all(kl[new == ref] == 0)
    # where the two differ by more than float rounding, k3 is strictly positive
    assert np.all(kl[np.abs(new - ref) > 1e-6] > 0)


@given(group_rewards(), st.booleans())
def test_advantages_sum_to_zero_per_group(impl, rewards, std_norm):
    adv = impl.numpy(impl.mod.group_advantages(impl.array(rewards, np.float64), std_norm=std_norm))
    scale = 1.0 if std_norm else max(1.0, np.abs(rewards).max())
    np.testing.assert_allclose(adv.sum(axis=1), 0.0, atol=1e-9 * scale * rewards.shape[1])


@given(st.integers(1, 4), st.integers(1, 8), st.floats(-5, 5, width=64), st.booleans())
def test_equal_rewards_give_exact_zeros(impl, b, g, value, std_norm):
    rewards = np.full((b, g), value)
    adv = impl.numpy(impl.mod.group_advantages(impl.array(rewards, np.float64), std_norm=std_norm))
    assert np.all(adv == 0.0)


@given(group_rewards(min_g=2), st.floats(0.1, 10.0), st.floats(-5.0, 5.0))
def test_grpo_advantages_invariant_to_affine_rewards(impl, rewards, a, b):
    # Groups whose std is tiny are dominated by eps; affine invariance holds where std >> eps.
    assume(np.all((rewards.std(axis=1) > 1e-2) | (rewards.std(axis=1) == 0)))
    before = impl.numpy(impl.mod.group_advantages(impl.array(rewards, np.float64)))
    after = impl.numpy(impl.mod.group_advantages(impl.array(a * rewards + b, np.float64)))
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)


@given(loss_inputs(equal_lengths=True))
def test_token_and_seq_agree_when_lengths_are_equal(impl, x):
    note_regions(x)
    kw = {k: v for k, v in x.kwargs.items() if k not in ("agg", "max_len")}
    args = (x.logp_new, x.logp_old, x.logp_ref, x.adv, x.mask)
    tok, g_tok = impl.loss_and_grad(*args, dtype=np.float64, agg="token", **kw)
    seq, g_seq = impl.loss_and_grad(*args, dtype=np.float64, agg="seq", **kw)
    np.testing.assert_allclose(tok, seq, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g_tok, g_seq, rtol=1e-10, atol=1e-12)
    # and "constant" with max_len = the common length: sum / (N * len) is the same mean
    length = int(x.mask[0].sum())
    const, g_const = impl.loss_and_grad(*args, dtype=np.float64, agg="constant",
                                        max_len=length, **kw)
    np.testing.assert_allclose(const, tok, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g_const, g_tok, rtol=1e-10, atol=1e-12)


@given(loss_inputs(), st.integers(1, 4))
def test_padding_masked_columns_changes_nothing(impl, x, extra):
    note_regions(x)
    args = (x.logp_new, x.logp_old, x.logp_ref, x.adv, x.mask)
    kw = dict(x.kwargs)
    if kw["max_len"] is None:  # "constant" divides by T unless told: fix it before padding
        kw["max_len"] = x.mask.shape[1]
    base, g_base = impl.loss_and_grad(*args, dtype=np.float64, **kw)
    pad = lambda a, v: np.pad(a, ((0, 0), (0, extra)), constant_values=v)  # noqa: E731
    adv = pad(x.adv, 7.0) if x.adv.ndim == 2 else x.adv
    padded = (pad(x.logp_new, -3.0), pad(x.logp_old, -1.0), pad(x.logp_ref, 0.0), adv,
              pad(x.mask, 0.0))
    val, g = impl.loss_and_grad(*padded, dtype=np.float64, **kw)
    np.testing.assert_allclose(val, base, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(g[:, : x.mask.shape[1]], g_base, rtol=1e-12, atol=1e-14)
    assert np.all(g[:, x.mask.shape[1]:] == 0)


@given(loss_inputs(), st.sampled_from([np.nan, np.inf, -np.inf, 1e30, -1e30]),
       st.sampled_from(["new", "old", "ref", "all"]))
def test_masked_garbage_changes_neither_loss_nor_gradient(impl, x, garbage, where):
    assume(np.any(x.mask == 0))
    note_regions(x)
    args = [x.logp_new, x.logp_old, x.logp_ref]
    base, g_base = impl.loss_and_grad(*args, x.adv, x.mask, dtype=np.float64, **x.kwargs)
    targets = {"new": [0], "old": [1], "ref": [2], "all": [0, 1, 2]}[where]
    dirty = [np.where(x.mask == 0, garbage, a) if i in targets else a for i, a in enumerate(args)]
    val, g = impl.loss_and_grad(*dirty, x.adv, x.mask, dtype=np.float64, **x.kwargs)
    assert np.isfinite(val) and np.all(np.isfinite(g))
    assert val == base
    np.testing.assert_array_equal(g, g_base)


@pytest.mark.parametrize("sign", [1.0, -1.0])
@given(st.integers(1, 6), st.floats(0.05, 0.35))
def test_gradient_is_zero_when_clipped_and_nonzero_inside_band(impl, sign, t, eps):
    # Per token: log-ratios far outside the band on the side where clipping binds, and
    # well inside it. beta = 0 isolates the surrogate's gradient.
    beyond = np.log(1 + eps) + 0.05 if sign > 0 else np.log(1 - eps) - 0.05
    inside = 0.5 * np.log(1 + eps) if sign > 0 else 0.5 * np.log(1 - eps)
    old = np.zeros((2, t))
    new = np.stack([np.full(t, beyond), np.full(t, inside)])
    adv = np.array([sign, sign])
    _, g = impl.loss_and_grad(new, old, old, adv, np.ones((2, t)), dtype=np.float64,
                              clip_eps=eps, beta=0.0)
    assert np.all(g[0] == 0.0)
    # inside the band: d/dnew of -(ratio A) / (2t) = -A ratio / (2t)
    np.testing.assert_allclose(g[1], -sign * np.exp(inside) / (2 * t), rtol=1e-12)


@given(loss_inputs())
def test_sequence_level_ratio_is_the_length_normalised_ratio(impl, x):
    """GSPO equals token-level PPO on a batch whose per-token log-ratio is replaced by
    its sequence mean (a closed form built with NumPy)."""
    note_regions(x)
    kw = {**x.kwargs, "beta": 0.0}
    args = (x.logp_new, x.logp_old, x.logp_ref, x.adv, x.mask)
    seq_level, _ = impl.loss_and_grad(*args, dtype=np.float64,
                                      **{**kw, "importance_level": "sequence"})
    d = np.where(x.mask != 0, x.logp_new - x.logp_old, 0)
    mean_d = d.sum(1, keepdims=True) / x.mask.sum(1, keepdims=True)
    shifted_new = x.logp_old + np.broadcast_to(mean_d, d.shape)
    token_level, _ = impl.loss_and_grad(shifted_new, x.logp_old, x.logp_ref, x.adv, x.mask,
                                        dtype=np.float64, **{**kw, "importance_level": "token"})
    np.testing.assert_allclose(seq_level, token_level, rtol=1e-9, atol=1e-12)


@given(group_rewards(min_g=2))
def test_rloo_is_the_leave_one_out_baseline(impl, rewards):
    adv = impl.numpy(impl.mod.rloo_advantages(impl.array(rewards, np.float64)))
    g = rewards.shape[1]
    for i in range(g):  # a direct leave-one-out loop
        others = np.delete(rewards, i, axis=1).mean(axis=1)
        expected = np.where(rewards.max(1) == rewards.min(1), 0.0, rewards[:, i] - others)
        np.testing.assert_allclose(adv[:, i], expected, rtol=1e-9, atol=1e-9)


@given(gae_inputs())
def test_gae_matches_a_direct_loop(impl, inputs):
    rewards, values, mask, gamma, lam = inputs
    arrays = (impl.array(a, np.float64) for a in (rewards, values, mask))
    adv, ret = impl.mod.gae_advantages(*arrays, gamma=gamma, lam=lam)
    # direct: for each valid t, A_t = sum_k (gamma lam)^k delta_{t+k} over the valid tail
    expected = np.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        n = int(mask[i].sum())
        v = np.append(values[i, :n], 0.0)
        delta = rewards[i, :n] + gamma * v[1:] - v[:-1]
        for t in range(n):
            expected[i, t] = sum((gamma * lam) ** k * delta[t + k] for k in range(n - t))
    np.testing.assert_allclose(impl.numpy(adv), expected, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(impl.numpy(ret), np.where(mask != 0, expected + values, 0),
                               rtol=1e-9, atol=1e-9)
