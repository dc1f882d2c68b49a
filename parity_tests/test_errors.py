"""Bad input gets a clear error naming the argument; degenerate cases are defined.

The rules live in ``grpospec`` and both implementations call them, so the same bad
input raises the same exception with the same words in either framework.
"""

from __future__ import annotations

import numpy as np
import pytest

from parity_tests.impls import IMPLS

Z23, Z2, ONES23 = np.zeros((2, 3)), np.zeros(2), np.ones((2, 3))


def _loss(*, logp_new=Z23, logp_old=Z23, logp_ref=Z23, adv=Z2, mask=ONES23, **kw):
    return ("grpo_loss", (logp_new, logp_old, logp_ref, adv, mask), kw)


CASES = {
    "adv-not-N": (_loss(adv=np.zeros((2, 1))), ValueError, r"adv must be 1-D .*\(2,\)"),
    "adv-wrong-N": (_loss(adv=np.zeros(3)), ValueError, r"adv must be 1-D"),
    "mask-shape": (_loss(mask=np.ones((2, 4))), ValueError, r"mask must have the shape"),
    "logp_old-shape": (_loss(logp_old=np.zeros((3, 3))), ValueError, r"logp_old must have"),
    "logp_new-rank": (_loss(logp_new=np.zeros(3)), ValueError, r"logp_new must be 2-D"),
    "agg-unknown": (_loss(agg="mean"), ValueError,
                    r"agg must be one of \('token', 'seq', 'constant'\)"),
    "clip_eps-zero": (_loss(clip_eps=0.0), ValueError, r"clip_eps must lie in \(0, 1\)"),
    "clip_eps-big": (_loss(clip_eps=1.5), ValueError, r"clip_eps must lie in \(0, 1\)"),
    "clip_eps_high-neg": (_loss(clip_eps_high=-0.1), ValueError, r"clip_eps_high must be"),
    "beta-negative": (_loss(beta=-0.1), ValueError, r"beta must be a finite number >= 0"),
    "rewards-1d": (("group_advantages", (np.zeros(4),), {}), ValueError, r"rewards must be 2-D"),
    "rewards-3d": (("group_advantages", (np.zeros((2, 2, 2)),), {}), ValueError,
                   r"rewards must be 2-D"),
    "rewards-G0": (("group_advantages", (np.zeros((2, 0)),), {}), ValueError,
                   r"at least one sample per group"),
    "eps-negative": (("group_advantages", (np.zeros((2, 2)),), {"eps": -1.0}), ValueError,
                     r"eps must be"),
    "theta-2d": (("exact_policy_gradient", (np.zeros((2, 2)), np.zeros((2, 2))), {}),
                 ValueError, r"theta must be 1-D"),
    "bandit-mismatch": (("exact_policy_gradient", (np.zeros(3), np.zeros(4)), {}), ValueError,
                        r"rewards must have the shape of theta"),
    "n-zero": (("reinforce_gradient", (np.zeros(3), np.zeros(3), 0, 0.0, "RNG"), {}),
               ValueError, r"n must be an int >= 1, got 0"),
    "n-float": (("reinforce_gradient", (np.zeros(3), np.zeros(3), 2.5, 0.0, "RNG"), {}),
                TypeError, r"n must be an int >= 1"),
    "dual_clip-small": (_loss(dual_clip=0.5), ValueError, r"dual_clip must be a finite number > 1"),
    "importance-unknown": (_loss(importance_level="seq"), ValueError,
                           r"importance_level must be one of \('token', 'sequence'\)"),
    "max_len-zero": (_loss(agg="constant", max_len=0), ValueError, r"max_len must be an int >= 1"),
    "adv-per-token-wrong": (_loss(adv=np.zeros((2, 4))), ValueError, r"or one per token"),
    "rloo-G1": (("rloo_advantages", (np.zeros((3, 1)),), {}), ValueError,
                r"G >= 2 samples per group for RLOO"),
    "rloo-1d": (("rloo_advantages", (np.zeros(3),), {}), ValueError, r"rewards must be 2-D"),
    "gae-values-shape": (("gae_advantages", (Z23, np.zeros((2, 2)), ONES23), {}), ValueError,
                         r"values must have the shape of rewards"),
    "gae-gamma": (("gae_advantages", (Z23, Z23, ONES23), {"gamma": 1.5}), ValueError,
                  r"gamma must lie in \[0, 1\]"),
    "value_loss-shape": (("value_loss", (Z23, np.zeros((3, 3)), ONES23), {}), ValueError,
                         r"returns must have the shape of values"),
    "value_loss-mask-shape": (("value_loss", (Z23, Z23, np.ones((1, 3))), {}), ValueError,
                              r"mask must have the shape of values \(2, 3\), got \(1, 3\)"),
    "rng-wrong": (("reinforce_gradient", (np.zeros(3), np.zeros(3), 4, 0.0, 7), {}),
                  TypeError, r"rng must be"),
}


def _call(impl, case):
    name, args, kw = case
    conv = [impl.rng(0) if isinstance(a, str) and a == "RNG"
            else impl.array(a) if isinstance(a, np.ndarray) else a for a in args]
    return getattr(impl.mod, name)(*conv, **kw)


@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_input_gets_a_clear_error(impl, case_id):
    case, exc, match = CASES[case_id]
    with pytest.raises(exc, match=match):
        _call(impl, case)


