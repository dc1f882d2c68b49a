"""GRPO on a tiny Qwen2-architecture language model, as one compiled JAX program.

``make_train(cfg)`` returns ``train(key)``: pretrain the base model (``_pretrain_step``
under ``lax.scan``), then a ``lax.scan`` of ``_update_step`` (sample problems ->
generate completions with a KV cache (``_decode_step`` under ``lax.scan``) -> reward ->
``inner_epochs`` optimizer steps, the first of which also gives ``logp_old`` and the
advantages (``on_policy_lm_loss``), the rest ``_update_epoch``), all inside one ``jax.jit``;
``jax.jit(jax.vmap(train))(keys)`` trains many seeds at once. With a fixed
``cfg.base_seed`` the base model does not depend on the vmapped key, so ``vmap``
pretrains it once for all seeds.

The math is the counting trainer's (``jaxgrpo.counting``): the same ``grpo_loss``,
``estimator_advantages``, ``select_groups`` / ``group_rows`` (dynamic sampling) and
``rollout_stats``; only the policy and the task differ. ``torchref.lm`` is the same
trainer in PyTorch, with ``transformers``' ``Qwen2ForCausalLM`` as the model.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from grpospec.lm import END, PAD, LMConfig
from jaxgrpo.advantages import estimator_advantages
from jaxgrpo.counting import (
    Trainer,
    group_rows,
    report_progress,
    rollout_stats,
    seeds_to_list,
    select_groups,
    shape_signal,
    steps_runner,
    token_entropy,
)
from jaxgrpo.lm_tasks import (
    Problems,
    completion_mask,
    corpus_completions,
    sample_problems,
    task_reward,
)
from jaxgrpo.loss import (
    clip_metrics,
    grpo_loss,
    kl_estimate,
    masked_mean,
    selective_log_softmax,
    value_loss,
)
from jaxgrpo.qwen2 import Qwen2, positions_from_mask
from jaxgrpo.sampling import categorical_icdf


def make_model(cfg: LMConfig, key: jax.Array) -> Qwen2:
    """A freshly initialised decoder of ``cfg``'s sizes (a value head for GAE)."""
    return Qwen2(cfg.model, value_head=cfg.value_head, rngs=nnx.Rngs(params=key))


def completion_hidden(model: Qwen2, prompts: jax.Array, prompt_mask: jax.Array,
                      completions: jax.Array) -> jax.Array:
    """Teacher-forced final hidden states (B, L, hidden) that predict each completion token.

    The forward runs over ``prompts + completions[:, :-1]`` (the last completion token
    predicts nothing), padding masked out, positions ``cumsum(mask) - 1``; position
    ``P - 1 + j`` predicts completion token ``j``.
    """
    p = prompts.shape[1]
    tokens = jnp.concatenate([prompts, completions[:, :-1]], axis=1)
    mask = jnp.concatenate([prompt_mask, jnp.ones_like(completions[:, :-1])], axis=1)
    hidden, _ = model.forward(tokens, positions_from_mask(mask), mask)
    return hidden[:, p - 1:]


def completion_logprobs(model: Qwen2, prompts: jax.Array, prompt_mask: jax.Array,
                        completions: jax.Array) -> jax.Array:
    """Per-token log-probs (B, L) of ``completions``: gather minus logsumexp, float32."""
    logits = model.logits(completion_hidden(model, prompts, prompt_mask, completions))
    return selective_log_softmax(logits, completions)


def generate(model: Qwen2, prompts: jax.Array, prompt_mask: jax.Array, key: jax.Array,
             length: int) -> tuple[jax.Array, jax.Array]:
    """Sample ``length`` tokens after each left-padded prompt, temperature 1, KV cache.

    Draws one uniform per token (``jax.random.uniform(key, (length, B))``) and calls
    ``generate_from_uniforms``.

    Args:
      model: the policy.
      prompts: (B, P) left-padded prompt tokens; prompt_mask: (B, P), 0 at padding.
      key: PRNG key.
      length: tokens to sample (static).
    Returns:
      ``(tokens, logprobs)``, both (B, length); log-probs are 0 after the end token.
    """
    uniforms = jax.random.uniform(key, (length, prompts.shape[0]))
    return generate_from_uniforms(model, prompts, prompt_mask, uniforms)


