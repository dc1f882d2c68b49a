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


def _redraw(model, seed: int):
    """Every weight of a transformers model redrawn (in place), so that biases are nonzero
    and norms are not 1: norm scales U(0.5, 1.5), the rest N(0, 0.15^2)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(0.5 + torch.rand(p.shape, generator=gen) if "norm" in name
                    else 0.15 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def hf_model():
    """The scale-up's tiny random Qwen2 (GQA: 4 query heads, 2 key/value heads), every
    weight redrawn (``_redraw``)."""
    from scaleup.tiny import tiny_qwen2

    torch.set_num_threads(1)
    model = _redraw(tiny_qwen2(seed=3), seed=0)
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
    # shapes in torch's (out, in) order, on a matrix that is not square
    bad = dict(state, **{"model.layers.0.mlp.up_proj.weight": torch.zeros(3, 5)})
    with pytest.raises(ValueError, match=r"up_proj.weight'\] must have shape \(128, 64\), "
                                         r"got \(3, 5\)$"):
        load_hf_state_dict(jax_model, bad)
    # and on one stored as is (not transposed)
    bad = dict(state, **{"model.embed_tokens.weight": torch.zeros(3, 5)})
    vocab = hf_model.config.vocab_size
    with pytest.raises(ValueError, match=rf"embed_tokens.weight'\] must have shape \({vocab}, "
                                         r"64\), got \(3, 5\)$"):
        load_hf_state_dict(jax_model, bad)
    with pytest.raises(ValueError, match=r"missing \[\], unexpected \['model.extra'\]"):
        load_hf_state_dict(jax_model, dict(state, **{"model.extra": torch.zeros(1)}))
    untied = dict(state, **{"lm_head.weight": state["lm_head.weight"] + 1})
    with pytest.raises(ValueError, match=r"^state_dict\['lm_head.weight'\] must equal the "
                                         r"embedding: this Qwen2's head is tied "
                                         r"\(tie_word_embeddings=True\)$"):
        load_hf_state_dict(jax_model, untied)
    config = hf_model.config.__class__(**{**hf_model.config.to_dict(),
                                          "tie_word_embeddings": False})
    with pytest.raises(ValueError, match="tie_word_embeddings=True"):
        ModelSizes.from_hf_config(config)
    with pytest.raises(ValueError, match="num_heads .6. must be a multiple of num_kv_heads"):
        ModelSizes(hidden_size=48, num_heads=6, num_kv_heads=4)


def test_positions_count_real_tokens_from_zero():
    mask = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    np.testing.assert_array_equal(positions_from_mask(mask),
                                  [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]])


def test_logits_equal_transformers_with_other_norm_epsilon_and_rope_base():
    """A decoder whose RMSNorm epsilon (0.05) and rotary base (100) are far from the
    defaults, built from ``ModelSizes.hf_config_kwargs`` on both sides: the NNX layers take
    both from the sizes, as transformers does from its config."""
    sizes = ModelSizes(hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2,
                       rms_norm_eps=0.05, rope_theta=100.0)
    torch.manual_seed(0)
    hf = _redraw(transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(**sizes.hf_config_kwargs())), seed=1).eval()
    model = load_hf_state_dict(Qwen2(sizes, rngs=nnx.Rngs(0)), hf.state_dict())
    tokens, mask, positions = _batch(sizes.vocab_size, seed=5)
    ref = _hf_logits(hf, tokens, mask, positions)
    out = np.asarray(model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)))
    real = mask.astype(bool)
    np.testing.assert_allclose(out[real], ref[real], rtol=0, atol=1e-5)
    # the epsilon matters at these sizes: with transformers' default the logits move
    default = load_hf_state_dict(Qwen2(ModelSizes(hidden_size=32, intermediate_size=48,
                                                  num_heads=4, num_kv_heads=2,
                                                  rope_theta=100.0), rngs=nnx.Rngs(0)),
                                 hf.state_dict())
    moved = np.asarray(default(jnp.asarray(tokens), jnp.asarray(positions),
                               jnp.asarray(mask)))
    assert np.abs(moved[real] - ref[real]).max() > 1e-3


def test_parameters_are_exactly_transformers(hf_model, jax_model):
    """The same parameters as ``Qwen2ForCausalLM`` (the tied head once): no bias where
    Qwen2 has none (o_proj, the MLP), nothing left at its initial value by the loader."""
    ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(jax_model, nnx.Param)))
    assert ours == sum(p.numel() for p in hf_model.parameters())
    layer = jax_model.layers[0]
    assert layer.self_attn.o_proj.bias is None
    assert all(getattr(layer.mlp, n).bias is None for n in ("gate_proj", "up_proj",
                                                            "down_proj"))


def test_initialisation_is_transformers():
    """Kernels and the embedding N(0, init_std^2), q/k/v biases 0, norm scales 1, and a
    value head that predicts 0 until trained (PPO's zero-initialised critic)."""
    sizes = ModelSizes(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
                       init_std=0.05)
    model = Qwen2(sizes, value_head=True, rngs=nnx.Rngs(3))
    layer = model.layers[0]
    drawn = [model.embed_tokens.embedding, layer.self_attn.q_proj.kernel,
             layer.self_attn.k_proj.kernel, layer.mlp.down_proj.kernel]
    for p in drawn:
        x = np.asarray(p[...])
        assert abs(x.mean()) < 0.01 and abs(x.std() / 0.05 - 1) < 0.15, (p.shape, x.std())
    for p in (layer.self_attn.q_proj.bias, layer.self_attn.v_proj.bias,
              model.value_head.kernel, model.value_head.bias):
        assert not np.asarray(p[...]).any()
    for norm in (layer.input_layernorm, layer.post_attention_layernorm, model.norm):
        np.testing.assert_array_equal(norm.scale[...], 1.0)
    hidden, cache = model.forward(jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 3), jnp.int32),
                                  jnp.ones((2, 3)))
    assert cache is None  # no cache in, none out
    np.testing.assert_array_equal(model.values(hidden), np.zeros((2, 3)))


