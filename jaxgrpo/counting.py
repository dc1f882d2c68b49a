"""The counting task (SPEC section 4) trained with GRPO as one compiled JAX program.

``make_train(cfg)`` returns ``train(key)``: the whole run is a ``lax.scan`` of
``_update_step`` (sample -> reward -> advantages -> ``inner_epochs`` of ``_update_epoch``)
inside one ``jax.jit``, and ``jax.jit(jax.vmap(train))(keys)`` trains many seeds at once.
The Flax NNX policy and its ``nnx.Optimizer`` are split once into a graph definition and
a state pytree; each scanned step merges them at the top and takes the state at the
bottom (the NNX performance guide's pattern), so the carry is plain arrays.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from grpospec import (
    COMPLETION_LENGTH,
    END_TOKEN,
    VOCAB_SIZE,
    CountingConfig,
    check_positive_int,
)
from jaxgrpo.advantages import estimator_advantages, overlong_penalty
from jaxgrpo.loss import clip_metrics, grpo_loss, kl_estimate, masked_mean, value_loss
from jaxgrpo.sampling import icdf_from_cdf


class CounterPolicy(nnx.Module):
    """A tiny autoregressive policy: ``vocab_size`` tokens, ``length`` per completion.

    ``logits_t = tok_emb[prev_t] + pos_emb[t]``, where ``prev_0`` is the prompt token
    and ``prev_t`` the completion's token ``t - 1``; both tables are ``vocab_size`` wide
    and start as N(0, ``init_std``^2). With ``value_head``, a zero-initialised table
    ``value[t, prev_t]`` predicts the value of each position's state (for PPO/GAE). Same
    architecture and parameter names as ``torchref.CounterPolicy`` (``tok_emb.embedding``
    here is ``tok_emb.weight`` there); ``load_torch_state_dict`` / ``torch_state_dict``
    convert between them.
    """

    def __init__(self, vocab_size: int = VOCAB_SIZE, length: int = COMPLETION_LENGTH,
                 init_std: float = 0.1, value_head: bool = False, *, rngs: nnx.Rngs):
        self.vocab_size, self.length = vocab_size, length
        init = nnx.initializers.normal(init_std)
        self.tok_emb = nnx.Embed(vocab_size, vocab_size, embedding_init=init, rngs=rngs)
        self.pos_emb = nnx.Embed(length, vocab_size, embedding_init=init, rngs=rngs)
        self.value = nnx.Param(jnp.zeros((length, vocab_size))) if value_head else None

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

    def values(self, prompts: jax.Array, completions: jax.Array) -> jax.Array:
        """Value predictions (B, L) of each position's state (needs ``value_head``)."""
        if self.value is None:
            raise ValueError("this CounterPolicy has no value head (value_head=False)")
        prev = previous_tokens(prompts, completions)
        return self.value[...][jnp.arange(completions.shape[1])[None, :], prev]

    def token_logprobs(self, prompts: jax.Array, completions: jax.Array) -> jax.Array:
        """Per-token log-probs (B, L) of ``completions``, gathered from ``logprob_table``."""
        prev = previous_tokens(prompts, completions)
        positions = jnp.arange(completions.shape[1])[None, :]
        return self.logprob_table()[positions, prev, completions]


def _torch_named_params(model: CounterPolicy) -> dict[str, nnx.Param]:
    named = {"tok_emb.weight": model.tok_emb.embedding, "pos_emb.weight": model.pos_emb.embedding}
    if model.value is not None:
        named["value"] = model.value
    return named


def load_torch_state_dict(model: CounterPolicy, state_dict: Mapping[str, Any]) -> CounterPolicy:
    """Copy a ``torchref.CounterPolicy`` state dict into ``model`` (in place); returns it."""
    expected = _torch_named_params(model)
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

    return {name: torch.from_numpy(np.array(param[...]))
            for name, param in _torch_named_params(model).items()}


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