@pytest.mark.parametrize("case_id", [c for c in CASES if c != "rng-wrong"])
def test_both_implementations_raise_the_same_error(case_id):
    case, exc, _ = CASES[case_id]
    messages = []
    for impl in IMPLS.values():
        with pytest.raises(exc) as info:
            _call(impl, case)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_seq_mode_row_without_valid_tokens_contributes_zero(impl):
    # Row 0: identical policies, A = 2 -> per-row loss -2. Row 1 has no valid token
    # (and garbage log-probs): it adds 0 and still counts as a row -> -2 / 2 = -1.
    new = np.array([[0.0, 0.0], [np.nan, np.inf]])
    old = np.array([[0.0, 0.0], [np.inf, np.nan]])
    mask = np.array([[1.0, 1.0], [0.0, 0.0]])
    loss, grad = impl.loss_and_grad(new, old, old, np.array([2.0, 5.0]), mask, agg="seq")
    assert loss == pytest.approx(-1.0)
    np.testing.assert_allclose(grad, [[-0.5, -0.5], [0.0, 0.0]])


@pytest.mark.parametrize("agg", ["token", "seq"])
def test_batch_without_valid_tokens_gives_zero_loss_and_gradient(impl, agg):
    new = np.full((2, 3), np.nan)
    loss, grad = impl.loss_and_grad(new, new, new, np.ones(2), np.zeros((2, 3)), agg=agg,
                                    beta=0.1)
    assert loss == 0.0
    assert np.all(grad == 0.0)


@pytest.mark.parametrize("std_norm", [True, False])
def test_group_of_size_one_gets_zero_advantage(impl, std_norm):
    adv = impl.numpy(impl.mod.group_advantages(impl.array([[3.0], [-1.0]]), std_norm=std_norm))
    assert adv.shape == (2, 1) and np.all(adv == 0.0)


def test_masks_of_any_numeric_dtype_mean_the_same(impl):
    new, old = np.array([[0.1, -0.2, 0.3]]), np.zeros((1, 3))
    as_float, g_float = impl.loss_and_grad(new, old, old, np.ones(1), np.array([[1.0, 1.0, 0.0]]))
    mask = np.array([[True, True, False]])
    args = [impl.array(a) for a in (new, old, old, np.ones(1))]
    as_bool = impl.mod.grpo_loss(*args, impl.array(mask, dtype=bool))
    assert float(impl.numpy(as_bool)) == pytest.approx(as_float)
    assert g_float[0, 2] == 0.0


@pytest.mark.parametrize("kwargs, match", [
    ({"estimator": "ppo"}, r"estimator must be one of \('grpo', 'dr_grpo', 'rloo', 'gae', "
     r"'reinforce_pp'\)"),
    ({"task": "adding"}, r"task must be one of"),
    ({"estimator": "rloo", "group_size": 1}, r"group_size must be >= 2 for estimator='rloo'"),
    ({"oversample": 0}, r"oversample must be an int >= 1"),
    ({"lam": 1.5}, r"lam must lie in \[0, 1\]"),
    ({"dual_clip": 1.0}, r"dual_clip must be > 1"),
    ({"importance_level": "tok"}, r"importance_level must be one of"),
])
def test_bad_training_options_get_clear_errors(impl, kwargs, match):
    with pytest.raises(ValueError, match=match):
        impl.mod.train_counting(steps=1, **kwargs)


NEW_CASES = {
    "loss_mode": (dict(loss_mode="ppo"), r"loss_mode must be one of"),
    "kl_estimator": (dict(kl_estimator="k4"), r"kl_estimator must be one of"),
    "dual-clip-cispo": (dict(loss_mode="cispo", dual_clip=2.0), r"dual_clip .* needs loss_mode"),
    "entropy-missing": (dict(entropy_coef=0.1), r"entropy \(N, T\), the per-token entropy"),
    "top-q-range": (dict(top_entropy_quantile=0.0), r"top_entropy_quantile must lie in"),
    "entropy-coef-neg": (dict(entropy_coef=-1.0, entropy=np.zeros((2, 3))),
                         r"entropy_coef must be a finite number >= 0"),
    "entropy-shape": (dict(entropy_coef=0.1, entropy=np.zeros((2, 4))),
                      r"entropy must have the shape of logp_new"),
    "tis-no-sampler": (dict(tis_cap=2.0), r"tis_cap needs logp_sampler"),
    "tis-small": (dict(tis_cap=0.5, logp_sampler=np.zeros((2, 3))), r"tis_cap must be"),
    "sapo-temp": (dict(loss_mode="sapo", sapo_temperature_neg=0.0),
                  r"sapo_temperature_neg must be a finite number > 0"),
}


@pytest.mark.parametrize("case_id", list(NEW_CASES))
def test_the_second_round_of_options_gets_clear_errors(impl, case_id):
    kw, match = NEW_CASES[case_id]
    kw = {k: impl.array(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    with pytest.raises(ValueError, match=match):
        impl.mod.grpo_loss(*(impl.array(a) for a in (Z23, Z23, Z23, Z2, ONES23)), **kw)


def test_scale_rewards_and_overlong_options_get_clear_errors(impl):
    with pytest.raises(ValueError, match="scale_rewards must be one of"):
        impl.mod.group_advantages(impl.array(np.zeros((2, 2))), scale_rewards="global")
    with pytest.raises(ValueError, match="overlong_buffer must be <= the maximum length"):
        impl.mod.overlong_penalty(impl.array([1.0]), 4, 5)
