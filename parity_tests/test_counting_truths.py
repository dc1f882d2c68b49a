"""Independent truths of the toy tasks' trainer pieces, run against ``--impl=jax|torch``:
dynamic sampling's selection rule, the GAE whitening, token entropy, and the reference
policy staying the initial one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpospec import CountingConfig
from parity_tests.strategies import group_rewards


@pytest.fixture(autouse=True)
def _x64():
    import jax

    with jax.enable_x64(True):
        yield


@given(group_rewards(max_b=8, max_g=4), st.integers(1, 8))
def test_dynamic_sampling_keeps_varying_groups_first_in_order(impl, rewards, n_keep):
    """Groups whose rewards vary come first, in sampling order; zero-variance ones only
    fill the remaining places, also in sampling order."""
    n_keep = min(n_keep, rewards.shape[0])
    kept = impl.numpy(impl.mod.select_groups(impl.array(rewards, np.float64), n_keep))
    varies = rewards.max(1) != rewards.min(1)
    expected = [i for i in range(len(rewards)) if varies[i]]
    expected += [i for i in range(len(rewards)) if not varies[i]]
    np.testing.assert_array_equal(kept, expected[:n_keep])


def test_token_entropy_by_hand(impl):
    """Uniform logits over V give log V; [0, log 3] gives the entropy of (1/4, 3/4)."""
    logits = np.array([[0.0] * 8, [0.0, np.log(3.0)] + [-np.inf] * 6])
    got = impl.numpy(impl.mod.token_entropy(impl.array(logits[:1], np.float32)))
    np.testing.assert_allclose(got, [np.log(8)], rtol=1e-6)
    two = impl.numpy(impl.mod.token_entropy(impl.array([[0.0, np.log(3.0)]], np.float32)))
    np.testing.assert_allclose(two, [-(0.25 * np.log(0.25) + 0.75 * np.log(0.75))], rtol=1e-6)


def test_ppo_advantages_are_whitened_over_valid_tokens(impl):
    """estimator="gae": the advantages have mean 0 and (population) std 1 over the batch's
    valid tokens, and are 0 elsewhere."""
    cfg = CountingConfig(estimator="gae", task="variable")
    rng = np.random.default_rng(0)
    n = cfg.n_prompts * cfg.group_size
    prompts = rng.integers(0, 8, n)
    completions = rng.integers(0, cfg.vocab_size, (n, cfg.length))
    if impl.name == "jax":
        from flax import nnx

        from jaxgrpo.counting import _advantages
        policy = impl.mod.CounterPolicy(cfg.vocab_size, cfg.length, value_head=True,
                                        rngs=nnx.Rngs(0))
        policy.value[...] = rng.normal(size=policy.value.shape)
        p, c = impl.array(prompts, np.int32), impl.array(completions, np.int32)
    else:
        import torch

        from torchref.counting import _advantages
        policy = impl.mod.CounterPolicy(cfg.vocab_size, cfg.length, value_head=True)
        with torch.no_grad():
            policy.value.copy_(torch.from_numpy(rng.normal(size=tuple(policy.value.shape))))
        p, c = impl.array(prompts, np.int64), impl.array(completions, np.int64)
    rewards, mask, _, lengths = impl.mod.task_reward(cfg.task, p, c)
    adv, returns = _advantages(cfg, policy, p, c, rewards, mask, lengths)
    adv, mask = impl.numpy(adv), impl.numpy(mask)
    valid = mask != 0
    assert 0 < valid.mean() < 1  # variable lengths: some positions are padding
    np.testing.assert_allclose(adv[valid].mean(), 0.0, atol=1e-6)
    np.testing.assert_allclose(adv[valid].std(), 1.0, rtol=1e-4)
    assert np.all(adv[~valid] == 0)


@pytest.mark.parametrize("impl_name", ["jax", "torch"])
def test_the_kl_reference_stays_the_initial_policy(impl_name):
    """After 80 steps the policy is far from where it started: the k3 KL to the frozen
    initial policy is large (about 2 nats per token). A reference that moved with the
    policy would measure only one update's drift (about 0.01)."""
    from parity_tests.impls import IMPLS

    kl = np.asarray(IMPLS[impl_name].mod.train_counting(seed=0, steps=40)["kl"])
    assert kl[-5:].mean() > 0.5, kl[-5:]