def task_reward(task: str, prompts: jax.Array, completions: jax.Array
                ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Reward, response mask, correctness and length of each completion.

    * ``"counting"``: the fraction of correct positions (SPEC section 4); every token counts.
    * ``"sparse"``: 1 only when every position is correct, else 0.
    * ``"variable"``: the vocabulary adds an end token (8). A completion is an answer
      token, then any number of free "reasoning" tokens, then the end token; the mask
      covers the tokens up to and including the first end token (all of them if it never
      comes: truncated). It is correct (reward 1) iff the answer is ``(p + 1) mod 8`` and
      the end token comes later within the length limit. So right and wrong answers can
      each be short or long: their lengths move only through how the update weighs
      tokens, which is what the ``length-bias`` experiment measures.

    ``task`` is static. Same rules as ``torchref.task_reward``.

    Returns:
      ``(rewards (B,) float32, mask (B, L) float32, correct (B,) bool, lengths (B,))``.
    """
    n, length = completions.shape
    if task == "variable":
        is_end = completions == END_TOKEN
        ended = jnp.any(is_end, axis=1)
        end_idx = jnp.where(ended, jnp.argmax(is_end, axis=1), length - 1)
        mask = (jnp.arange(length)[None, :] <= end_idx[:, None]).astype(jnp.float32)
        correct = (completions[:, 0] == (prompts + 1) % VOCAB_SIZE) & ended & (end_idx >= 1)
        return correct.astype(jnp.float32), mask, correct, end_idx + 1
    per_position = counting_reward(prompts, completions)
    correct = per_position == 1.0
    rewards = per_position if task == "counting" else correct.astype(jnp.float32)
    return rewards, jnp.ones((n, length), jnp.float32), correct, jnp.full((n,), length)


def training_signal(cfg: CountingConfig, prompts: jax.Array, completions: jax.Array
                    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """What the update trains on: ``(rewards, response mask, loss mask, correct,
    lengths)``. The task's reward plus DAPO's overlong penalty (``cfg.overlong_buffer``);
    the loss mask is the response mask without the truncated completions (no end token)
    when ``cfg.mask_truncated`` (TRL's ``mask_truncated_completions``)."""
    rewards, mask, correct, lengths = task_reward(cfg.task, prompts, completions)
    ended = jnp.any(completions == END_TOKEN, axis=1)
    rewards, loss_mask = shape_signal(cfg, rewards, mask, lengths, ended)
    return rewards, mask, loss_mask, correct, lengths


def shape_signal(cfg, rewards: jax.Array, mask: jax.Array, lengths: jax.Array,
                 ended: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(rewards, loss mask)``: the task's rewards (N,) plus DAPO's overlong penalty
    when ``cfg.overlong_buffer`` is set (``max_len = cfg.length``); the response mask
    (N, L) without the rows that did not ``end`` (N,) when ``cfg.mask_truncated``. Shared
    by the counting and the language-model trainers (``jaxgrpo.lm.training_signal``)."""
    if cfg.overlong_buffer is not None:
        rewards = rewards + overlong_penalty(lengths, cfg.length, cfg.overlong_buffer,
                                             cfg.overlong_penalty)
    loss_mask = mask * ended[:, None] if cfg.mask_truncated else mask
    return rewards, loss_mask


def select_groups(grouped_rewards: jax.Array, n_keep: int) -> jax.Array:
    """Dynamic sampling's choice: indices (n_keep,) of the groups to train on.

    Groups whose rewards vary come first, in sampling order; zero-variance groups fill
    the remaining places only when too few vary (a stable sort on "has zero variance"),
    so the batch keeps its static shape.
    """
    zero_var = jnp.max(grouped_rewards, axis=1) == jnp.min(grouped_rewards, axis=1)
    return jnp.argsort(zero_var.astype(jnp.int32), stable=True)[:n_keep]


def token_entropy(logits: jax.Array) -> jax.Array:
    """Entropy of softmax(logits) over the last axis, in float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def sample_completions(model: CounterPolicy, prompts: jax.Array, key: jax.Array
                       ) -> tuple[jax.Array, jax.Array]:
    """Sample completions token by token in ``lax.scan``, by the inverse CDF: one uniform
    per token (all drawn at once), compared with a row of the policy's CDF table (the
    cumulative ``exp(logprob_table())``, computed once; ``jaxgrpo.sampling``). The same
    distribution as ``jax.random.categorical``, which draws V Gumbel numbers per token.

    Args:
      model: the policy.
      prompts: (B,) prompt tokens.
      key: PRNG key.
    Returns:
      ``(tokens, logprobs)``, both (B, L): the sampled tokens and their log-probs.
    """

    table = model.logprob_table()  # (L, V, V) log-probs, one row per context
    cdf = jnp.cumsum(jnp.exp(table), axis=-1)
    uniforms = jax.random.uniform(key, (model.length, prompts.shape[0]))

    def _sample_token(prev, inputs):
        t, u = inputs
        token = icdf_from_cdf(u, cdf[t, prev]).astype(prev.dtype)
        return token, token

    _, tokens = jax.lax.scan(_sample_token, prompts, (jnp.arange(model.length), uniforms),
                             unroll=True)
    tokens = tokens.T
    logps = jnp.take_along_axis(gather_context(table, prompts, tokens), tokens[..., None],
                                axis=-1)[..., 0]
    return tokens, logps


def _advantages(cfg: CountingConfig, policy: CounterPolicy, prompts, completions, rewards,
                mask, lengths):
    """Advantages (per sequence, or per token for GAE) and the value targets (or None)."""
    values = policy.values(prompts, completions) if cfg.estimator == "gae" else None
    return estimator_advantages(cfg.estimator, rewards, cfg.group_size, mask, lengths, values,
                                cfg.gamma, cfg.lam, cfg.scale_rewards)


def grpo_update(model: CounterPolicy, optimizer: nnx.Optimizer, ref_model: CounterPolicy,
                prompts: jax.Array, completions: jax.Array, cfg: CountingConfig
                ) -> dict[str, jax.Array]:
    """One GRPO step on given rollouts, updating ``model``/``optimizer`` in place.

    Reward, advantages, then ``cfg.inner_epochs`` full-batch optimizer steps
    (``_update_epoch`` under ``lax.scan``). ``prompts`` (B*G,) and ``completions``
    (B*G, L) are laid out group by group. Returns the update's metrics: ``loss``, the
    ``clip_ratio/*`` shares (``clip_metrics``), ``kl`` and ``entropy`` of the last inner
    epoch, before its update.
    Same computation as ``torchref.grpo_update``.
    """
    rewards, _, mask, _, lengths = training_signal(cfg, prompts, completions)
    adv, returns = _advantages(cfg, model, prompts, completions, rewards, mask, lengths)
    logp_old = jax.lax.stop_gradient(model.token_logprobs(prompts, completions))
    logp_ref = jax.lax.stop_gradient(ref_model.token_logprobs(prompts, completions))

    def loss_fn(model):
        table = model.logprob_table()
        logp_new = gather_context(table, prompts, completions)
        logp_new = jnp.take_along_axis(logp_new, completions[..., None], axis=-1)[..., 0]
        entropy = (gather_context(token_entropy(table), prompts, completions)
                   if cfg.needs_entropy else None)
        loss = grpo_loss(logp_new, logp_old, logp_ref, adv, mask, entropy=entropy,
                         **cfg.loss_options())
        if returns is not None:
            loss = loss + cfg.vf_coef * value_loss(model.values(prompts, completions),
                                                   returns, mask)
        return loss, (table, logp_new)

    graphdef, state = nnx.split((model, optimizer))

    def _update_epoch(state, _):
        model, optimizer = nnx.merge(graphdef, state)
        (loss, (table, logp_new)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), (loss, table, logp_new)

    state, (losses, table, logp_new) = jax.lax.scan(
        _update_epoch, state, None, length=cfg.inner_epochs, unroll=True)
    nnx.update((model, optimizer), state)
    table, logp_new = table[-1], logp_new[-1]
    entropy = gather_context(token_entropy(table), prompts, completions)
    return {
        **clip_metrics(logp_new, logp_old, adv, mask, cfg.clip_eps, cfg.clip_eps_high,
                       cfg.importance_level, cfg.dual_clip),
        "kl": masked_mean(kl_estimate(logp_new, logp_ref, cfg.kl_estimator), mask),
        "entropy": masked_mean(entropy, mask),
        "loss": losses[-1],
    }


def rollout_metrics(cfg: CountingConfig, prompts: jax.Array, completions: jax.Array,
                    kept: jax.Array) -> dict[str, jax.Array]:
    """Metrics of a step's sampled pool and of the groups ``kept`` for training."""
    rewards, mask, _, correct, lengths = training_signal(cfg, prompts, completions)
    return rollout_stats(rewards, mask, correct, lengths, cfg.group_size,
                         kept if cfg.dynamic_sampling else None)


def rollout_stats(rewards: jax.Array, mask: jax.Array, correct: jax.Array, lengths: jax.Array,
                  group_size: int, kept: jax.Array | None) -> dict[str, jax.Array]:
    """Metrics of a sampled pool (rewards (N,), mask (N, T), correct (N,), lengths (N,),
    laid out group by group), for any task; with dynamic sampling, ``kept`` holds the
    groups chosen for training and the ``ds_*`` metrics are added (``None``: without)."""
    grouped = rewards.reshape(-1, group_size)
    zero_var = jnp.max(grouped, axis=1) == jnp.min(grouped, axis=1)
    lengths, c = lengths.astype(jnp.float32), correct.astype(jnp.float32)
    n_c = jnp.sum(c)
    metrics = {
        "mean_reward": jnp.mean(rewards),
        "frac_reward_zero_std": jnp.mean(zero_var, dtype=jnp.float32),
        "correct_frac": jnp.mean(c),
        "mean_length": jnp.mean(lengths),
        "len_correct": jnp.where(n_c > 0, jnp.sum(lengths * c) / jnp.maximum(n_c, 1), jnp.nan),
        "len_incorrect": jnp.where(n_c < c.size, jnp.sum(lengths * (1 - c))
                                   / jnp.maximum(c.size - n_c, 1), jnp.nan),
        "sampled_tokens": jnp.sum(mask),
    }
    if kept is not None:
        filled = jnp.sum(zero_var[kept])  # zero-variance groups that had to fill the batch
        metrics["ds_dropped"] = (jnp.sum(zero_var) - filled).astype(jnp.float32)
        metrics["ds_filled"] = filled.astype(jnp.float32)
    return metrics


def group_rows(kept: jax.Array, group_size: int) -> jax.Array:
    """The rows (len(kept) * group_size,) of the groups ``kept``, in order."""
    return (kept[:, None] * group_size + jnp.arange(group_size)).reshape(-1)


class RunnerState(NamedTuple):
    """The ``lax.scan`` carry of a training run."""

    state: nnx.State  # (policy, optimizer), as split by nnx
    ref: nnx.State  # the frozen reference policy: the initial weights
    key: jax.Array


_PROGRESS_LISTENERS: list = []


def _report_steps_done(done) -> None:
    """Host side of the in-program progress report (``jax.debug.callback``)."""
    for listener in list(_PROGRESS_LISTENERS):
        listener(int(done))


def report_progress(done: jax.Array, every: int, steps: int) -> None:
    """Inside a compiled run: report ``done`` steps to the host every ``every`` steps and
    at the last one (a ``jax.debug.callback`` under ``lax.cond``)."""
    jax.lax.cond((done % every == 0) | (done == steps),
                 lambda: jax.debug.callback(_report_steps_done, done), lambda: None)


@contextlib.contextmanager
def progress_listener(fn):
    """Call ``fn(steps_done)`` whenever a running compiled program reports progress
    (``make_train(..., progress_every=k)`` reports every k steps from inside the scan)."""
    _PROGRESS_LISTENERS.append(fn)
    try:
        yield
    finally:
        _PROGRESS_LISTENERS.remove(fn)


def steps_runner(update_step: Callable):
    """``run(runner, start_step, n_steps)``: ``lax.scan`` of ``update_step(runner, step)``
    over steps ``start_step .. start_step + n_steps - 1`` (``n_steps`` static), returning
    the new carry and the stacked metrics. Shared by every trainer's ``make_trainer``."""

    def run(runner, start_step, n_steps: int):
        steps = jnp.asarray(start_step, jnp.int32) + jnp.arange(n_steps, dtype=jnp.int32)
        return jax.lax.scan(update_step, runner, steps)

    return run


class Trainer(NamedTuple):
    """What :func:`make_train` builds: ``init(key) -> RunnerState`` and
    ``run(runner, start_step, n_steps) -> (runner, metrics)``; ``n_steps`` is static."""

    init: Callable
    run: Callable


def make_trainer(cfg: CountingConfig, batch_sharding: jax.sharding.Sharding | None = None,
                 progress_every: int = 0) -> Trainer:
    """The training run in two pure pieces, so a long run can go in chunks of steps:
    ``init(key)`` builds the policy, its optimizer and the frozen reference;
    ``run(runner, start_step, n_steps)`` scans ``_update_step`` over steps
    ``start_step .. start_step + n_steps - 1`` and returns the new carry and the metrics
    ``{name: (n_steps,)}``. Both are pure: jit them, vmap them over keys (``start_step``
    unbatched). With ``progress_every = k > 0`` the scan reports the number of steps done
    to :func:`progress_listener` every k steps (a ``jax.debug.callback``; the step index
    is the same for every seed, so one report covers all of them).

    ``batch_sharding``: see :func:`make_train`.
    """
    pool = cfg.n_prompts * (cfg.oversample if cfg.dynamic_sampling else 1)

    def _build(key):
        model = CounterPolicy(cfg.vocab_size, cfg.length, value_head=cfg.value_head,
                              rngs=nnx.Rngs(params=key))
        return model, nnx.Optimizer(model, optax.adam(cfg.learning_rate), wrt=nnx.Param)

    abstract = nnx.eval_shape(lambda: _build(jax.random.key(0)))
    graphdef, _ = nnx.split(abstract)
    model_def, _ = nnx.split(abstract[0])

    def init(key: jax.Array) -> RunnerState:
        key_init, key_run = jax.random.split(key)
        model, optimizer = _build(key_init)
        return RunnerState(nnx.state((model, optimizer)), nnx.state(model), key_run)

    def _update_step(runner: RunnerState, step):
        model, optimizer = nnx.merge(graphdef, runner.state)
        ref_model = nnx.merge(model_def, runner.ref)
        key, k_prompt, k_sample = jax.random.split(runner.key, 3)
        prompts = jax.random.randint(k_prompt, (pool,), 0, VOCAB_SIZE)
        prompts = jnp.repeat(prompts, cfg.group_size)
        if batch_sharding is not None:
            prompts = jax.lax.with_sharding_constraint(prompts, batch_sharding)
        completions, _ = sample_completions(model, prompts, k_sample)
        if cfg.dynamic_sampling:
            grouped = training_signal(cfg, prompts, completions)[0].reshape(-1, cfg.group_size)
            kept = select_groups(grouped, cfg.n_prompts)
            rows = group_rows(kept, cfg.group_size)
            batch_prompts, batch_completions = prompts[rows], completions[rows]
        else:  # the pool is the batch
            kept = jnp.arange(cfg.n_prompts)
            batch_prompts, batch_completions = prompts, completions
        metrics = rollout_metrics(cfg, prompts, completions, kept)
        if batch_sharding is not None:
            batch_prompts = jax.lax.with_sharding_constraint(batch_prompts, batch_sharding)
            batch_completions = jax.lax.with_sharding_constraint(batch_completions,
                                                                 batch_sharding)
        metrics.update(grpo_update(model, optimizer, ref_model, batch_prompts,
                                   batch_completions, cfg))
        if progress_every:
            report_progress(step + 1, progress_every, cfg.steps)
        return RunnerState(nnx.state((model, optimizer)), runner.ref, key), metrics

    return Trainer(init, steps_runner(_update_step))


def make_train(cfg: CountingConfig, batch_sharding: jax.sharding.Sharding | None = None,
               progress_every: int = 0):
    """Returns ``train(key) -> (final (policy, optimizer) state, metrics)``.

    ``metrics`` maps each of ``cfg.metric_names`` to an array of shape (steps,).
    ``train`` is pure: jit it, vmap it over keys for many seeds. It is
    :func:`make_trainer`'s ``init`` followed by one ``run`` over all ``cfg.steps`` steps.

    ``batch_sharding`` (e.g. ``NamedSharding(mesh, P("data"))``) constrains each step's
    batch of prompts and completions, laid out group by group, to be split along its
    leading axis; with whole groups per device (see ``jaxgrpo.sharding``), advantages
    need no communication, and XLA sums the gradients of the replicated parameters
    across the data axis. ``None``: no constraint.
    """
    trainer = make_trainer(cfg, batch_sharding, progress_every)

    def train(key: jax.Array):
        runner, metrics = trainer.run(trainer.init(key), 0, cfg.steps)
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
      ``{metric: array}`` for each of ``cfg.metric_names``, shape (steps,), or
      (n_seeds, steps) with ``seeds``; ``mean_reward`` is taken before each update.
    """
    cfg = CountingConfig(steps=steps, **overrides)
    if seeds is None:
        _, metrics = _compiled_train(cfg, False)(jax.random.key(int(seed)))
    else:
        seed_list = seeds_to_list(seed, seeds)
        keys = jax.vmap(jax.random.key)(jnp.asarray(seed_list, jnp.uint32))
        _, metrics = _compiled_train(cfg, True)(keys)
    return {k: np.asarray(metrics[k]) for k in cfg.metric_names}


def seeds_to_list(seed: int, seeds: int | Sequence[int]) -> list[int]:
    """A count ``S`` -> ``[seed, ..., seed + S - 1]``; a sequence -> itself, checked."""
    if isinstance(seeds, Sequence) and not isinstance(seeds, str):
        if len(seeds) == 0:
            raise ValueError("seeds must hold at least one seed, got an empty sequence")
        return [int(s) for s in seeds]
    count = check_positive_int("seeds", seeds)
    return list(range(int(seed), int(seed) + count))
