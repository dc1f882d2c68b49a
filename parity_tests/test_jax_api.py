"""jaxgrpo's functions compose with jax.jit / vmap / grad, and the closed form is jax.grad."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given

import jaxgrpo
from parity_tests.strategies import bandits


@given(bandits())
def test_exact_policy_gradient_equals_jax_grad(bandit):
    theta, rewards = (jnp.asarray(a, jnp.float32) for a in bandit)
    np.testing.assert_allclose(jaxgrpo.exact_policy_gradient(theta, rewards),
                               jax.grad(jaxgrpo.expected_reward)(theta, rewards),
                               rtol=1e-5, atol=1e-6)


def test_every_public_function_works_under_jit():
    lp = jnp.zeros((2, 3))
    key = jax.random.key(0)
    theta, r = jnp.array([0.1, 0.2, -0.3]), jnp.array([1.0, 0.0, 0.5])
    calls = [
        (jaxgrpo.expected_reward, (theta, r)),
        (jaxgrpo.exact_policy_gradient, (theta, r)),
        (lambda t, rw, b, k: jaxgrpo.reinforce_gradient(t, rw, 16, b, k), (theta, r, 0.5, key)),
        (lambda t, rw, b, ks: jaxgrpo.reinforce_gradients(t, rw, 16, b, ks),
         (theta, r, 0.5, jax.random.split(key, 3))),
        (functools.partial(jaxgrpo.group_advantages, std_norm=False), (jnp.ones((2, 4)),)),
        (functools.partial(jaxgrpo.grpo_loss, agg="seq"),
         (lp, lp, lp, jnp.ones(2), jnp.ones((2, 3)), 0.2, 0.05)),
        (jaxgrpo.k3_kl, (lp, lp + 0.1)),
        (jaxgrpo.selective_log_softmax, (jnp.zeros((2, 3, 5)), jnp.zeros((2, 3), jnp.int32))),
    ]
    for fn, args in calls:
        np.testing.assert_allclose(jax.jit(fn)(*args), fn(*args), rtol=1e-6)


def test_grpo_loss_vmaps_over_a_batch_of_problems():
    rng = np.random.default_rng(0)
    new, old = rng.normal(size=(4, 2, 3)) * 0.1, np.zeros((4, 2, 3))
    adv, mask = rng.normal(size=(4, 2)), np.ones((4, 2, 3))
    batched = jax.vmap(lambda a, b, c, d: jaxgrpo.grpo_loss(a, b, b, c, d, beta=0.1))(
        new, old, adv, mask)
    one_by_one = [jaxgrpo.grpo_loss(new[i], old[i], old[i], adv[i], mask[i], beta=0.1)
                  for i in range(4)]
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-6)
