"""Independent truths of ``grpo_loss`` and ``clip_metrics``, run against ``--impl=jax|torch``.

Parity (``test_parity.py``) cannot see a mistake made the same way in both frameworks.
These tests can: every gradient against central finite differences, the GSPO and KL
gradients and the dual-clip bound against their closed forms, hand-worked numbers for
the aggregations, exact zeros for the gradients into the constants, and the clip metrics
against the loss's own gradient (a token counts as clipped exactly when its gradient is
0). The property tests assert that their examples reach the regions where the feature
acts (``assert_reaches``), and report the regions to hypothesis's statistics.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from parity_tests.strategies import (
    LOSS_REGIONS,
    LossInputs,
    assert_reaches,
    loss_inputs,
    note_regions,
    token_ratio,
)


@pytest.fixture(autouse=True)
def _x64():
    import jax

    with jax.enable_x64(True):
        yield


def _kinks(x: LossInputs) -> np.ndarray:
    kw = x.kwargs
    eps = kw.get("clip_eps", 0.2)
    kinks = [1 - eps, 1 + (kw.get("clip_eps_high") or eps)]
    if kw.get("dual_clip") is not None:
        kinks.append(kw["dual_clip"])
    return np.asarray(kinks)


def _distance_to_kinks(x: LossInputs) -> float:
    """Smallest relative distance of a valid token's ratio from a kink of the objective
    (the clip edges and the dual-clip bound), where finite differences do not apply."""
    r = token_ratio(x)[x.mask != 0]
    k = _kinks(x)
    return float(np.min(np.abs(r[:, None] - k[None, :]) / k[None, :]))


def test_loss_strategy_reaches_every_region():
    """The drawn inputs of the parity and property suites exercise every region of the
    clipped objective (inside the band, each clip, the dual-clip bound, ...)."""
    seen: set[str] = set()

    @given(loss_inputs())
    def draw(x):
        note_regions(x, seen)

    draw()
    assert_reaches(seen, LOSS_REGIONS)


def test_gradient_matches_finite_differences(impl):
    """d loss / d logp_new from autodiff equals central differences (float64), for every
    option drawn: clipping, dual-clip, GSPO, per-token advantages, all aggregations, KL."""
    seen: set[str] = set()

    @given(loss_inputs(max_n=3, max_t=4))
    def check(x):
        assume(_distance_to_kinks(x) > 1e-3)
        note_regions(x, seen)
        args = (x.logp_old, x.logp_ref, x.adv, x.mask)
        value, grad = impl.loss_and_grad(x.logp_new, *args, dtype=np.float64, **x.kwargs)
        h = 1e-6
        fd = np.zeros_like(x.logp_new)
        for idx in np.ndindex(*x.logp_new.shape):
            step = np.zeros_like(x.logp_new)
            step[idx] = h
            up, _ = impl.loss_and_grad(x.logp_new + step, *args, dtype=np.float64, **x.kwargs)
            down, _ = impl.loss_and_grad(x.logp_new - step, *args, dtype=np.float64, **x.kwargs)
            fd[idx] = (up - down) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-7)
        assert np.all(grad[x.mask == 0] == 0)

    check()
    assert_reaches(seen, ("inside", "clipped_high", "clipped_low", "dual_clip",
                          "sequence_level", "per_token_adv", "kl"))


@given(loss_inputs())
def test_no_gradient_flows_into_old_ref_or_adv(impl, x):
    """``logp_old``, ``logp_ref`` and ``adv`` are constants of the loss: their gradients
    are exactly 0 (torch: no gradient reaches them at all)."""
    note_regions(x)
    _, grads = impl.loss_and_grads(x.logp_new, x.logp_old, x.logp_ref, x.adv, x.mask,
                                   **{**x.kwargs, "beta": 0.1})
    for name, g in zip(("logp_old", "logp_ref", "adv"), grads[1:], strict=True):
        assert g is None or np.all(g == 0), f"a gradient flows into {name}"
    assert np.any(grads[0] != 0)  # while the loss does depend on logp_new


@pytest.mark.parametrize("agg", ["seq", "token"])
def test_gspo_gradient_is_the_closed_form(impl, agg):
    """GSPO (``importance_level="sequence"``, one advantage per sequence, beta = 0): every
    token of an unclipped sequence i gets ``-A_i s_i / |y_i| / N`` (agg ``seq``) or
    ``-A_i s_i / n_tokens`` (agg ``token``), with ``s_i = exp(mean_t(new - old))``; every
    token of a clipped sequence gets 0."""
    seen: set[str] = set()

    @given(loss_inputs())
    def check(x):
        adv = x.adv if x.adv.ndim == 1 else x.adv[:, 0]
        kw = {**x.kwargs, "importance_level": "sequence", "beta": 0.0, "agg": agg,
              "dual_clip": None}
        x = x._replace(adv=adv, kwargs=kw)
        assume(_distance_to_kinks(x) > 1e-6)
        note_regions(x, seen)
        _, grad = impl.loss_and_grad(x.logp_new, x.logp_old, x.logp_ref, adv, x.mask,
                                     dtype=np.float64, **kw)
        valid = x.mask != 0
        lengths = x.mask.sum(1)
        s = token_ratio(x)[:, 0]
        eps, high = kw["clip_eps"], 1 + (kw["clip_eps_high"] or kw["clip_eps"])
        clipped = ((adv > 0) & (s > high)) | ((adv < 0) & (s < 1 - eps))
        norm = lengths * len(lengths) if agg == "seq" else np.full_like(lengths, x.mask.sum())
        per_row = np.where(clipped, 0.0, -adv * s / norm)
        np.testing.assert_allclose(grad, np.where(valid, per_row[:, None], 0.0),
                                   rtol=1e-9, atol=1e-12)

    check()
    assert_reaches(seen, ("inside", "clipped_high", "clipped_low"))


def test_dual_clip_by_hand(impl):
    """One token, A = -1, ratio e^2 = 7.39 > c = 3: the dual-clip bound makes the loss
    -c A = 3 with zero gradient; without it the loss is -A ratio = 7.39 with gradient
    ratio. A positive advantage is untouched by dual-clip."""
    new, zero, one = np.array([[2.0]]), np.zeros((1, 1)), np.ones((1, 1))
    loss, grad = impl.loss_and_grad(new, zero, zero, -np.ones(1), one, dtype=np.float64,
                                    dual_clip=3.0)
    assert loss == pytest.approx(3.0, abs=1e-12) and grad[0, 0] == 0.0
    loss, grad = impl.loss_and_grad(new, zero, zero, -np.ones(1), one, dtype=np.float64)
    assert loss == pytest.approx(np.exp(2.0), rel=1e-12)
    assert grad[0, 0] == pytest.approx(np.exp(2.0), rel=1e-12)
    # ratio between 1 + eps and c: the bound does not bind yet
    mid = np.array([[np.log(2.0)]])
    loss, grad = impl.loss_and_grad(mid, zero, zero, -np.ones(1), one, dtype=np.float64,
                                    dual_clip=3.0)
    assert loss == pytest.approx(2.0, rel=1e-12) and grad[0, 0] == pytest.approx(2.0, rel=1e-12)
    loss, grad = impl.loss_and_grad(new, zero, zero, np.ones(1), one, dtype=np.float64,
                                    dual_clip=3.0)
    assert loss == pytest.approx(-1.2, rel=1e-12) and grad[0, 0] == 0.0  # clipped at 1 + eps


@given(loss_inputs(), st.sampled_from([1.5, 3.0]))
def test_dual_clip_bounds_every_negative_token(impl, x, c):
    """With dual_clip = c, a token with A < 0 and ratio > c contributes exactly -c A and no
    gradient; every other token is as without dual-clip."""
    kw = {**x.kwargs, "beta": 0.0, "agg": "token", "importance_level": "token"}
    x = x._replace(kwargs={**kw, "dual_clip": c})
    args = (x.logp_new, x.logp_old, x.logp_ref, x.adv, x.mask)
    base, g_base = impl.loss_and_grad(*args, dtype=np.float64, **{**kw, "dual_clip": None})
    dual, g_dual = impl.loss_and_grad(*args, dtype=np.float64, **{**kw, "dual_clip": c})
    r = token_ratio(x)
    a = np.broadcast_to(x.adv[:, None] if x.adv.ndim == 1 else x.adv, r.shape)
    bound = (x.mask != 0) & (a < 0) & (r > c)
    assume(np.any(bound))
    note_regions(x)
    eps, high = kw["clip_eps"], 1 + (kw["clip_eps_high"] or kw["clip_eps"])
    surr = np.minimum(r * a, np.clip(r, 1 - eps, high) * a)
    per_token = np.where(bound, -c * a, -surr)
    expected = np.sum(np.where(x.mask != 0, per_token, 0)) / x.mask.sum()
    np.testing.assert_allclose(dual, expected, rtol=1e-10, atol=1e-12)
    assert np.all(g_dual[bound] == 0) and np.all(g_base[bound] != 0)
    np.testing.assert_allclose(g_dual[~bound], g_base[~bound], rtol=1e-12, atol=1e-15)
    assert dual < base


def test_aggregations_by_hand(impl):
    """Identical policies (ratio 1), beta = 0, per-token loss -A. Rows [A=1, 2 tokens] and
    [A=2, 1 token]: the masked sum is -4; token mean -4/3; sequence mean (-1 - 2)/2;
    constant -4 / (N * max_len) = -4/8 with max_len 4, -4/6 with the default max_len T."""
    lp = np.zeros((2, 3))
    mask = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = np.array([1.0, 2.0])
    cases = {("token", None): -4 / 3, ("seq", None): -1.5, ("constant", 4): -0.5,
             ("constant", None): -4 / 6}
    for (agg, max_len), want in cases.items():
        loss, grad = impl.loss_and_grad(lp, lp, lp, adv, mask, dtype=np.float64, agg=agg,
                                        max_len=max_len)
        assert loss == pytest.approx(want, rel=1e-12), (agg, max_len)
        # d/dnew of -A ratio / normaliser, at ratio 1
        norm = {"token": np.full((2, 1), 3.0), "seq": mask.sum(1, keepdims=True) * 2,
                "constant": np.full((2, 1), 2.0 * (max_len or 3))}[agg]
        np.testing.assert_allclose(grad, -adv[:, None] * mask / norm, rtol=1e-12)


def test_kl_term_value_and_gradient_by_hand(impl):
    """A = 0 isolates the KL term: loss = beta * mean_t k3, and its gradient per token is
    ``beta * (1 - exp(ref - new)) / n_tokens`` (k3's derivative in new)."""
    new = np.array([[-1.0, -0.5, -2.0]])
    ref = np.array([[-1.3, -0.2, -1.0]])
    mask, beta = np.ones((1, 3)), 0.25
    loss, grad = impl.loss_and_grad(new, new, ref, np.zeros(1), mask, dtype=np.float64,
                                    beta=beta)
    d = ref - new
    assert loss == pytest.approx(beta * np.mean(np.exp(d) - d - 1), rel=1e-12)
    np.testing.assert_allclose(grad, beta * (1 - np.exp(d)) / 3, rtol=1e-12)


def test_beta_zero_has_no_kl_term_even_when_k3_overflows(impl):
    """beta = 0: the KL term is absent, not 0 * k3. With ref - new = 100, float32 exp
    overflows (k3 = inf) and 0 * inf would be NaN; the loss and gradient must equal those
    with ref = new."""
    new = np.array([[-101.0, -1.0], [-0.5, -2.0]], np.float32)
    ref = new + np.float32(100.0)
    adv, mask = np.array([1.0, -1.0]), np.ones((2, 2))
    for agg in ("token", "seq", "constant"):
        clean = impl.loss_and_grad(new, new, new, adv, mask, dtype=np.float32, agg=agg)
        dirty = impl.loss_and_grad(new, new, ref, adv, mask, dtype=np.float32, agg=agg)
        assert np.isfinite(dirty[0]) and np.all(np.isfinite(dirty[1]))
        assert dirty[0] == clean[0]
        np.testing.assert_array_equal(dirty[1], clean[1])


def test_a_traced_beta_of_zero_is_also_safe():
    """Under ``jax.jit`` with beta traced (not known when the program is built), beta = 0
    still gives a finite loss and gradient when k3 overflows."""
    import jax
    import jax.numpy as jnp

    import jaxgrpo

    new = jnp.array([[-101.0, -1.0]], jnp.float32)
    ref, adv, mask = new + 100.0, jnp.ones(1), jnp.ones((1, 2))
    f = jax.jit(jax.value_and_grad(lambda x, b: jaxgrpo.grpo_loss(x, x, ref, adv, mask,
                                                                   beta=b)))
    value, grad = f(new, jnp.float32(0.0))
    assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))
    clean = jax.value_and_grad(lambda x: jaxgrpo.grpo_loss(x, x, x, adv, mask))(new)
    assert float(value) == float(clean[0])
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(clean[1]))
    value, _ = f(new, jnp.float32(0.5))
    assert not np.isfinite(float(value))  # beta > 0 with k3 = inf: the penalty is infinite


