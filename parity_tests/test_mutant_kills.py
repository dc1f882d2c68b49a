"""Tests that mutation testing (README, "Mutation testing") showed missing: each pins a
behaviour a surviving mutant changed, by an independent truth (hand-worked numbers,
exact messages), against ``--impl=jax|torch`` where both have it."""

from __future__ import annotations

import math

import numpy as np
import pytest


def test_reinforce_pp_divides_by_std_plus_eps_exactly(impl):
    """A = (r - mean) / (std + eps), population std, to float64 precision: rewards
    [0, 1] give std 0.5, so A = +-0.5 / (0.5 + eps); with eps = 0.1, +-0.5 / 0.6."""
    import jax

    with jax.enable_x64(True):
        r = impl.array([0.0, 1.0], np.float64)
        for eps, expect in ((1e-6, 0.5 / (0.5 + 1e-6)), (0.1, 0.5 / 0.6)):
            a = np.asarray(impl.mod.reinforce_pp_advantages(r, eps=eps), np.float64)
            np.testing.assert_allclose(a, [-expect, expect], rtol=1e-12)
        a = np.asarray(impl.mod.reinforce_pp_advantages(r), np.float64)
        np.testing.assert_allclose(a, [-0.5 / (0.5 + 1e-6), 0.5 / (0.5 + 1e-6)], rtol=1e-12)


def test_gae_defaults_are_gamma_1_and_lambda_095(impl):
    """One row, rewards only at the last of 3 steps, values 0: with gamma = 1 and
    lambda = 0.95 the advantages are [0.95^2, 0.95, 1] times the reward."""
    rewards = impl.array([[0.0, 0.0, 1.0]])
    values = impl.array([[0.0, 0.0, 0.0]])
    mask = impl.array([[1.0, 1.0, 1.0]])
    adv, _ = impl.mod.gae_advantages(rewards, values, mask)
    np.testing.assert_allclose(np.asarray(adv)[0], [0.95 ** 2, 0.95, 1.0], rtol=1e-6)


def test_select_groups_and_group_rows_by_hand(impl):
    """Groups 1 and 3 vary: they come first, in order, then the zero-variance ones in
    order (a stable sort); their rows are g * G + 0 .. G - 1."""
    grouped = impl.array([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [2.0, 2.0]])
    kept = np.asarray(impl.mod.select_groups(grouped, 5))
    assert kept.tolist() == [1, 3, 0, 2, 4]
    from importlib import import_module

    counting = import_module(f"{impl.mod.__name__}.counting")
    idx = impl.array(np.array([3, 1]), np.int64) if impl.name == "torch" else np.array([3, 1])
    rows = np.asarray(counting.group_rows(idx, 3))
    assert rows.tolist() == [9, 10, 11, 3, 4, 5]


@pytest.mark.parametrize("baseline", [None, float("nan"), float("inf")])
def test_reinforce_gradients_refuses_a_baseline_that_is_not_a_finite_number(baseline):
    import jax

    import jaxgrpo

    keys = jax.random.split(jax.random.key(0), 2)
    with pytest.raises(ValueError, match="baseline must be a finite number"):
        jaxgrpo.reinforce_gradients(np.zeros(3), np.ones(3), 4, baseline, keys)


def test_reinforce_gradients_refuses_keys_that_are_not_a_1d_key_array():
    import jax

    import jaxgrpo

    for keys in (np.zeros(2), jax.random.split(jax.random.key(0), 4).reshape(2, 2),
                 jax.numpy.zeros(2)):
        with pytest.raises(TypeError, match="keys must be a 1-D array of JAX PRNG keys"):
            jaxgrpo.reinforce_gradients(np.zeros(3), np.ones(3), 4, 0.0, keys)


def test_reinforce_gradients_in_float64_stays_float64():
    import jax

    import jaxgrpo

    with jax.enable_x64(True):
        keys = jax.random.split(jax.random.key(0), 2)
        g = jaxgrpo.reinforce_gradients(np.zeros(3), np.ones(3), 4, 0.3, keys)
        assert g.dtype == np.float64 and g.shape == (2, 3)


@pytest.mark.parametrize("call, message", [
    (lambda m, a: m.exact_policy_gradient(a(np.zeros(0)), a(np.zeros(0))),
     "theta must hold at least one action, got K = 0"),
    (lambda m, a: m.exact_policy_gradient(a(np.zeros(3)), a(np.zeros(2))),
     "rewards must have the shape of theta (3,), got (2,)"),
    (lambda m, a: m.exact_policy_gradient(a(np.zeros((1, 3))), a(np.zeros((1, 3)))),
     "theta must be 1-D (K,), got shape (1, 3)"),
])
def test_bandit_errors_word_the_argument_and_shapes(impl, call, message):
    with pytest.raises(ValueError) as e:
        call(impl.mod, impl.array)
    assert str(e.value) == message


def test_gae_errors_name_each_argument(impl):
    ok = np.zeros((2, 3))
    shape = r"^mask must have the shape of rewards \(2, 3\), got \(2, 2\)$"
    with pytest.raises(ValueError, match=shape):
        impl.mod.gae_advantages(impl.array(ok), impl.array(ok), impl.array(np.zeros((2, 2))))
    with pytest.raises(ValueError, match="^lam must lie in"):
        impl.mod.gae_advantages(impl.array(ok), impl.array(ok), impl.array(ok), 1.0, 1.5)
    with pytest.raises(ValueError, match="^max_len must be"):
        impl.mod.overlong_penalty(impl.array(np.ones(2)), 0, 1)


def test_train_counting_default_seed_is_0():
    import jaxgrpo

    a = jaxgrpo.train_counting(steps=2)
    b = jaxgrpo.train_counting(seed=0, steps=2)
    assert all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)
    assert math.isfinite(float(a["loss"][-1]))