def test_value_head_reads_the_final_hidden_state_and_round_trips():
    """``values`` = the head's kernel and bias on each position's final hidden state; its
    weights leave and come back as a torch ``nn.Linear(hidden, 1)`` stores them."""
    sizes = ModelSizes()
    model = Qwen2(sizes, value_head=True, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    model.value_head.kernel[...] = jnp.asarray(rng.normal(size=(32, 1)), jnp.float32)
    model.value_head.bias[...] = jnp.asarray([0.25], jnp.float32)
    hidden = jnp.asarray(rng.normal(size=(2, 3, 32)), jnp.float32)
    want = np.asarray(hidden) @ np.asarray(model.value_head.kernel[...])[:, 0] + 0.25
    np.testing.assert_allclose(model.values(hidden), want, rtol=1e-5)
    state = hf_state_dict(model)
    assert state["value_head.weight"].shape == (1, 32) and state["value_head.bias"].shape == (1,)
    again = load_hf_state_dict(Qwen2(sizes, value_head=True, rngs=nnx.Rngs(1)), state)
    np.testing.assert_array_equal(again.values(hidden), model.values(hidden))
    with pytest.raises(ValueError, match=r"^this Qwen2 has no value head \(value_head=False\)$"):
        Qwen2(sizes, rngs=nnx.Rngs(0)).values(hidden)


def test_a_bfloat16_cache_holds_the_decode():
    """``init_cache(dtype=bfloat16)`` makes bf16 keys and values, and the cached decode
    writes into it (cast), within bf16 rounding of the float32 cache's logits."""
    model = Qwen2(ModelSizes(init_std=0.3), rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 15, (2, 6)))
    mask = jnp.ones((2, 6), jnp.int32)
    positions = positions_from_mask(mask)
    out = {}
    for dtype in (jnp.float32, jnp.bfloat16):
        cache = model.init_cache(2, 6, dtype)
        assert all(c.k.dtype == dtype and c.v.dtype == dtype for c in cache)
        hidden, cache = model.forward(tokens[:, :4], positions[:, :4], mask, cache, 0)
        hidden, cache = model.forward(tokens[:, 4:], positions[:, 4:], mask, cache, 4)
        assert all(c.k.dtype == dtype and c.v.dtype == dtype for c in cache)
        out[dtype] = np.asarray(model.logits(hidden))
    np.testing.assert_allclose(out[jnp.bfloat16], out[jnp.float32], atol=0.05)
    assert np.abs(out[jnp.float32]).max() > 0.5


def test_loading_copies_and_reads_any_torch_float(hf_model):
    """The loader copies (a later in-place change of the torch tensors changes nothing in
    the NNX model), reads bfloat16 tensors and tensors that require a gradient, and needs
    no ``lm_head.weight`` (the head is the embedding)."""
    state = {k: v.clone() for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}
    sizes = ModelSizes.from_hf_config(hf_model.config)
    model = load_hf_state_dict(Qwen2(sizes, rngs=nnx.Rngs(0)), state)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, sizes.vocab_size, (2, 5)))
    before = np.asarray(model(tokens))
    with torch.no_grad():
        for v in state.values():
            v.add_(1.0)
    np.testing.assert_array_equal(np.asarray(model(tokens)), before)
    odd = {k: (v.bfloat16() if "mlp" in k else v.clone().requires_grad_(True))
           for k, v in hf_model.state_dict().items()}
    loaded = load_hf_state_dict(Qwen2(sizes, rngs=nnx.Rngs(0)), odd)
    w = "model.layers.0.mlp.up_proj.weight"
    np.testing.assert_array_equal(np.asarray(loaded.layers[0].mlp.up_proj.kernel[...]),
                                  odd[w].float().numpy().T)