def test_clip_metrics_by_hand(impl):
    """ratios [1.5, 0.5, 1.5, 0.5, 1.0, 4.0] with advantages [+, -, -, +, +, -], eps 0.2,
    dual-clip c = 3: token 0 is clipped high, token 1 clipped low; tokens 2 and 3 are
    outside the band but the min keeps their raw term (not clipped); token 5 (A < 0,
    ratio 4 > 3) is where the dual-clip bound binds. A masked 7th token is ignored."""
    ratio = np.array([[1.5, 0.5, 1.5, 0.5, 1.0, 4.0, 9.0]])
    adv = np.array([[1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 1.0]])
    mask = np.array([[1, 1, 1, 1, 1, 1, 0]], dtype=float)
    m = impl.clip_metrics(np.log(ratio), np.zeros_like(ratio), adv, mask, clip_eps=0.2,
                          dual_clip=3.0)
    assert m == pytest.approx({"clip_ratio/low_mean": 1 / 6, "clip_ratio/high_mean": 1 / 6,
                               "clip_ratio/region_mean": 2 / 6, "pg_clipfrac_lower": 1 / 6})
    # clip-higher moves the upper edge: 1.5 is inside [0.8, 1.6]
    m = impl.clip_metrics(np.log(ratio), np.zeros_like(ratio), adv, mask, clip_eps=0.2,
                          clip_eps_high=0.6)
    assert m["clip_ratio/high_mean"] == 0 and m["clip_ratio/low_mean"] == pytest.approx(1 / 6)
    assert "pg_clipfrac_lower" not in m


