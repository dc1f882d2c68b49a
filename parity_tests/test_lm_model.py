"""The Flax NNX Qwen2 against ``transformers``' ``Qwen2ForCausalLM``, and its KV cache
against its own full forward.

Independent truths: ``transformers``' logits (another framework's implementation of the
architecture); the full teacher-forced forward for the cached decode; invariances the
architecture must have whatever the weights (left padding and a shift of all positions
change no real token's logits: padding is masked, rotary attention sees only relative
positions). Tolerance: 1e-5 absolute on logits of magnitude up to about 10, float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from grpospec.lm import ModelSizes
from jaxgrpo.qwen2 import Qwen2, hf_state_dict, load_hf_state_dict, positions_from_mask

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_model():
    """The scale-up's tiny random Qwen2 (GQA: 4 query heads, 2 key/value heads), with
    every weight redrawn so that biases are nonzero and norms are not 1."""
    from scaleup.tiny import tiny_qwen2

    torch.set_num_threads(1)
    model = tiny_qwen2(seed=3)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert float(model.model.layers[0].self_attn.k_proj.bias.detach().abs().min()) > 0
    return model


@pytest.fixture(scope="module")
def jax_model(hf_model):
    sizes = ModelSizes.from_hf_config(hf_model.config)
    assert sizes.rope_theta == 1_000_000.0  # read from transformers' rope_parameters
    return load_hf_state_dict(Qwen2(sizes, rngs=nnx.Rngs(0)), hf_model.state_dict())


def _batch(vocab, b=4, t=12, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (b, t))
    mask = np.ones((b, t), np.int64)
    for i, pad in enumerate([0, 3, 1, 5][:b]):  # left padding of different lengths
        mask[i, :pad] = 0
    positions = np.asarray(positions_from_mask(jnp.asarray(mask)))
    return tokens, mask, positions


def _hf_logits(model, tokens, mask, positions):
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                     position_ids=torch.tensor(positions)).logits.numpy()


def test_logits_equal_transformers_within_1e_5(hf_model, jax_model):
    tokens, mask, positions = _batch(hf_model.config.vocab_size)
    ref = _hf_logits(hf_model, tokens, mask, positions)
    out = np.asarray(jax_model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)))
    real = mask.astype(bool)
    assert np.abs(ref[real]).max() > 1.0  # logits far from 0: a real comparison
    np.testing.assert_allclose(out[real], ref[real], rtol=0, atol=1e-5)
    # without padding the defaults (every token real, positions 0..T-1) agree too
    with torch.no_grad():
        ref_full = hf_model(input_ids=torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(np.asarray(jax_model(jnp.asarray(tokens))), ref_full, atol=1e-5)


def test_weights_round_trip_to_transformers(hf_model, jax_model):
    state = hf_state_dict(jax_model)
    assert set(state) == set(hf_model.state_dict())
    copy = type(hf_model)(hf_model.config).eval()
    copy.load_state_dict(state)
    tokens, mask, positions = _batch(hf_model.config.vocab_size, seed=1)
    np.testing.assert_allclose(_hf_logits(copy, tokens, mask, positions),
                               _hf_logits(hf_model, tokens, mask, positions), atol=0)


def test_padding_and_position_shift_change_no_real_logit(jax_model):
    """Invariances of the architecture itself: masked padding is never attended to, and
    rotary attention depends only on position differences (the final logits too, as
    nothing else in the model sees positions)."""
    vocab = jax_model.sizes.vocab_size
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, vocab, (1, 9)))
    plain = jax_model(tokens)
    padded = jnp.concatenate([jnp.full((1, 4), 7), tokens], axis=1)
    mask = jnp.concatenate([jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 9), jnp.int32)], 1)
    out = jax_model(padded, positions_from_mask(mask), mask)[:, 4:]
    np.testing.assert_allclose(out, plain, atol=1e-5)
    shifted = jax_model(tokens, jnp.arange(9)[None] + 37)
    np.testing.assert_allclose(shifted, plain, atol=1e-4)
    assert float(jnp.max(jnp.abs(shifted - plain))) > 0  # not the same computation


def test_cached_decode_equals_the_full_forward(jax_model):
    """Prefill a prompt into the KV cache, then feed one token at a time (as the sampler
    does, under ``jax.jit``): each step's logits equal the teacher-forced forward's at
    that position, for left-padded rows too."""
    vocab = jax_model.sizes.vocab_size
    tokens, mask, positions = _batch(vocab, t=12, seed=4)
    p = 5
    full = np.asarray(jax_model(jnp.asarray(tokens), jnp.asarray(positions),
                                jnp.asarray(mask)))
    graphdef, state = nnx.split(jax_model)

    @jax.jit
    def decode(state, tokens, mask, positions):
        model = nnx.merge(graphdef, state)
        cache = model.init_cache(tokens.shape[0], tokens.shape[1])
        hidden, cache = model.forward(tokens[:, :p], positions[:, :p], mask, cache, 0)
        steps = [model.logits(hidden)]
        for i in range(p, tokens.shape[1]):
            hidden, cache = model.forward(tokens[:, i:i + 1], positions[:, i:i + 1], mask,
                                          cache, jnp.asarray(i))
            steps.append(model.logits(hidden))
        return jnp.concatenate(steps, axis=1)

    cached = np.asarray(decode(state, jnp.asarray(tokens), jnp.asarray(mask),
                               jnp.asarray(positions)))
    real = mask.astype(bool)
    np.testing.assert_allclose(cached[real], full[real], atol=1e-5)


def test_bad_weights_get_clear_errors(hf_model, jax_model):
    state = dict(hf_model.state_dict())
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        load_hf_state_dict(jax_model, {k: v for k, v in state.items()
                                       if k != "model.norm.weight"})
    bad = dict(state, **{"model.layers.0.self_attn.q_proj.weight": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match=r"q_proj.weight'\] must have shape \(64, 64\)"):
        load_hf_state_dict(jax_model, bad)
    untied = dict(state, **{"lm_head.weight": state["lm_head.weight"] + 1})
    with pytest.raises(ValueError, match="must equal the embedding"):
        load_hf_state_dict(jax_model, untied)
    config = hf_model.config.__class__(**{**hf_model.config.to_dict(),
                                          "tie_word_embeddings": False})
    with pytest.raises(ValueError, match="tie_word_embeddings=True"):
        ModelSizes.from_hf_config(config)
    with pytest.raises(ValueError, match="num_heads .6. must be a multiple of num_kv_heads"):
        ModelSizes(hidden_size=48, num_heads=6, num_kv_heads=4)
