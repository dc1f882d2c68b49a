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
from parity_tests.strategies import bandits, group_rewards, loss_inputs

RTOL, ATOL = 1e-10, 1e-12
JAX, TORCH = IMPLS["jax"], IMPLS["torch"]


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


@given(loss_inputs())
def test_grpo_loss_values_and_gradients_agree(x):
    args = (x.logp_new, x.logp_old, x.logp_ref, x.adv, x.mask)
    v_jax, g_jax = JAX.loss_and_grad(*args, dtype=np.float64, **x.kwargs)
    v_torch, g_torch = TORCH.loss_and_grad(*args, dtype=np.float64, **x.kwargs)
    np.testing.assert_allclose(v_jax, v_torch, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(g_jax, g_torch, rtol=RTOL, atol=ATOL)


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
