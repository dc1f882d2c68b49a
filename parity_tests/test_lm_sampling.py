"""The samplers: the inverse-CDF categorical draw and the KV-cache generation loop.

Independent truths: exact probabilities (a chi-square test of observed frequencies,
``P = 1e-4`` critical value, fixed seeds), ``numpy.searchsorted`` for the inverse CDF's
definition, the teacher-forced forward for the cached log-probs, and the lab's mask
rule written out by hand.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from hypothesis import event, given
from hypothesis import strategies as st

from grpospec.lm import END, PAD, LMConfig
from jaxgrpo import lm
from jaxgrpo.lm_tasks import completion_mask, sample_problems
from jaxgrpo.qwen2 import load_hf_state_dict, positions_from_mask
from jaxgrpo.sampling import categorical_icdf as jax_icdf
from torchref.sampling import categorical_icdf as torch_icdf


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Upper quantile of chi-square(df) at the normal quantile ``z`` (3.719: P = 1e-4),
    by the Wilson-Hilferty approximation (within 1% for df >= 3)."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def assert_draws_follow(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square of ``counts`` against ``probs`` below the P = 1e-4 critical value, and
    no draw at all of a zero-probability token. Returns the statistic."""
    n = counts.sum()
    assert np.all(counts[probs == 0] == 0), (counts, probs)
    live = probs > 0
    expected = n * probs[live]
    stat = float(((counts[live] - expected) ** 2 / expected).sum())
    assert stat < chi2_critical(int(live.sum()) - 1), (stat, counts, expected)
    return stat


PROBS = np.array([0.5, 0.2, 0.0, 0.1, 0.15, 0.04, 0.01, 0.0])


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_inverse_cdf_draws_the_exact_distribution(framework):
    n = 200_000
    with np.errstate(divide="ignore"):
        logp = np.log(PROBS).astype(np.float32) + 3.0  # unnormalised, -inf at zeros
    if framework == "jax":
        u = jax.random.uniform(jax.random.key(0), (n,))
        tokens = np.asarray(jax_icdf(u, jnp.broadcast_to(jnp.asarray(logp), (n, 8))))
    else:
        u = torch.rand(n, generator=torch.Generator().manual_seed(0))
        tokens = torch_icdf(u, torch.from_numpy(logp).expand(n, 8)).numpy()
    assert_draws_follow(np.bincount(tokens, minlength=8), PROBS)


@given(st.lists(st.one_of(st.floats(-30, 30), st.just(-np.inf)), min_size=2, max_size=12),
       st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=8))
def test_inverse_cdf_is_the_searchsorted_of_the_cdf(logits, us):
    """Property: the token is the first k with ``u * c < cdf_k`` (``numpy.searchsorted``
    of the float64 CDF), never a zero-probability token, in both frameworks."""
    logits = np.asarray(logits, np.float64)
    if not np.isfinite(logits).any():
        logits[0] = 0.0
    event(f"zero-probability tokens: {int(np.isinf(logits).sum()) > 0}")
    u = np.asarray(us)
    p = np.exp(logits - logits.max())
    cdf = np.cumsum(p)
    want = np.minimum(np.searchsorted(cdf, u * cdf[-1], side="right"), len(p) - 1)
    got_jax = np.asarray(jax_icdf(jnp.asarray(u, jnp.float32), jnp.broadcast_to(
        jnp.asarray(logits, jnp.float32), (len(u), len(p)))))
    got_torch = torch_icdf(torch.from_numpy(u), torch.from_numpy(logits).expand(len(u),
                                                                               len(p))).numpy()
    np.testing.assert_array_equal(got_torch, want)
    assert np.all(p[got_torch] > 0)
    # JAX runs in float32 here: equal except where u * c lies within rounding of a cdf
    near_edge = np.min(np.abs(cdf[None, :] - (u * cdf[-1])[:, None]), axis=1) < 1e-5 * cdf[-1]
    np.testing.assert_array_equal(got_jax[~near_edge], want[~near_edge])
    assert np.all(p[got_jax] > 0)



