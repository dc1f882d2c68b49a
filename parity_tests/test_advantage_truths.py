"""Independent truths of the advantage estimators, run against ``--impl=jax|torch``:
hand-worked numbers and identities that hold whatever the implementation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from parity_tests.strategies import gae_inputs


@pytest.fixture(autouse=True)
def _x64():
    import jax

    with jax.enable_x64(True):
        yield


def _adv(impl, name, rewards, **kw):
    return impl.numpy(getattr(impl.mod, name)(impl.array(rewards, np.float64), **kw))


def test_grpo_divides_by_the_population_std_plus_eps(impl):
    """[0, 0.002]: mean 0.001, population std 0.001 (the sample std would be 0.00141), so
    GRPO's advantages are +-0.001 / (0.001 + 1e-6), not +-0.001 / sqrt(0.001^2 + 1e-6)."""
    adv = _adv(impl, "group_advantages", [[0.0, 0.002]])
    np.testing.assert_allclose(adv, [[-0.001 / 0.001001, 0.001 / 0.001001]], rtol=1e-12)
    # [1, 0, 0, 1]: std 0.5 (population), advantages +-1 (SPEC section 2)
    np.testing.assert_allclose(_adv(impl, "group_advantages", [[1.0, 0.0, 0.0, 1.0]]),
                               [[1, -1, -1, 1]], atol=1e-5)
    # eps = 0: exactly the standardised rewards; G = 3 distinguishes 1/G from 1/(G - 1)
    np.testing.assert_allclose(_adv(impl, "group_advantages", [[3.0, 0.0, 0.0]], eps=0.0),
                               [[2 / np.sqrt(2), -1 / np.sqrt(2), -1 / np.sqrt(2)]],
                               rtol=1e-12)


@pytest.mark.parametrize("std_norm", [True, False])
def test_equal_rewards_give_exact_zeros_even_when_the_mean_rounds(impl, std_norm):
    """0.1 * 3 / 3 != 0.1 in float: the mean of equal rewards can differ from them by an
    ulp, which std normalisation would blow up to O(1); the rule is exact zeros."""
    rewards = [[0.1, 0.1, 0.1], [1 / 3] * 3, [0.7] * 3]
    assert np.all(_adv(impl, "group_advantages", rewards, std_norm=std_norm) == 0.0)
    assert np.all(_adv(impl, "rloo_advantages", rewards) == 0.0)


def test_rloo_by_hand(impl):
    """RLOO subtracts the mean of the other G - 1 rewards."""
    np.testing.assert_allclose(_adv(impl, "rloo_advantages", [[1.0, 0.0, 0.0, 1.0]]),
                               [[2 / 3, -2 / 3, -2 / 3, 2 / 3]], rtol=1e-12)
    np.testing.assert_allclose(_adv(impl, "rloo_advantages", [[3.0, 1.0, 2.0]]),
                               [[1.5, -1.5, 0.0]], rtol=1e-12, atol=1e-15)


def _gae(impl, rewards, values, mask, gamma, lam):
    adv, ret = impl.mod.gae_advantages(*(impl.array(a, np.float64)
                                         for a in (rewards, values, mask)), gamma=gamma,
                                       lam=lam)
    return impl.numpy(adv), impl.numpy(ret)


def test_gae_by_hand(impl):
    """Three tokens, reward 1 at the end, V = (0.5, 0.2, 0.1), gamma 0.9, lambda 0.8:
    deltas (0.9*0.2 - 0.5, 0.9*0.1 - 0.2, 1 - 0.1) = (-0.32, -0.11, 0.9); A_2 = 0.9,
    A_1 = -0.11 + 0.72 * 0.9 = 0.538, A_0 = -0.32 + 0.72 * 0.538 = 0.06736."""
    adv, ret = _gae(impl, [[0.0, 0.0, 1.0]], [[0.5, 0.2, 0.1]], [[1, 1, 1]], 0.9, 0.8)
    np.testing.assert_allclose(adv, [[0.06736, 0.538, 0.9]], rtol=1e-12)
    np.testing.assert_allclose(ret, [[0.56736, 0.738, 1.0]], rtol=1e-12)


@given(gae_inputs())
def test_gae_limits_are_monte_carlo_and_one_step_td(impl, inputs):
    """lambda = 1: A_t = sum_k gamma^k r_{t+k} - V_t (the discounted return minus the
    baseline); lambda = 0: A_t = r_t + gamma V_{t+1} - V_t (one-step TD). Returns = A + V."""
    rewards, values, mask, gamma, _ = inputs
    valid = mask != 0
    adv1, ret1 = _gae(impl, rewards, values, mask, gamma, 1.0)
    adv0, _ = _gae(impl, rewards, values, mask, gamma, 0.0)
    for i in range(rewards.shape[0]):
        n = int(mask[i].sum())
        discounts = gamma ** np.arange(n)
        mc = np.array([np.sum(discounts[: n - t] * rewards[i, t:n]) for t in range(n)])
        np.testing.assert_allclose(adv1[i, :n], mc - values[i, :n], rtol=1e-9, atol=1e-9)
        nxt = np.append(values[i, 1:n], 0.0)
        np.testing.assert_allclose(adv0[i, :n], rewards[i, :n] + gamma * nxt - values[i, :n],
                                   rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ret1, np.where(valid, adv1 + values, 0.0), rtol=1e-9, atol=1e-9)
    assert np.all(adv1[~valid] == 0) and np.all(adv0[~valid] == 0)


