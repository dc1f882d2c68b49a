"""``benchmarks/bench_lm.py``'s accounting of where a seed's compute goes: the dense
products counted by hand, the XLA kernel count on a written-out program, and the timed
pieces on a tiny model (a smoke test: times are not asserted)."""

from __future__ import annotations

import importlib.util
import os
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpospec.lm import LMConfig
from jaxgrpo import lm

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_lm.py"


@pytest.fixture
def bench(monkeypatch):
    # the script sets XLA_FLAGS when it is unset; keep this process's environment as it is
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    spec = importlib.util.spec_from_file_location("bench_lm", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dense_products_of_the_default_model_counted_by_hand(bench):
    """Hidden 32, MLP 64, 4 query heads and 2 key-value heads of 8, 2 layers, vocab 15:
    per layer q 32x32, k and v 32x16, o 32x32, gate and up 32x64, down 64x32; the tied
    head 32x15. 18,912 weights: 37,824 FLOPs a token's forward."""
    shapes = bench.dense_products(lm.make_model(LMConfig(), jax.random.key(0)))
    assert Counter(shapes) == {(32, 32): 4, (32, 16): 4, (32, 64): 4, (64, 32): 2, (32, 15): 1}
    assert 2 * sum(a * b for a, b in shapes) == 37_824
    with_values = bench.dense_products(lm.make_model(LMConfig(estimator="gae"),
                                                     jax.random.key(0)))
    assert Counter(with_values) - Counter(shapes) == {(32, 1): 1}  # the value head


HLO = """HloModule jit_f

%fused_computation (p0: f32[8,8], p1: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main.2 (x.1: f32[8,8], y.1: f32[8,8]) -> (f32[8,8], f32[]) {
  %x.1 = f32[8,8]{1,0} parameter(0), metadata={op_name="x"}
  %y.1 = f32[8,8]{1,0} parameter(1), metadata={op_name="y"}
  %constant.1 = f32[] constant(0)
  %wrapped_sine = f32[8,8]{1,0} fusion(%x.1), kind=kLoop, calls=%wrapped_sine_c
  %ynn_fusion = f32[8,8]{1,0} fusion(%wrapped_sine, %y.1), kind=kCustom, calls=%fused_computation
  %bitcast.3 = f32[64]{0} bitcast(%ynn_fusion)
  %copy.2 = f32[64]{0} copy(%bitcast.3)
  %wrapped_reduce = f32[] fusion(%ynn_fusion, %constant.1), kind=kLoop, calls=%wrapped_reduce_c
  %tuple.4 = (f32[64]{0}, f32[]) tuple(%copy.2, %wrapped_reduce)
  ROOT %get-tuple-element.5 = f32[64]{0} get-tuple-element(%tuple.4), index=0
}
"""


def test_xla_kernels_counts_the_entry_computations_kernels(bench):
    # wrapped_sine, ynn_fusion, copy.2, wrapped_reduce; not the fused computation's dot
    assert bench.xla_kernels(HLO) == 4


def test_looped_body_returns_one_calls_outputs(bench):
    """The loop that times a body repeats it without changing what it computes."""
    x = jax.random.normal(jax.random.key(0), (3, 5, 4))
    w = jax.random.normal(jax.random.key(1), (3, 4, 2))
    dy = jax.random.normal(jax.random.key(2), (3, 5, 2))
    body = bench.products_body(backward=True)
    compiled, init = bench.looped(body, ([(x, w, dy)],), 3)
    out = compiled(([(x, w, dy)],), init)
    assert [o.shape for o in out] == [(3, 5, 2), (3, 5, 4), (3, 4, 2)]
    np.testing.assert_allclose(out[0], x @ w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1], dy @ jnp.swapaxes(w, 1, 2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[2], jnp.swapaxes(x, 1, 2) @ dy, rtol=1e-5, atol=1e-6)
    assert len(bench.products_body(backward=False)([(x, w, dy)])) == 1


def test_update_core_and_products_on_a_tiny_model(bench):
    """A smoke test of the timed pieces (times on a busy machine are not asserted)."""
    cfg = LMConfig(hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2,
                   num_kv_heads=1, n_prompts=2, group_size=2, pretrain_steps=0)
    seconds, kernels, tokens = bench.update_core(cfg, 2, repeats=1)
    assert tokens == 4 * (4 + 8 - 1)  # 4 rows of a 4-token prompt ("a+b=") and 8 - 1 tokens
    shapes = bench.dense_products(lm.make_model(cfg, jax.random.key(0)))
    assert np.isfinite(seconds) and kernels > len(shapes)  # a product per dense layer at least
    for backward in (True, False):
        assert np.isfinite(bench.products_seconds(shapes, tokens, 2, backward, repeats=1))