@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_inverse_cdf_is_shift_invariant_row_by_row_and_batched(framework):
    """``softmax(z + c) = softmax(z)``: each row's logits moved by its own constant
    (+-1000 and +-500; quarters, so exact in float32) draw the same tokens as unmoved
    (nothing overflows, no row is scaled by another's maximum), and a (2, 3, V) batch
    draws what its rows draw one by one."""
    rng = np.random.default_rng(0)
    v = 7
    logits = rng.integers(-16, 17, (6, v)).astype(np.float32) / 4
    u = rng.uniform(0, 1, 6).astype(np.float32)
    moved = logits + np.array([0, 1000, -1000, 0, 500, -500], np.float32)[:, None]
    if framework == "jax":
        def icdf(uu, z):
            return np.asarray(jax_icdf(jnp.asarray(uu), jnp.asarray(z)))
    else:
        def icdf(uu, z):
            return torch_icdf(torch.from_numpy(uu), torch.from_numpy(z)).numpy()
    want = np.array([icdf(u[i:i + 1], logits[i:i + 1])[0] for i in range(6)])
    assert len(set(want)) > 2  # the rows draw different tokens
    np.testing.assert_array_equal(icdf(u, logits), want)
    np.testing.assert_array_equal(icdf(u, moved), want)
    np.testing.assert_array_equal(icdf(u.reshape(2, 3), moved.reshape(2, 3, v)),
                                  want.reshape(2, 3))


def test_torch_inverse_cdf_computes_in_float32():
    """bfloat16 logits are drawn from in float32 (a bf16 CDF over 300 tokens would round
    every partial sum to 8 bits): the tokens of the same logits cast to float32."""
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(2000, 300, generator=g).bfloat16()
    u = torch.rand(2000, generator=g)
    np.testing.assert_array_equal(torch_icdf(u, logp).numpy(),
                                  torch_icdf(u, logp.float()).numpy())


N_DRAWS = 8192


@pytest.fixture(scope="module")
def policy():
    """A tiny Qwen2 with large random weights (far from uniform, ends at varied times),
    and its sampler and teacher-forced log-probs compiled once for (N_DRAWS, 6) prompts."""
    cfg = LMConfig(pretrain_steps=0, init_std=0.4, digits=2)
    model = lm.make_model(cfg, jax.random.key(1))
    graphdef, state = nnx.split(model)

    @jax.jit
    def sample(tokens, mask, key):
        return lm.generate(nnx.merge(graphdef, state), tokens, mask, key, cfg.length)

    @jax.jit
    def logprobs(tokens, mask, completions):
        return lm.completion_logprobs(nnx.merge(graphdef, state), tokens, mask, completions)

    return cfg, model, sample, logprobs


def test_generated_tokens_follow_the_policy(policy):
    """First-token frequencies over 8192 draws of one prompt match the teacher-forced
    probabilities (chi-square); so do second tokens after the most frequent first one."""
    cfg, model, sample, _ = policy
    one = sample_problems(jax.random.key(3), 1, cfg.digits)
    tokens, _ = sample(jnp.repeat(one.tokens, N_DRAWS, 0), jnp.repeat(one.mask, N_DRAWS, 0),
                       jax.random.key(4))
    tokens = np.asarray(tokens)
    logits = model(one.tokens, positions_from_mask(one.mask), one.mask)
    p0 = np.asarray(jax.nn.softmax(logits[0, -1]), np.float64)
    assert p0.max() < 0.9 and (p0 > 0.02).sum() >= 3  # a spread-out distribution
    assert_draws_follow(np.bincount(tokens[:, 0], minlength=len(p0)), p0 / p0.sum())
    counts = np.bincount(tokens[:, 0])
    counts[END] = 0
    first = int(np.argmax(counts))
    ctx = jnp.concatenate([one.tokens, jnp.array([[first]])], axis=1)
    ctx_mask = jnp.concatenate([one.mask, jnp.ones((1, 1), jnp.int32)], axis=1)
    p1 = np.asarray(jax.nn.softmax(model(ctx, positions_from_mask(ctx_mask), ctx_mask)[0, -1]),
                    np.float64)
    rows = tokens[tokens[:, 0] == first]
    assert len(rows) > 500
    assert_draws_follow(np.bincount(rows[:, 1], minlength=len(p1)), p1 / p1.sum())