def generate_from_uniforms(model: Qwen2, prompts: jax.Array, prompt_mask: jax.Array,
                           uniforms: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Autoregressive sampling with a KV cache, token ``t`` of row ``b`` drawn by the
    inverse CDF (``categorical_icdf``) of ``uniforms[t, b]`` ((L, B) in [0, 1)).

    The cache has ``P + L`` slots: the prompt's first ``P - 1`` tokens are prefilled,
    then each ``_decode_step`` (``lax.scan``) feeds one token (the last prompt token,
    then each sampled one) and samples the next from its logits. After the first end
    token the completion is padding (as ``transformers``' ``generate``); the response
    mask is ``lm_tasks.completion_mask``. ``torchref.lm.generate_from_uniforms`` draws
    the same tokens from the same uniforms and weights.
    """
    b, p = prompts.shape
    length = uniforms.shape[0]
    key_valid = jnp.concatenate([prompt_mask, jnp.ones((b, length), prompt_mask.dtype)], 1)
    positions = positions_from_mask(prompt_mask)
    cache = model.init_cache(b, p + length)
    if p > 1:
        _, cache = model.forward(prompts[:, :-1], positions[:, :-1], key_valid, cache, 0)

    def _decode_step(carry, inputs):
        cache, token, position, done = carry
        t, u = inputs
        hidden, cache = model.forward(token[:, None], position[:, None], key_valid, cache,
                                      p - 1 + t)
        logp = jax.nn.log_softmax(model.logits(hidden[:, 0]).astype(jnp.float32), axis=-1)
        new = jnp.where(done, PAD, categorical_icdf(u, logp))
        new_logp = jnp.where(done, 0.0, jnp.take_along_axis(logp, new[:, None], axis=-1)[:, 0])
        return (cache, new, position + 1, done | (new == END)), (new, new_logp)

    init = (cache, prompts[:, -1], positions[:, -1], jnp.zeros((b,), bool))
    _, (tokens, logps) = jax.lax.scan(_decode_step, init, (jnp.arange(length), uniforms))
    return tokens.T, logps.T


def sft_loss(model: Qwen2, problems: Problems, demos: jax.Array) -> jax.Array:
    """Next-token cross-entropy of demonstrations (B, L), mean over their masked tokens."""
    mask = completion_mask(demos)[0]
    return -masked_mean(completion_logprobs(model, problems.tokens, problems.mask, demos), mask)


def pretrain(model: Qwen2, cfg: LMConfig, key: jax.Array) -> jax.Array:
    """Make the base model: ``cfg.pretrain_steps`` Adam steps of ``sft_loss`` on fresh
    batches of the noisy corpus (``lm_tasks.corpus_completions``), in place. Returns
    the losses (pretrain_steps,)."""
    if cfg.pretrain_steps == 0:
        return jnp.zeros((0,))
    optimizer = nnx.Optimizer(model, optax.adam(cfg.pretrain_lr), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))

    def _pretrain_step(state, key):
        model, optimizer = nnx.merge(graphdef, state)
        k_prob, k_demo = jax.random.split(key)
        problems = sample_problems(k_prob, cfg.pretrain_batch, cfg.digits)
        demos = corpus_completions(k_demo, problems, cfg)
        loss, grads = nnx.value_and_grad(sft_loss)(model, problems, demos)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    state, losses = jax.lax.scan(_pretrain_step, state,
                                 jax.random.split(key, cfg.pretrain_steps))
    nnx.update((model, optimizer), state)
    return losses


def base_model(cfg: LMConfig, key: jax.Array) -> Qwen2:
    """Initialise from ``key`` and pretrain (``pretrain``): the run's base model."""
    k_init, k_pre = jax.random.split(key)
    model = make_model(cfg, k_init)
    pretrain(model, cfg, k_pre)
    return model


class UpdateInputs(NamedTuple):
    """What an update's loss needs besides the policy: constants of the rollouts."""

    logp_old: jax.Array  # (N, L) under the sampling policy
    logp_ref: jax.Array  # (N, L) under the reference (base) policy
    adv: jax.Array  # (N,) or (N, L) for GAE
    returns: jax.Array | None  # (N, L) value targets (GAE), else None
    mask: jax.Array  # (N, L) response mask


def training_signal(cfg: LMConfig, problems: Problems, completions: jax.Array
                    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """What the update trains on: ``(rewards, response mask, loss mask, correct,
    lengths)``, as ``jaxgrpo.counting.training_signal``: the task's reward plus DAPO's
    overlong penalty (``cfg.overlong_buffer``); the loss mask is the response mask without
    the truncated completions (no end token) when ``cfg.mask_truncated``."""
    rewards, mask, correct, lengths = task_reward(cfg.task, problems, completions)
    rewards, loss_mask = shape_signal(cfg, rewards, mask, lengths,
                                      completion_mask(completions)[2])
    return rewards, mask, loss_mask, correct, lengths


class Rollouts(NamedTuple):
    """What an update knows of its rollouts before any forward of the policy."""

    rewards: jax.Array  # (N,) shaped rewards (``training_signal``)
    mask: jax.Array  # (N, L) loss mask
    lengths: jax.Array  # (N,) completion lengths
    logp_ref: jax.Array  # (N, L) under the reference (base) policy


def rollouts_of(ref_model: Qwen2, problems: Problems, completions: jax.Array, cfg: LMConfig
                ) -> Rollouts:
    """Reward the completions (``training_signal``) and take the reference log-probs."""
    rewards, _, mask, _, lengths = training_signal(cfg, problems, completions)
    logp_ref = jax.lax.stop_gradient(completion_logprobs(ref_model, problems.tokens,
                                                         problems.mask, completions))
    return Rollouts(rewards, mask, lengths, logp_ref)


def update_inputs(cfg: LMConfig, rollouts: Rollouts, logp_old: jax.Array,
                  values: jax.Array | None) -> UpdateInputs:
    """The loss's constants from the sampling policy's log-probs (and, for GAE, values):
    the advantages of ``cfg.estimator``."""
    adv, returns = estimator_advantages(cfg.estimator, rollouts.rewards, cfg.group_size,
                                        rollouts.mask, rollouts.lengths, values, cfg.gamma,
                                        cfg.lam, cfg.scale_rewards)
    return UpdateInputs(logp_old, rollouts.logp_ref, adv, returns, rollouts.mask)


def prepare_update(model: Qwen2, ref_model: Qwen2, problems: Problems, completions: jax.Array,
                   cfg: LMConfig) -> UpdateInputs:
    """Reward the completions, take old (a separate forward, no gradient) and reference
    log-probs and the advantages. ``grpo_update`` gets the same values without the
    separate forward (``on_policy_lm_loss``)."""
    hidden = jax.lax.stop_gradient(completion_hidden(model, problems.tokens, problems.mask,
                                                     completions))
    logp_old = selective_log_softmax(model.logits(hidden), completions)
    values = model.values(hidden) if cfg.estimator == "gae" else None
    return update_inputs(cfg, rollouts_of(ref_model, problems, completions, cfg), logp_old,
                         values)


def _forward(model: Qwen2, problems: Problems, completions: jax.Array):
    hidden = completion_hidden(model, problems.tokens, problems.mask, completions)
    logits = model.logits(hidden)
    return hidden, logits, selective_log_softmax(logits, completions)


def _objective(model: Qwen2, hidden: jax.Array, logits: jax.Array, logp_new: jax.Array,
               inputs: UpdateInputs, cfg: LMConfig):
    entropy = token_entropy(logits)
    loss = grpo_loss(logp_new, inputs.logp_old, inputs.logp_ref, inputs.adv, inputs.mask,
                     entropy=entropy, **cfg.loss_options())
    if inputs.returns is not None:
        loss = loss + cfg.vf_coef * value_loss(model.values(hidden), inputs.returns,
                                               inputs.mask)
    return loss, (logp_new, entropy)


def lm_loss(model: Qwen2, problems: Problems, completions: jax.Array, inputs: UpdateInputs,
            cfg: LMConfig) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """The update's loss and ``(logp_new, token entropy)``, both (N, L).

    ``grpo_loss`` with ``cfg.loss_options()`` (``max_len = L`` for ``agg="constant"``;
    the entropy bonus ``- entropy_coef * entropy`` aggregated like the loss, skipped when
    0), plus
    ``vf_coef * value_loss`` for GAE. Same as ``torchref.lm.lm_loss``.
    """
    return _objective(model, *_forward(model, problems, completions), inputs, cfg)


def on_policy_lm_loss(model: Qwen2, problems: Problems, completions: jax.Array,
                      rollouts: Rollouts, cfg: LMConfig):
    """``lm_loss`` of the first inner epoch, whose policy is the one that sampled: its
    ``logp_old`` is the forward's own ``logp_new`` under ``stop_gradient`` (and GAE's
    values its own values), so no separate forward is needed (TRL's shortcut; exact here,
    as the model has no dropout: the same weights and tokens give the same log-probs).
    Returns ``(loss, ((logp_new, entropy), inputs))``: ``inputs`` for the later epochs."""
    hidden, logits, logp_new = _forward(model, problems, completions)
    values = (jax.lax.stop_gradient(model.values(hidden)) if cfg.estimator == "gae"
              else None)
    inputs = update_inputs(cfg, rollouts, jax.lax.stop_gradient(logp_new), values)
    loss, aux = _objective(model, hidden, logits, logp_new, inputs, cfg)
    return loss, (aux, inputs)


def grpo_update(model: Qwen2, optimizer: nnx.Optimizer, ref_model: Qwen2, problems: Problems,
                completions: jax.Array, cfg: LMConfig) -> dict[str, jax.Array]:
    """One GRPO step on given rollouts, updating ``model``/``optimizer`` in place.

    ``cfg.inner_epochs`` full-batch optimizer steps: the first of ``on_policy_lm_loss``
    (which also yields the loss's constants: ``logp_old``, the advantages), the rest of
    ``lm_loss`` (``_update_epoch`` under ``lax.scan``); the same values as
    ``prepare_update`` followed by ``lm_loss`` each epoch. Rows are laid out group by
    group. Returns ``loss``, the ``clip_ratio/*`` shares (``clip_metrics``), ``kl`` and
    ``entropy`` of the last inner epoch, before its update. Same computation as
    ``torchref.lm.grpo_update``.
    """
    rollouts = rollouts_of(ref_model, problems, completions, cfg)
    (loss, (aux, inputs)), grads = nnx.value_and_grad(on_policy_lm_loss, has_aux=True)(
        model, problems, completions, rollouts, cfg)
    optimizer.update(model, grads)
    if cfg.inner_epochs > 1:
        graphdef, state = nnx.split((model, optimizer))

        def _update_epoch(state, _):
            model, optimizer = nnx.merge(graphdef, state)
            (loss, aux), grads = nnx.value_and_grad(lm_loss, has_aux=True)(
                model, problems, completions, inputs, cfg)
            optimizer.update(model, grads)
            return nnx.state((model, optimizer)), (loss, aux)

        state, (losses, auxs) = jax.lax.scan(_update_epoch, state, None,
                                             length=cfg.inner_epochs - 1)
        nnx.update((model, optimizer), state)
        loss, aux = losses[-1], jax.tree.map(lambda x: x[-1], auxs)
    logp_new, entropy = aux
    return {
        **clip_metrics(logp_new, inputs.logp_old, inputs.adv, inputs.mask, cfg.clip_eps,
                       cfg.clip_eps_high, cfg.importance_level, cfg.dual_clip),
        "kl": masked_mean(kl_estimate(logp_new, inputs.logp_ref, cfg.kl_estimator),
                          inputs.mask),
        "entropy": masked_mean(entropy, inputs.mask),
        "loss": loss,
    }


def _repeat(problems: Problems, times: int) -> Problems:
    return Problems(*(jnp.repeat(x, times, axis=0) for x in problems))


def _take(problems: Problems, rows: jax.Array) -> Problems:
    return Problems(*(x[rows] for x in problems))


def _constrain(tree, sharding):
    if sharding is None:
        return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), tree)


def make_optimizer(cfg: LMConfig) -> optax.GradientTransformation:
    """Adam at ``cfg.learning_rate``, after clipping the gradient's global norm to
    ``cfg.max_grad_norm`` (unless it is ``None``)."""
    adam = optax.adam(cfg.learning_rate)
    if cfg.max_grad_norm is None:
        return adam
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adam)


