"""A Qwen2-architecture decoder in Flax NNX, with a KV cache, that loads ``transformers``
weights.

The architecture of ``transformers.Qwen2ForCausalLM``: a token embedding tied to the
output head, ``num_layers`` pre-norm blocks (RMSNorm -> grouped-query attention with
rotary embeddings and biases on q/k/v -> residual; RMSNorm -> SwiGLU MLP -> residual),
a final RMSNorm. ``load_hf_state_dict`` copies a ``Qwen2ForCausalLM`` state dict in;
``tests`` check the logits against ``transformers`` (within 1e-5 in float32).

One function serves the teacher-forced forward and the cached decode
(``Qwen2.forward``): the new tokens' keys and values are written at slots
``index .. index + T - 1`` of the cache (``lax.dynamic_update_slice``), and each query
attends to the slots at or before its own whose key is valid. Without a cache the new
tokens are the whole sequence. Static shapes throughout, so it runs under ``lax.scan``
(the pattern of the Gemma sampler in flax's examples).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpospec.lm import ModelSizes


class LayerCache(NamedTuple):
    """One layer's keys and values, (B, S, num_kv_heads, head_dim) each."""

    k: jax.Array
    v: jax.Array


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """Position ids of a left-padded batch: ``cumsum(mask) - 1``, 0 at padding (as
    ``transformers``' ``generate``). ``mask`` (B, T), nonzero at real tokens."""
    return jnp.maximum(jnp.cumsum(mask != 0, axis=-1) - 1, 0)


def rope_cos_sin(positions: jax.Array, head_dim: int, theta: float
                 ) -> tuple[jax.Array, jax.Array]:
    """Rotary tables (B, T, head_dim) in float32: angle ``pos * theta^(-2i/d)``, the
    frequencies repeated for both halves (the ``rotate_half`` convention)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """``x * cos + rotate_half(x) * sin`` for x (B, T, heads, head_dim)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]


def _linear(n_in: int, n_out: int, bias: bool, std: float, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(n_in, n_out, use_bias=bias, kernel_init=nnx.initializers.normal(std),
                      bias_init=nnx.initializers.zeros, rngs=rngs)


class Attention(nnx.Module):
    """Grouped-query self-attention with rotary embeddings; biases on q, k, v only."""

    def __init__(self, sizes: ModelSizes, rngs: nnx.Rngs):
        h, d, kv, std = sizes.hidden_size, sizes.head_dim, sizes.num_kv_heads, sizes.init_std
        self.num_heads, self.num_kv_heads, self.head_dim = sizes.num_heads, kv, d
        self.q_proj = _linear(h, sizes.num_heads * d, True, std, rngs)
        self.k_proj = _linear(h, kv * d, True, std, rngs)
        self.v_proj = _linear(h, kv * d, True, std, rngs)
        self.o_proj = _linear(sizes.num_heads * d, h, False, std, rngs)

    def __call__(self, x, shape, cos, sin, visible, cache: LayerCache | None, index):
        """``x`` (B * T, hidden): the tokens flattened, so that every dense layer is one
        2-D matrix product (XLA's CPU backward of 3-D ones is several times slower)."""
        b, t = shape
        d, kv = self.head_dim, self.num_kv_heads
        q = apply_rope(self.q_proj(x).reshape(b, t, self.num_heads, d), cos, sin)
        k = apply_rope(self.k_proj(x).reshape(b, t, kv, d), cos, sin)
        v = self.v_proj(x).reshape(b, t, kv, d)
        if cache is not None:
            k = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), (0, index, 0, 0))
            v = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), (0, index, 0, 0))
            cache = LayerCache(k, v)
        groups = self.num_heads // kv
        q = q.reshape(b, t, kv, groups, d)  # query head h uses key head h // groups
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k).astype(jnp.float32) * d**-0.5
        scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", weights, v).reshape(b * t, self.num_heads * d)
        return self.o_proj(out), cache


