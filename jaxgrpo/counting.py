"""The counting task (SPEC section 4) trained with GRPO as one compiled JAX program.

``make_train(cfg)`` returns ``train(key)``: the whole run is a ``lax.scan`` of
``_update_step`` (sample -> reward -> advantages -> ``inner_epochs`` of ``_update_epoch``)
inside one ``jax.jit``, and ``jax.jit(jax.vmap(train))(keys)`` trains many seeds at once.
The Flax NNX policy and its ``nnx.Optimizer`` are split once into a graph definition and
a state pytree; each scanned step merges them at the top and takes the state at the
bottom (the NNX performance guide's pattern), so the carry is plain arrays.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from grpospec import (
    COMPLETION_LENGTH,
    METRIC_NAMES,
    VOCAB_SIZE,
    CountingConfig,
    check_positive_int,
)
from jaxgrpo.advantages import group_advantages
from jaxgrpo.loss import clip_fraction, grpo_loss, k3_kl, masked_mean


class CounterPolicy(nnx.Module):
    """A tiny autoregressive policy: 8 tokens, 5 per completion.

    ``logits_t = tok_emb[prev_t] + pos_emb[t]``, where ``prev_0`` is the prompt token
    and ``prev_t`` the completion's token ``t - 1``; both tables are ``vocab_size`` wide
    and start as N(0, ``init_std``^2). Same architecture and parameter names as
    ``torchref.CounterPolicy`` (``tok_emb.embedding`` here is ``tok_emb.weight`` there);
    ``load_torch_state_dict`` / ``torch_state_dict`` convert between them.
    """

    def __init__(self, vocab_size: int = VOCAB_SIZE, length: int = COMPLETION_LENGTH,
                 init_std: float = 0.1, *, rngs: nnx.Rngs):
        self.vocab_size, self.length = vocab_size, length
        init = nnx.initializers.normal(init_std)
        self.tok_emb = nnx.Embed(vocab_size, vocab_size, embedding_init=init, rngs=rngs)
        self.pos_emb = nnx.Embed(length, vocab_size, embedding_init=init, rngs=rngs)

    def step_logits(self, prev: jax.Array, t: jax.Array | int) -> jax.Array:
        """Logits (B, V) of position ``t`` given the previous tokens ``prev`` (B,)."""
        return self.tok_emb(prev) + self.pos_emb.embedding[t]

    def __call__(self, prompts: jax.Array, completions: jax.Array) -> jax.Array:
        """Teacher-forced logits (B, L, V) for ``prompts`` (B,) and ``completions`` (B, L)."""
        prev = previous_tokens(prompts, completions)
        return self.tok_emb(prev) + self.pos_emb.embedding[None, : prev.shape[1]]

    def logprob_table(self) -> jax.Array:
        """``log_softmax`` of every logit vector the policy can produce, (L, V, V).

        Entry ``[t, prev, token]`` is ``log pi(token | prev, t)``. The policy has only
        ``L * V`` distinct contexts, so the trainer computes this table once per forward
        and gathers from it: the same numbers as ``selective_log_softmax(self(...))``,
        without a logsumexp per token.
        """
        logits = self.tok_emb.embedding[None, :, :] + self.pos_emb.embedding[:, None, :]
        return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)

    def token_logprobs(self, prompts: jax.Array, completions: jax.Array) -> jax.Array:
        """Per-token log-probs (B, L) of ``completions``, gathered from ``logprob_table``."""
        prev = previous_tokens(prompts, completions)
        positions = jnp.arange(completions.shape[1])[None, :]
        return self.logprob_table()[positions, prev, completions]


def load_torch_state_dict(model: CounterPolicy, state_dict: Mapping[str, Any]) -> CounterPolicy:
    """Copy a ``torchref.CounterPolicy`` state dict into ``model`` (in place); returns it."""
    expected = {"tok_emb.weight": model.tok_emb.embedding,
                "pos_emb.weight": model.pos_emb.embedding}
    if set(state_dict) != set(expected):
        raise ValueError(f"state_dict must have keys {sorted(expected)}, got {sorted(state_dict)}")
    for name, param in expected.items():
        value = state_dict[name]
        value = value.detach().cpu().numpy() if hasattr(value, "detach") else value
        value = np.array(value, copy=True)  # never alias torch's memory (CPU zero-copy)
        if value.shape != param.shape:
            raise ValueError(
                f"state_dict[{name!r}] must have shape {param.shape}, got {value.shape}")
        param[...] = jnp.asarray(value, param.dtype)
    return model


def torch_state_dict(model: CounterPolicy) -> dict[str, Any]:
    """``model``'s weights as a ``torchref.CounterPolicy`` state dict of torch tensors."""
    import torch

    return {
        "tok_emb.weight": torch.from_numpy(np.array(model.tok_emb.embedding[...])),
        "pos_emb.weight": torch.from_numpy(np.array(model.pos_emb.embedding[...])),
    }