class RunnerState(NamedTuple):
    """The ``lax.scan`` carry of a training run."""

    state: nnx.State  # (policy, optimizer), as split by nnx
    ref: nnx.State  # the frozen reference policy: the base model
    key: jax.Array


def make_trainer(cfg: LMConfig, batch_sharding: jax.sharding.Sharding | None = None,
                 progress_every: int = 0) -> Trainer:
    """The training run in two pure pieces, as ``jaxgrpo.counting.make_trainer``:
    ``init(key)`` builds the base model (``base_model``: pretrained, the same for every
    run when ``cfg.base_seed`` is set), its optimizer and the frozen reference;
    ``run(runner, start_step, n_steps)`` scans ``_update_step`` over those steps and
    returns the new carry and the metrics ``{name: (n_steps,)}``. ``progress_every = k > 0``
    reports the steps done every k steps (``jaxgrpo.counting.progress_listener``).
    ``batch_sharding`` constrains each step's rows (whole groups) along their leading axis
    (``jaxgrpo.sharding``).
    """
    pool = cfg.n_prompts * (cfg.oversample if cfg.dynamic_sampling else 1)
    abstract = nnx.eval_shape(lambda: _build(cfg, jax.random.key(0), pretrained=False))
    graphdef, _ = nnx.split(abstract)
    model_def, _ = nnx.split(abstract[0])

    def init(key: jax.Array) -> RunnerState:
        key_base, key_run = jax.random.split(key)
        if cfg.base_seed is not None:  # one base model for every run
            key_base = jax.random.key(cfg.base_seed)
        model, optimizer = _build(cfg, key_base)
        return RunnerState(nnx.state((model, optimizer)), nnx.state(model), key_run)

    def _update_step(runner: RunnerState, step):
        model, optimizer = nnx.merge(graphdef, runner.state)
        ref_model = nnx.merge(model_def, runner.ref)
        key, k_prob, k_sample = jax.random.split(runner.key, 3)
        problems = _repeat(sample_problems(k_prob, pool, cfg.digits), cfg.group_size)
        problems = _constrain(problems, batch_sharding)
        completions, _ = generate(model, problems.tokens, problems.mask, k_sample, cfg.length)
        rewards, mask, _, correct, lengths = training_signal(cfg, problems, completions)
        if cfg.dynamic_sampling:
            kept = select_groups(rewards.reshape(-1, cfg.group_size), cfg.n_prompts)
            rows = group_rows(kept, cfg.group_size)
            batch, batch_completions = _take(problems, rows), completions[rows]
        else:  # the pool is the batch
            kept = jnp.arange(cfg.n_prompts)
            batch, batch_completions = problems, completions
        metrics = rollout_stats(rewards, mask, correct, lengths, cfg.group_size,
                                kept if cfg.dynamic_sampling else None)
        batch, batch_completions = _constrain((batch, batch_completions), batch_sharding)
        metrics.update(grpo_update(model, optimizer, ref_model, batch, batch_completions, cfg))
        if progress_every:
            report_progress(step + 1, progress_every, cfg.steps)
        return RunnerState(nnx.state((model, optimizer)), runner.ref, key), metrics

    return Trainer(init, steps_runner(_update_step))