def test_batch_reward_scaling_by_hand(impl):
    """TRL's scale_rewards="batch": the group's mean, one std for the whole batch. Rewards
    [[1, 0], [1, 1]]: centred (0.5, -0.5, 0, 0); the population std of (1, 0, 1, 1) is
    sqrt(3)/4 = 0.4330: advantages +-1.1547, and exact zeros for the equal group;
    "none" keeps +-0.5, "group" gives +-1."""
    rewards = [[1.0, 0.0], [1.0, 1.0]]
    batch = _adv(impl, "group_advantages", rewards, scale_rewards="batch", eps=0.0)
    np.testing.assert_allclose(batch, [[2 / np.sqrt(3), -2 / np.sqrt(3)], [0, 0]], rtol=1e-12)
    np.testing.assert_allclose(_adv(impl, "group_advantages", rewards, scale_rewards="none"),
                               [[0.5, -0.5], [0, 0]], rtol=1e-12)
    np.testing.assert_allclose(_adv(impl, "group_advantages", rewards, scale_rewards="group",
                                    eps=0.0), [[1, -1], [0, 0]], rtol=1e-12)


@given(st.lists(st.floats(-5, 5, width=64), min_size=2, max_size=24).filter(
    lambda r: np.std(r) > 1e-3))
def test_reinforce_pp_normalises_the_whole_batch(impl, rewards):
    """REINFORCE++: mean 0 and population std 1 over the whole batch (no per-group
    baseline), the order of the rewards kept."""
    r = np.asarray(rewards).reshape(1, -1)
    adv = _adv(impl, "reinforce_pp_advantages", r, eps=0.0)
    np.testing.assert_allclose(adv.mean(), 0.0, atol=1e-9)
    np.testing.assert_allclose(adv.std(), 1.0, rtol=1e-9)
    np.testing.assert_allclose(adv, (r - r.mean()) / r.std(), rtol=1e-9, atol=1e-9)


def test_reinforce_pp_has_no_per_prompt_baseline_by_hand(impl):
    """[[1, 1], [1, 0]]: batch mean 0.75, population std 0.433; the always-solved prompt's
    completions get +0.577 each (a group baseline would give them 0)."""
    adv = _adv(impl, "reinforce_pp_advantages", [[1.0, 1.0], [1.0, 0.0]], eps=0.0)
    s = np.sqrt(3) / 4
    np.testing.assert_allclose(adv, [[0.25 / s, 0.25 / s], [0.25 / s, -0.75 / s]], rtol=1e-12)


def test_reinforce_pp_of_equal_rewards_is_exactly_zero(impl):
    assert np.all(_adv(impl, "reinforce_pp_advantages", [[0.1, 0.1], [0.1, 0.1]]) == 0)


def test_overlong_penalty_by_hand(impl):
    """DAPO, max 8 tokens, buffer 4, penalty 0.5: nothing up to 4 tokens, then -0.5 (L - 4)
    / 4: 5 -> -0.125, 8 -> -0.5; beyond the limit -0.5."""
    got = impl.numpy(impl.mod.overlong_penalty(impl.array([1, 4, 5, 8, 9], np.int64), 8, 4,
                                               0.5))
    np.testing.assert_allclose(got, [0, 0, -0.125, -0.5, -0.5], rtol=1e-6)


def test_estimator_advantages_dispatches_each_estimator_by_hand(impl):
    """The trainers' dispatch (``estimator_advantages``), each estimator by hand on two
    groups of 3, [3, 0, 0] and [1, 1, 0] (population stds sqrt(2) and sqrt(2)/3; the
    batch's mean 5/6 and std sqrt(41)/6): the right formula behind each name."""
    from importlib import import_module

    advantages = import_module(f"{impl.mod.__name__}.advantages")
    rewards = impl.array(np.array([3.0, 0.0, 0.0, 1.0, 1.0, 0.0]), np.float64)
    mask, lengths = impl.array(np.ones((6, 2))), impl.array(np.full(6, 2))
    dev = np.array([2.0, -1.0, -1.0, 1 / 3, 1 / 3, -2 / 3])  # r - the group's mean
    want = {
        "grpo": dev / np.repeat([np.sqrt(2) + 1e-6, np.sqrt(2) / 3 + 1e-6], 3),
        "dr_grpo": dev,
        "rloo": np.array([3.0, -1.5, -1.5, 0.5, 0.5, -1.0]),  # r - the others' mean
        "reinforce_pp": (np.array([3.0, 0, 0, 1, 1, 0]) - 5 / 6) / (np.sqrt(41) / 6 + 1e-6),
    }
    for estimator, expected in want.items():
        adv, returns = advantages.estimator_advantages(estimator, rewards, 3, mask, lengths)
        assert returns is None, estimator
        np.testing.assert_allclose(impl.numpy(adv), expected, rtol=1e-12, err_msg=estimator)
