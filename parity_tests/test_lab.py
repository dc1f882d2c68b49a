"""The lab's five tests, written once, run against ``--impl=jax|torch``."""

from __future__ import annotations

import numpy as np

THETA = np.array([0.5, -0.3, 1.0, 0.0, -1.0])
REWARDS = np.array([1.0, 0.2, 0.8, 0.5, 0.0])


def _exact(theta, rewards):
    """SPEC's closed form, in NumPy: pi * (r - E_pi[r])."""
    pi = np.exp(theta - theta.max())
    pi /= pi.sum()
    return pi * (rewards - pi @ rewards)


def test_reinforce_is_unbiased_and_baseline_reduces_variance(impl):
    exact = _exact(THETA, REWARDS)
    np.testing.assert_allclose(impl.numpy(impl.mod.exact_policy_gradient(
        impl.array(THETA), impl.array(REWARDS))), exact, atol=1e-6)

    big = impl.reinforce_estimates(THETA, REWARDS, 200_000, 0.0, repeats=1, seed=0)[0]
    assert np.max(np.abs(big - exact)) < 0.01

    mean_reward = float(_exact_mean(THETA, REWARDS))
    no_base = impl.reinforce_estimates(THETA, REWARDS, 32, 0.0, repeats=600, seed=1)
    with_base = impl.reinforce_estimates(THETA, REWARDS, 32, mean_reward, repeats=600, seed=2)
    var_no, var_with = no_base.var(axis=0).sum(), with_base.var(axis=0).sum()
    assert var_with < 0.5 * var_no, (var_with, var_no)
    # Both stay unbiased: their means agree with the exact gradient to a few std errors.
    for est in (no_base, with_base):
        stderr = est.std(axis=0) / np.sqrt(len(est))
        assert np.all(np.abs(est.mean(axis=0) - exact) < 5 * stderr + 1e-6)


def _exact_mean(theta, rewards):
    pi = np.exp(theta - theta.max())
    return (pi / pi.sum()) @ rewards


def test_group_advantages(impl):
    r = impl.array([[1.0, 0.0, 0.0, 1.0], [0.3, 0.3, 0.3, 0.3]])
    grpo = impl.numpy(impl.mod.group_advantages(r))
    dr = impl.numpy(impl.mod.group_advantages(r, std_norm=False))
    # std of [1,0,0,1] is 0.5 (population): (r - 0.5) / (0.5 + 1e-6)
    np.testing.assert_allclose(grpo[0], [1, -1, -1, 1], atol=1e-5)
    np.testing.assert_allclose(dr[0], [0.5, -0.5, -0.5, 0.5], atol=1e-7)
    assert np.all(grpo[1] == 0.0) and np.all(dr[1] == 0.0)


def test_grpo_loss_clipping_and_kl(impl):
    zeros, ones = np.zeros((1, 3)), np.ones((1, 3))
    # Identical policies, A = 1: ratio 1, k3 0, loss = -1.
    loss, _ = impl.loss_and_grad(zeros, zeros, zeros, np.ones(1), ones, beta=0.1)
    np.testing.assert_allclose(loss, -1.0, atol=1e-6)

    # A > 0 with ratio e^0.5 > 1.2: the clipped constant is selected, zero gradient.
    loss, grad = impl.loss_and_grad(zeros + 0.5, zeros, zeros + 0.5, np.ones(1), ones)
    np.testing.assert_allclose(loss, -1.2, atol=1e-6)
    assert np.all(grad == 0.0)
    # A < 0 with ratio e^-0.5 < 0.8: likewise.
    loss, grad = impl.loss_and_grad(zeros - 0.5, zeros, zeros - 0.5, -np.ones(1), ones)
    np.testing.assert_allclose(loss, 0.8, atol=1e-6)
    assert np.all(grad == 0.0)
    # Inside the band the gradient is -A * ratio / T per token.
    _, grad = impl.loss_and_grad(zeros + 0.1, zeros, zeros + 0.1, np.ones(1), ones)
    np.testing.assert_allclose(grad, -np.exp(0.1) / 3 * ones, rtol=1e-6)

    # k3 > 0 whenever ref != new, = 0 when equal.
    d = impl.array([0.3, -0.2, 1e-3, 0.0])
    kl = impl.numpy(impl.mod.k3_kl(impl.array([0.0, 0.0, 0.0, 0.0]), d))
    assert np.all(kl[:3] > 0) and kl[3] == 0
    # and with beta > 0 the loss grows by beta * mean k3 (A = 0 isolates the KL term)
    ref = np.array([[0.3, -0.2, 0.5]])
    loss, _ = impl.loss_and_grad(zeros, zeros, ref, np.zeros(1), ones, beta=0.5)
    np.testing.assert_allclose(loss, 0.5 * np.mean(np.exp(ref) - ref - 1), rtol=1e-5)


def test_aggregation_modes_differ_with_uneven_lengths(impl):
    lp = np.zeros((2, 4))
    mask = np.array([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=float)
    adv = np.array([1.0, -1.0])
    token, _ = impl.loss_and_grad(lp, lp, lp, adv, mask, agg="token")
    seq, _ = impl.loss_and_grad(lp, lp, lp, adv, mask, agg="seq")
    np.testing.assert_allclose(token, -3 / 5, atol=1e-7)
    assert seq == 0.0


def test_grpo_learns_the_counting_task(impl):
    reward = np.asarray(impl.mod.train_counting(seed=0)["mean_reward"])
    assert reward.shape == (80,)
    assert reward[0] < 0.3
    assert reward[-5:].mean() > 0.7