def _build(cfg: LMConfig, key: jax.Array, pretrained: bool = True):
    model = base_model(cfg, key) if pretrained else make_model(cfg, key)
    return model, nnx.Optimizer(model, make_optimizer(cfg), wrt=nnx.Param)


def make_train(cfg: LMConfig, batch_sharding: jax.sharding.Sharding | None = None,
               progress_every: int = 0):
    """Returns ``train(key) -> (final (policy, optimizer) state, metrics)``.

    ``metrics`` maps each of ``cfg.metric_names`` to an array of shape (steps,).
    ``train`` is pure: jit it, vmap it over keys for many seeds. It is
    :func:`make_trainer`'s ``init`` followed by one ``run`` over all ``cfg.steps`` steps.
    """
    trainer = make_trainer(cfg, batch_sharding, progress_every)

    def train(key: jax.Array):
        runner, metrics = trainer.run(trainer.init(key), 0, cfg.steps)
        return runner.state, metrics

    return train


@functools.lru_cache(maxsize=32)
def _compiled_train(cfg: LMConfig, vmapped: bool):
    train = make_train(cfg)
    return jax.jit(jax.vmap(train) if vmapped else train)


def train_lm(seed: int = 0, steps: int | None = None, *,
             seeds: int | Sequence[int] | None = None, **overrides) -> dict[str, np.ndarray]:
    """Post-train the tiny Qwen2 with GRPO on an ``LMConfig`` task.

    Args:
      seed: the run's seed (ignored when ``seeds`` is given).
      steps: GRPO steps (default ``LMConfig``'s).
      seeds: train many runs at once (``vmap``): a count ``S`` (seeds
        ``seed .. seed + S - 1``) or a sequence of seeds.
      **overrides: any other field of ``grpospec.lm.LMConfig``.
    Returns:
      ``{metric: array}`` for each of ``cfg.metric_names``, shape (steps,), or
      (n_seeds, steps) with ``seeds``; ``mean_reward`` is taken before each update (at
      step 0: the base model's).
    """
    cfg = LMConfig(**overrides) if steps is None else LMConfig(steps=steps, **overrides)
    if seeds is None:
        _, metrics = _compiled_train(cfg, False)(jax.random.key(int(seed)))
    else:
        keys = jax.vmap(jax.random.key)(jnp.asarray(seeds_to_list(seed, seeds), jnp.uint32))
        _, metrics = _compiled_train(cfg, True)(keys)
    return {k: np.asarray(metrics[k]) for k in cfg.metric_names}