class MLP(nnx.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, no biases."""

    def __init__(self, sizes: ModelSizes, rngs: nnx.Rngs):
        h, i, std = sizes.hidden_size, sizes.intermediate_size, sizes.init_std
        self.gate_proj = _linear(h, i, False, std, rngs)
        self.up_proj = _linear(h, i, False, std, rngs)
        self.down_proj = _linear(i, h, False, std, rngs)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    def __init__(self, sizes: ModelSizes, rngs: nnx.Rngs):
        eps = sizes.rms_norm_eps
        self.input_layernorm = nnx.RMSNorm(sizes.hidden_size, epsilon=eps, rngs=rngs)
        self.self_attn = Attention(sizes, rngs)
        self.post_attention_layernorm = nnx.RMSNorm(sizes.hidden_size, epsilon=eps, rngs=rngs)
        self.mlp = MLP(sizes, rngs)

    def __call__(self, x, shape, cos, sin, visible, cache, index):
        attn, cache = self.self_attn(self.input_layernorm(x), shape, cos, sin, visible, cache,
                                     index)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), cache


class Qwen2(nnx.Module):
    """The Qwen2 decoder (``transformers.Qwen2ForCausalLM`` with tied embeddings).

    Initialisation as ``transformers``: linear kernels and the embedding N(0, init_std^2),
    biases 0, norm scales 1. With ``value_head``, a zero-initialised linear layer on the
    final hidden state predicts each position's value (for PPO/GAE).
    """

    def __init__(self, sizes: ModelSizes, value_head: bool = False, *, rngs: nnx.Rngs):
        self.sizes = sizes
        self.embed_tokens = nnx.Embed(sizes.vocab_size, sizes.hidden_size,
                                      embedding_init=nnx.initializers.normal(sizes.init_std),
                                      rngs=rngs)
        self.layers = nnx.List([DecoderLayer(sizes, rngs) for _ in range(sizes.num_layers)])
        self.norm = nnx.RMSNorm(sizes.hidden_size, epsilon=sizes.rms_norm_eps, rngs=rngs)
        self.value_head = (nnx.Linear(sizes.hidden_size, 1, kernel_init=nnx.initializers.zeros,
                                      rngs=rngs) if value_head else None)

    def init_cache(self, batch: int, length: int, dtype=jnp.float32) -> tuple[LayerCache, ...]:
        """An empty KV cache of ``length`` slots for ``batch`` sequences."""
        shape = (batch, length, self.sizes.num_kv_heads, self.sizes.head_dim)
        return tuple(LayerCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))
                     for _ in self.layers)

    def forward(self, tokens: jax.Array, positions: jax.Array, key_valid: jax.Array,
                cache: tuple[LayerCache, ...] | None = None, index: int | jax.Array = 0):
        """Final hidden states (B, T, hidden) of ``tokens`` and the updated cache.

        Args:
          tokens: (B, T) token ids, at cache slots ``index .. index + T - 1`` (0 .. T - 1
            without a cache).
          positions: (B, T) rotary position ids.
          key_valid: (B, S) nonzero at slots holding a real token (S = the cache length,
            or T without a cache); padding is never attended to.
          cache: the layers' caches, or ``None`` (teacher-forced forward).
          index: the first slot of ``tokens`` (static or traced).
        Returns:
          ``(hidden, cache)``: cache ``None`` when none was given.

        A query at slot q sees slot s iff ``s <= q`` and the slot is valid (its own slot
        always, so that a padding row is finite; no real token ever looks at one).
        """
        b, t = tokens.shape
        query_slot = index + jnp.arange(t)
        key_slot = jnp.arange(key_valid.shape[1])
        visible = ((key_slot[None, None, :] <= query_slot[None, :, None])
                   & ((key_valid[:, None, :] != 0)
                      | (key_slot[None, None, :] == query_slot[None, :, None])))
        cos, sin = rope_cos_sin(positions, self.sizes.head_dim, self.sizes.rope_theta)
        x = self.embed_tokens(tokens).reshape(b * t, -1)  # tokens flattened: 2-D products
        new_cache = []
        for i, layer in enumerate(self.layers):
            x, layer_cache = layer(x, (b, t), cos, sin, visible,
                                   None if cache is None else cache[i], index)
            new_cache.append(layer_cache)
        return self.norm(x).reshape(b, t, -1), (None if cache is None else tuple(new_cache))

    def logits(self, hidden: jax.Array) -> jax.Array:
        """The tied head: ``hidden @ embedding.T``."""
        return self.embed_tokens.attend(hidden)

    def values(self, hidden: jax.Array) -> jax.Array:
        """Value predictions (B, T) from final hidden states (needs ``value_head``)."""
        if self.value_head is None:
            raise ValueError("this Qwen2 has no value head (value_head=False)")
        return self.value_head(hidden)[..., 0]

    def __call__(self, tokens: jax.Array, positions: jax.Array | None = None,
                 attention_mask: jax.Array | None = None) -> jax.Array:
        """Teacher-forced logits (B, T, V), as ``Qwen2ForCausalLM(input_ids,
        attention_mask, position_ids).logits`` at the real tokens. Defaults: every token
        real, positions ``0 .. T - 1``."""
        if attention_mask is None:
            attention_mask = jnp.ones(tokens.shape, jnp.int32)
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        hidden, _ = self.forward(tokens, positions, attention_mask)
        return self.logits(hidden)


# --------------------------------------------------------------------------- weights


def _hf_named_params(model: Qwen2) -> dict[str, tuple[nnx.Param, bool]]:
    """``transformers`` name -> (parameter, stored transposed there)."""
    named = {"model.embed_tokens.weight": (model.embed_tokens.embedding, False),
             "model.norm.weight": (model.norm.scale, False)}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        named[p + "input_layernorm.weight"] = (layer.input_layernorm.scale, False)
        named[p + "post_attention_layernorm.weight"] = (layer.post_attention_layernorm.scale,
                                                        False)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            lin = getattr(layer.self_attn, proj)
            named[p + f"self_attn.{proj}.weight"] = (lin.kernel, True)
            if lin.bias is not None:
                named[p + f"self_attn.{proj}.bias"] = (lin.bias, False)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            named[p + f"mlp.{proj}.weight"] = (getattr(layer.mlp, proj).kernel, True)
    if model.value_head is not None:
        named["value_head.weight"] = (model.value_head.kernel, True)
        named["value_head.bias"] = (model.value_head.bias, False)
    return named


def _to_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().float().numpy()
    return np.array(value, dtype=np.float32, copy=True)  # never alias torch's memory


def load_hf_state_dict(model: Qwen2, state_dict: Mapping[str, Any]) -> Qwen2:
    """Copy a ``transformers`` ``Qwen2ForCausalLM`` state dict into ``model`` (in place).

    ``lm_head.weight``, if present, must equal the embedding (tied). Linear weights are
    transposed (torch stores (out, in), ``nnx.Linear`` (in, out)). Returns ``model``.
    """
    expected = _hf_named_params(model)
    state_dict = dict(state_dict)
    head = state_dict.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(state_dict))
    extra = sorted(set(state_dict) - set(expected))
    if missing or extra:
        raise ValueError(f"state_dict does not match this Qwen2: missing {missing}, "
                         f"unexpected {extra}")
    for name, (param, transposed) in expected.items():
        value = _to_numpy(state_dict[name])
        value = value.T if transposed else value
        if value.shape != param.shape:
            raise ValueError(f"state_dict[{name!r}] must have shape "
                             f"{param.shape[::-1] if transposed else param.shape}, "
                             f"got {value.shape[::-1] if transposed else value.shape}")
        param[...] = jnp.asarray(value, param.dtype)
    if head is not None and not np.array_equal(_to_numpy(head),
                                               np.asarray(model.embed_tokens.embedding[...])):
        raise ValueError("state_dict['lm_head.weight'] must equal the embedding: "
                         "this Qwen2's head is tied (tie_word_embeddings=True)")
    return model


def hf_state_dict(model: Qwen2) -> dict[str, Any]:
    """``model``'s weights as a ``Qwen2ForCausalLM`` state dict of torch tensors (with
    ``lm_head.weight`` tied to the embedding)."""
    import torch

    out = {name: torch.from_numpy(np.array(param[...].T if transposed else param[...]))
           for name, (param, transposed) in _hf_named_params(model).items()}
    out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out