def test_completions_stop_at_the_end_token_and_cached_logprobs_equal_the_forward(policy):
    """The lab's rule: the mask covers the tokens up to and including the first end token
    (all of them without one); after it the completion is padding with log-prob 0. The
    sampler's log-probs (from the KV cache) equal the teacher-forced ones at every masked
    position."""
    cfg, _, sample, logprobs = policy
    problems = sample_problems(jax.random.key(5), N_DRAWS, cfg.digits)
    tokens, logps = sample(problems.tokens, problems.mask, jax.random.key(6))
    forward = np.asarray(logprobs(problems.tokens, problems.mask, tokens))
    tokens, logps = np.asarray(tokens), np.asarray(logps)
    mask, lengths, ended = (np.asarray(x) for x in completion_mask(jnp.asarray(tokens)))
    assert ended.any() and (~ended).any() and (lengths[ended] < cfg.length).any()
    assert np.asarray(problems.mask).min() == 0  # some prompts are left-padded
    for row, ln, e in zip(tokens[:500], lengths, ended, strict=False):
        if e:
            assert row[ln - 1] == END and END not in row[: ln - 1]
            assert np.all(row[ln:] == PAD)
        else:
            assert ln == cfg.length and END not in row
    assert np.all(logps[mask == 0] == 0)
    np.testing.assert_allclose(logps[mask == 1], forward[mask == 1], rtol=1e-5, atol=1e-5)


def test_jax_and_torch_draw_the_same_tokens_from_the_same_uniforms():
    """Same weights (transformers' initialisation, loaded into the NNX model), same
    uniforms: the two KV-cache samplers draw the same tokens, and each one's log-probs are
    those of the float64 forward of the same weights within ``16 eps max|logit|`` (float32
    eps; measured: up to 8 eps max|logit| in either, through two layers and the head), so
    the two agree within twice that."""
    import copy

    from torchref import lm as tlm
    from torchref.lm_tasks import sample_problems as torch_problems

    torch.set_num_threads(1)
    cfg = LMConfig(pretrain_steps=0, init_std=0.4)
    policy = tlm.make_model(cfg, seed=0)
    model = load_hf_state_dict(lm.make_model(cfg, jax.random.key(0)), policy.flat_state_dict())
    problems = torch_problems(64, 2, torch.Generator().manual_seed(1))
    uniforms = torch.rand((cfg.length, 64), generator=torch.Generator().manual_seed(2))
    t_tokens, t_logps = tlm.generate_from_uniforms(policy, problems.tokens, problems.mask,
                                                   uniforms)
    graphdef, state = nnx.split(model)
    j_tokens, j_logps = jax.jit(lambda s, *a: lm.generate_from_uniforms(nnx.merge(graphdef, s),
                                                                       *a))(
        state, jnp.asarray(problems.tokens.numpy()), jnp.asarray(problems.mask.numpy()),
        jnp.asarray(uniforms.numpy()))
    np.testing.assert_array_equal(np.asarray(j_tokens), t_tokens.numpy())
    exact = copy.deepcopy(policy).double()
    with torch.no_grad():
        truth = tlm.completion_logprobs(exact, problems.tokens, problems.mask, t_tokens)
        logits = exact.logits(tlm.completion_hidden(exact, problems.tokens, problems.mask,
                                                    t_tokens))
    tol = 16 * np.finfo(np.float32).eps * float(logits.abs().max())
    assert tol < 3e-5  # the logits stay moderate: a real check
    live = t_logps.numpy() != 0  # after the end token both are 0
    for logps in (t_logps.numpy(), np.asarray(j_logps)):
        assert np.all(logps[~live] == 0)
        np.testing.assert_allclose(logps[live], truth.numpy()[live], atol=tol)
    np.testing.assert_allclose(np.asarray(j_logps), t_logps.numpy(), atol=2 * tol)
    assert (t_tokens == END).any() and (t_tokens != END).all(dim=1).any()
