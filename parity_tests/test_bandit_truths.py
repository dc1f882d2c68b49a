"""Independent truths of the softmax bandit, run against ``--impl=jax|torch``."""

from __future__ import annotations

import numpy as np
import pytest

THETA = np.array([0.5, -0.3, 1.0, 0.0, -1.0])
REWARDS = np.array([1.0, 0.2, 0.8, 0.5, 0.0])


def _exact(theta, rewards):
    pi = np.exp(theta - theta.max())
    pi /= pi.sum()
    return pi * (rewards - pi @ rewards)


def test_exact_gradient_matches_finite_differences(impl):
    """``pi * (r - E_pi[r])`` against central differences of ``J = softmax(theta) . r``."""
    def objective(theta):
        pi = np.exp(theta - theta.max())
        return (pi / pi.sum()) @ REWARDS

    h = 1e-6
    fd = np.array([(objective(THETA + h * e) - objective(THETA - h * e)) / (2 * h)
                   for e in np.eye(len(THETA))])
    got = impl.numpy(impl.mod.exact_policy_gradient(impl.array(THETA, np.float64),
                                                    impl.array(REWARDS, np.float64)))
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("n, baseline", [(1, 0.0), (2, 0.0), (2, 3.0)])
def test_reinforce_is_unbiased_even_for_one_or_two_samples(impl, n, baseline):
    """E[(r(a) - b)(onehot(a) - pi)] = exact gradient for any fixed b, whatever n: 20,000
    estimates of n samples average to it within 5 standard errors. A baseline that uses
    the batch's own rewards (the mean of the n samples) is biased by a factor 1 - 1/n,
    which n = 1 and 2 make large (the gradient would be 0, or half of it)."""
    est = impl.reinforce_estimates(THETA, REWARDS, n, baseline, repeats=20_000, seed=3)
    exact = _exact(THETA, REWARDS)
    stderr = est.std(axis=0) / np.sqrt(len(est))
    assert np.all(np.abs(est.mean(axis=0) - exact) < 5 * stderr + 1e-6), (
        est.mean(axis=0), exact, stderr)
    assert np.all(stderr < 0.2 * np.abs(exact))  # the test has the power to see a bias