def previous_tokens(prompts: jax.Array, completions: jax.Array) -> jax.Array:
    """The context token of each position (B, L): the prompt, then the completion shifted."""
    return jnp.concatenate([prompts[:, None], completions[:, :-1]], axis=1)


def gather_context(table: jax.Array, prompts: jax.Array, completions: jax.Array) -> jax.Array:
    """``table[t, prev_t]`` for every position of every completion: (B, L, ...)."""
    return table[jnp.arange(completions.shape[1])[None, :], previous_tokens(prompts, completions)]


def counting_reward(prompts: jax.Array, completions: jax.Array) -> jax.Array:
    """Fraction of positions i with ``completion[i] == (p + i + 1) mod 8``, shape (B,)."""
    steps = jnp.arange(1, completions.shape[1] + 1)
    target = (prompts[:, None] + steps[None]) % VOCAB_SIZE
    return jnp.mean(completions == target, axis=1, dtype=jnp.float32)


def token_entropy(logits: jax.Array) -> jax.Array:
    """Entropy of softmax(logits) over the last axis, in float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def sample_completions(model: CounterPolicy, prompts: jax.Array, key: jax.Array
                       ) -> tuple[jax.Array, jax.Array]:
    """Sample completions token by token with ``jax.random.categorical`` in ``lax.scan``.

    Args:
      model: the policy.
      prompts: (B,) prompt tokens.
      key: PRNG key.
    Returns:
      ``(tokens, logprobs)``, both (B, L): the sampled tokens and their log-probs.
    """

    table = model.logprob_table()  # (L, V, V) log-probs: valid logits for categorical

    def _sample_token(prev, inputs):
        t, k = inputs
        logp = table[t, prev]  # (B, V)
        token = jax.random.categorical(k, logp)
        return token, (token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0])

    keys = jax.random.split(key, model.length)
    _, (tokens, logps) = jax.lax.scan(_sample_token, prompts, (jnp.arange(model.length), keys))
    return tokens.T, logps.T


def grpo_update(model: CounterPolicy, optimizer: nnx.Optimizer, ref_model: CounterPolicy,
                prompts: jax.Array, completions: jax.Array, cfg: CountingConfig
                ) -> dict[str, jax.Array]:
    """One GRPO step on given rollouts, updating ``model``/``optimizer`` in place.

    Reward, group advantages, then ``cfg.inner_epochs`` full-batch optimizer steps
    (``_update_epoch`` under ``lax.scan``). ``prompts`` (B*G,) and ``completions``
    (B*G, L) are laid out group by group. Returns the metrics of ``grpospec.METRIC_NAMES``;
    clip fraction, KL, entropy and loss are those of the last inner epoch, before its
    update. Same computation as ``torchref.grpo_update``.
    """
    rewards = counting_reward(prompts, completions)
    grouped = rewards.reshape(-1, cfg.group_size)
    adv = group_advantages(grouped, std_norm=cfg.std_norm).reshape(-1)
    mask = jnp.ones(completions.shape, jnp.float32)
    logp_old = jax.lax.stop_gradient(model.token_logprobs(prompts, completions))
    logp_ref = jax.lax.stop_gradient(ref_model.token_logprobs(prompts, completions))

    def loss_fn(model):
        logits = model.logprob_table()
        logp_new = model.token_logprobs(prompts, completions)
        loss = grpo_loss(logp_new, logp_old, logp_ref, adv, mask, cfg.clip_eps, cfg.beta,
                         cfg.agg, cfg.clip_eps_high)
        return loss, (logits, logp_new)

    graphdef, state = nnx.split((model, optimizer))

    def _update_epoch(state, _):
        model, optimizer = nnx.merge(graphdef, state)
        (loss, (logits, logp_new)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), (loss, logits, logp_new)

    state, (losses, logits, logp_new) = jax.lax.scan(
        _update_epoch, state, None, length=cfg.inner_epochs)
    nnx.update((model, optimizer), state)
    logits, logp_new = logits[-1], logp_new[-1]
    return {
        "mean_reward": jnp.mean(rewards),
        "zero_var_frac": jnp.mean(jnp.max(grouped, 1) == jnp.min(grouped, 1), dtype=jnp.float32),
        "clip_frac": clip_fraction(logp_new, logp_old, mask, cfg.clip_eps, cfg.clip_eps_high),
        "kl": masked_mean(k3_kl(logp_new, logp_ref), mask),
        "entropy": masked_mean(gather_context(token_entropy(logits), prompts, completions), mask),
        "loss": losses[-1],
    }


class RunnerState(NamedTuple):
    """The ``lax.scan`` carry of a training run."""

    state: nnx.State  # (policy, optimizer), as split by nnx
    key: jax.Array


def make_train(cfg: CountingConfig):
    """Returns ``train(key) -> (final (policy, optimizer) state, metrics)``.

    ``metrics`` maps each of ``grpospec.METRIC_NAMES`` to an array of shape (steps,).
    ``train`` is pure: jit it, vmap it over keys for many seeds.
    """

    def train(key: jax.Array):
        key_init, key_run = jax.random.split(key)
        model = CounterPolicy(rngs=nnx.Rngs(params=key_init))
        optimizer = nnx.Optimizer(model, optax.adam(cfg.learning_rate), wrt=nnx.Param)
        model_def, ref_params = nnx.split(model)  # the frozen reference: initial weights
        graphdef, state = nnx.split((model, optimizer))

        def _update_step(runner: RunnerState, _):
            model, optimizer = nnx.merge(graphdef, runner.state)
            ref_model = nnx.merge(model_def, ref_params)
            key, k_prompt, k_sample = jax.random.split(runner.key, 3)
            prompts = jax.random.randint(k_prompt, (cfg.n_prompts,), 0, VOCAB_SIZE)
            prompts = jnp.repeat(prompts, cfg.group_size)
            completions, _ = sample_completions(model, prompts, k_sample)
            metrics = grpo_update(model, optimizer, ref_model, prompts, completions, cfg)
            return RunnerState(nnx.state((model, optimizer)), key), metrics

        runner, metrics = jax.lax.scan(
            _update_step, RunnerState(state, key_run), None, length=cfg.steps)
        return runner.state, metrics

    return train


@functools.lru_cache(maxsize=32)
def _compiled_train(cfg: CountingConfig, vmapped: bool):
    train = make_train(cfg)
    return jax.jit(jax.vmap(train) if vmapped else train)


def train_counting(seed: int = 0, steps: int = 80, *, seeds: int | Sequence[int] | None = None,
                   **overrides) -> dict[str, np.ndarray]:
    """Train ``CounterPolicy`` with GRPO on the counting task (SPEC section 4).

    Args:
      seed: the run's seed (ignored when ``seeds`` is given).
      steps: GRPO steps.
      seeds: train many independent runs at once (``vmap``): a count ``S`` (seeds
        ``seed .. seed + S - 1``) or a sequence of seeds.
      **overrides: any other field of ``grpospec.CountingConfig``.
    Returns:
      ``{metric: array}`` for each of ``grpospec.METRIC_NAMES``, shape (steps,), or
      (n_seeds, steps) with ``seeds``; ``mean_reward`` is taken before each update.
    """
    cfg = CountingConfig(steps=steps, **overrides)
    if seeds is None:
        _, metrics = _compiled_train(cfg, False)(jax.random.key(int(seed)))
    else:
        seed_list = seeds_to_list(seed, seeds)
        keys = jax.vmap(jax.random.key)(jnp.asarray(seed_list, jnp.uint32))
        _, metrics = _compiled_train(cfg, True)(keys)
    return {k: np.asarray(metrics[k]) for k in METRIC_NAMES}


def seeds_to_list(seed: int, seeds: int | Sequence[int]) -> list[int]:
    """A count ``S`` -> ``[seed, ..., seed + S - 1]``; a sequence -> itself, checked."""
    if isinstance(seeds, Sequence) and not isinstance(seeds, str):
        if len(seeds) == 0:
            raise ValueError("seeds must hold at least one seed, got an empty sequence")
        return [int(s) for s in seeds]
    count = check_positive_int("seeds", seeds)
    return list(range(int(seed), int(seed) + count))