@given(loss_inputs())
def test_clip_metrics_count_exactly_the_tokens_without_gradient(impl, x):
    """A valid token (A != 0) gets zero loss gradient exactly where a clip or the dual-clip
    bound binds: ``region_mean + pg_clipfrac_lower`` is the share of valid tokens whose
    gradient is 0, for token- and sequence-level ratios alike (beta = 0, agg token)."""
    kw = {**x.kwargs, "beta": 0.0, "agg": "token"}
    if kw["importance_level"] == "sequence" and x.adv.ndim == 2:
        # a sequence ratio with per-token advantages mixes the tokens' terms in one
        # gradient; the one-advantage-per-sequence case is GSPO's
        x = x._replace(adv=x.adv[:, 0])
    x = x._replace(kwargs=kw)
    assume(_distance_to_kinks(x) > 1e-9)
    note_regions(x)
    _, grad = impl.loss_and_grad(x.logp_new, x.logp_old, x.logp_ref, x.adv, x.mask,
                                 dtype=np.float64, **kw)
    metric_kw = {k: kw[k] for k in ("clip_eps", "clip_eps_high", "importance_level",
                                    "dual_clip")}
    m = impl.clip_metrics(x.logp_new, x.logp_old, x.adv, x.mask, **metric_kw)
    valid = x.mask != 0
    zero_grad_share = np.sum(valid & (grad == 0)) / valid.sum()
    counted = m["clip_ratio/region_mean"] + m.get("pg_clipfrac_lower", 0.0)
    assert counted == pytest.approx(zero_grad_share, abs=1e-12)
    assert m["clip_ratio/region_mean"] == pytest.approx(
        m["clip_ratio/low_mean"] + m["clip_ratio/high_mean"], abs=1e-12)
