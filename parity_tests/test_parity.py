"""jaxgrpo and torchref agree: values and gradients, on inputs hypothesis draws.

Compared in float64 (JAX under ``jax.enable_x64``) with ``rtol=1e-10, atol=1e-12``:
both compute the same float64 formula, so differences are a few ulps of exp/log.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import jaxgrpo
import torchref
from parity_tests.impls import IMPLS
from parity_tests.strategies import (
    LOSS_REGIONS,
    assert_reaches,
    bandits,
    gae_inputs,
    group_rewards,
    loss_inputs,
    note_regions,
)

pytestmark = pytest.mark.parity  # compares the frameworks: cannot see a shared mistake

RTOL, ATOL = 1e-10, 1e-12
JAX, TORCH = IMPLS["jax"], IMPLS["torch"]


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def test_grpo_loss_values_and_gradients_agree():
    seen: set[str] = set()

    @given(loss_inputs())
    def check(x):
        note_regions(x, seen)
        args = (x.logp_new, x.logp_old, x.logp_ref, x.adv, x.mask)
        v_jax, g_jax = JAX.loss_and_grad(*args, dtype=np.float64, **x.kwargs)
        v_torch, g_torch = TORCH.loss_and_grad(*args, dtype=np.float64, **x.kwargs)
        np.testing.assert_allclose(v_jax, v_torch, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(g_jax, g_torch, rtol=RTOL, atol=ATOL)

    check()
    assert_reaches(seen, LOSS_REGIONS)


@given(loss_inputs())
def test_clip_metrics_agree(x):
    kw = {k: x.kwargs[k] for k in ("clip_eps", "clip_eps_high", "importance_level",
                                   "dual_clip")}
    args = (x.logp_new, x.logp_old, x.adv, x.mask)
    assert JAX.clip_metrics(*args, **kw) == pytest.approx(TORCH.clip_metrics(*args, **kw),
                                                          abs=1e-12)


@given(group_rewards(), st.booleans())
def test_group_advantages_agree(rewards, std_norm):
    a_jax = np.asarray(jaxgrpo.group_advantages(jnp.asarray(rewards), std_norm=std_norm))
    a_torch = torchref.group_advantages(torch.from_numpy(rewards), std_norm=std_norm).numpy()
    # the two frameworks reduce in different orders: the float64 sums may differ by ulps
    # of the rewards' magnitude, which 1/(std + eps) can magnify.
    np.testing.assert_allclose(a_jax, a_torch, rtol=1e-9, atol=1e-9)
    constant = rewards.max(axis=1) == rewards.min(axis=1)
    assert np.all(a_jax[constant] == 0) and np.all(a_torch[constant] == 0)


@given(bandits())
def test_bandit_gradients_agree(bandit):
    theta, rewards = bandit
    g_torch = torchref.exact_policy_gradient(torch.from_numpy(theta), torch.from_numpy(rewards))
    t = torch.from_numpy(theta).requires_grad_(True)
    (torch.softmax(t, -1) * torch.from_numpy(rewards)).sum().backward()
    th, r = jnp.asarray(theta), jnp.asarray(rewards)
    g_closed = jaxgrpo.exact_policy_gradient(th, r)
    g_autodiff = jax.grad(jaxgrpo.expected_reward)(th, r)
    for g in (g_closed, g_autodiff, t.grad):
        np.testing.assert_allclose(np.asarray(g), g_torch.numpy(), rtol=RTOL, atol=ATOL)
    j_torch = (torch.softmax(t, -1) * torch.from_numpy(rewards)).sum().detach()
    np.testing.assert_allclose(float(jaxgrpo.expected_reward(th, r)), float(j_torch),
                               rtol=RTOL, atol=ATOL)


@given(group_rewards(min_g=2))
def test_rloo_advantages_agree(rewards):
    a_jax = np.asarray(jaxgrpo.rloo_advantages(jnp.asarray(rewards)))
    a_torch = torchref.rloo_advantages(torch.from_numpy(rewards)).numpy()
    np.testing.assert_allclose(a_jax, a_torch, rtol=1e-9, atol=1e-9)


@given(gae_inputs())
def test_gae_agrees(inputs):
    rewards, values, mask, gamma, lam = inputs
    a_jax, r_jax = jaxgrpo.gae_advantages(rewards, values, mask, gamma, lam)
    a_torch, r_torch = torchref.gae_advantages(*(torch.from_numpy(a) for a in inputs[:3]),
                                               gamma, lam)
    np.testing.assert_allclose(np.asarray(a_jax), a_torch.numpy(), rtol=RTOL, atol=1e-11)
    np.testing.assert_allclose(np.asarray(r_jax), r_torch.numpy(), rtol=RTOL, atol=1e-11)


@given(gae_inputs())
def test_value_loss_values_and_gradients_agree(inputs):
    values, returns, mask = inputs[1], inputs[0], inputs[2]
    v_jax, g_jax = jax.value_and_grad(jaxgrpo.value_loss)(jnp.asarray(values), returns, mask)
    v = torch.from_numpy(values).requires_grad_(True)
    loss = torchref.value_loss(v, torch.from_numpy(returns), torch.from_numpy(mask))
    loss.backward()
    np.testing.assert_allclose(float(v_jax), float(loss.detach()), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(g_jax), v.grad.numpy(), rtol=RTOL, atol=ATOL)


@given(group_rewards(max_b=8, max_g=4), st.integers(1, 8))
def test_dynamic_sampling_selects_the_same_groups(rewards, n_keep):
    n_keep = min(n_keep, rewards.shape[0])
    kept_jax = np.asarray(jaxgrpo.select_groups(jnp.asarray(rewards), n_keep))
    kept_torch = torchref.select_groups(torch.from_numpy(rewards), n_keep).numpy()
    np.testing.assert_array_equal(kept_jax, kept_torch)
