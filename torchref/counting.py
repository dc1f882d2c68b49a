"""The counting task (SPEC section 4) and its GRPO trainer, plain PyTorch."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from grpospec import COMPLETION_LENGTH, METRIC_NAMES, VOCAB_SIZE, CountingConfig
from torchref.advantages import group_advantages
from torchref.loss import clip_fraction, grpo_loss, k3_kl, masked_mean, selective_log_softmax


class CounterPolicy(nn.Module):
    """A tiny autoregressive policy: 8 tokens, 5 per completion.

    ``logits_t = tok_emb[prev_t] + pos_emb[t]``, where ``prev_0`` is the prompt token
    and ``prev_t`` the completion's token ``t - 1``; both tables are ``vocab_size`` wide
    and start as N(0, ``init_std``^2), so the initial policy is close to uniform. The
    same architecture, with the same parameter names, is ``jaxgrpo.CounterPolicy``.
    """

    def __init__(self, vocab_size: int = VOCAB_SIZE, length: int = COMPLETION_LENGTH,
                 init_std: float = 0.1):
        super().__init__()
        self.vocab_size, self.length = vocab_size, length
        self.tok_emb = nn.Embedding(vocab_size, vocab_size)
        self.pos_emb = nn.Embedding(length, vocab_size)
        nn.init.normal_(self.tok_emb.weight, std=init_std)
        nn.init.normal_(self.pos_emb.weight, std=init_std)

    def step_logits(self, prev: torch.Tensor, t: int) -> torch.Tensor:
        """Logits (B, V) of position ``t`` given the previous tokens ``prev`` (B,)."""
        return self.tok_emb(prev) + self.pos_emb.weight[t]

    def forward(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits (B, L, V) for ``prompts`` (B,) and ``completions`` (B, L)."""
        prev = torch.cat([prompts[:, None], completions[:, :-1]], dim=1)
        return self.tok_emb(prev) + self.pos_emb.weight[None, : prev.shape[1]]

    def token_logprobs(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        """Per-token log-probs (B, L) of ``completions``."""
        return selective_log_softmax(self(prompts, completions), completions)

    @torch.no_grad()
    def sample(self, prompts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Sample completions (B, L) token by token from the policy itself."""
        prev = prompts
        out = []
        for t in range(self.length):
            logits = self.step_logits(prev, t)
            probs = torch.softmax(logits.float(), -1)
            prev = torch.multinomial(probs, 1, generator=generator)[:, 0]
            out.append(prev)
        return torch.stack(out, dim=1)


def counting_reward(prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
    """Fraction of positions i with ``completion[i] == (p + i + 1) mod 8``, shape (B,)."""
    steps = torch.arange(1, completions.shape[1] + 1, device=completions.device)
    target = (prompts[:, None] + steps[None]) % VOCAB_SIZE
    return (completions == target).float().mean(dim=1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis, in float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def grpo_update(
    policy: CounterPolicy,
    ref_policy: CounterPolicy,
    optimizer: torch.optim.Optimizer,
    prompts: torch.Tensor,
    completions: torch.Tensor,
    cfg: CountingConfig,
) -> dict[str, float]:
    """One GRPO step on given rollouts: reward, advantages, ``inner_epochs`` Adam steps.

    ``prompts`` (B*G,) and ``completions`` (B*G, L) are laid out group by group.
    Returns the step's metrics (``grpospec.METRIC_NAMES``); clip fraction, KL, entropy
    and loss are those of the last inner epoch, before its update.
    """
    rewards = counting_reward(prompts, completions)
    grouped = rewards.view(-1, cfg.group_size)
    adv = group_advantages(grouped, std_norm=cfg.std_norm).view(-1)
    mask = torch.ones_like(completions, dtype=torch.float32)
    with torch.no_grad():
        logp_old = policy.token_logprobs(prompts, completions)
        logp_ref = ref_policy.token_logprobs(prompts, completions)
    for _ in range(cfg.inner_epochs):
        logits = policy(prompts, completions)
        logp_new = selective_log_softmax(logits, completions)
        loss = grpo_loss(logp_new, logp_old, logp_ref, adv, mask, cfg.clip_eps, cfg.beta,
                         cfg.agg, cfg.clip_eps_high)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        zero_var = (grouped.amax(1) == grouped.amin(1)).float().mean()
        metrics = {
            "mean_reward": rewards.mean(),
            "zero_var_frac": zero_var,
            "clip_frac": clip_fraction(logp_new, logp_old, mask, cfg.clip_eps, cfg.clip_eps_high),
            "kl": masked_mean(k3_kl(logp_new, logp_ref), mask),
            "entropy": masked_mean(token_entropy(logits), mask),
            "loss": loss,
        }
    return {k: float(metrics[k].detach()) for k in METRIC_NAMES}


def train_counting(seed: int = 0, steps: int = 80, **overrides) -> Mapping[str, np.ndarray]:
    """Train ``CounterPolicy`` with GRPO on the counting task (SPEC section 4).

    Args:
      seed: seeds the initial weights and every sample.
      steps: GRPO steps.
      **overrides: any other field of ``grpospec.CountingConfig``.
    Returns:
      ``{metric: array of shape (steps,)}`` for each of ``grpospec.METRIC_NAMES``;
      ``mean_reward`` is that step's rollouts' reward, before the update.
    """
    cfg = CountingConfig(steps=steps, **overrides)
    gen = torch.Generator().manual_seed(int(seed))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        policy = CounterPolicy()
    ref_policy = copy.deepcopy(policy).requires_grad_(False)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate)
    history: dict[str, list[float]] = {k: [] for k in METRIC_NAMES}
    for _ in range(cfg.steps):
        prompts = torch.randint(0, VOCAB_SIZE, (cfg.n_prompts,), generator=gen)
        prompts = prompts.repeat_interleave(cfg.group_size)
        completions = policy.sample(prompts, gen)
        for k, v in grpo_update(policy, ref_policy, optimizer, prompts, completions, cfg).items():
            history[k].append(v)
    return {k: np.asarray(v) for k, v in history.items()}
