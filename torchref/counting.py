"""The toy tasks (SPEC section 4 and its variants) and their GRPO trainer, plain PyTorch."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from grpospec import COMPLETION_LENGTH, END_TOKEN, VOCAB_SIZE, CountingConfig
from torchref.advantages import estimator_advantages, overlong_penalty
from torchref.loss import (
    clip_metrics,
    grpo_loss,
    kl_estimate,
    masked_mean,
    selective_log_softmax,
    value_loss,
)
from torchref.sampling import categorical_icdf


class CounterPolicy(nn.Module):
    """A tiny autoregressive policy: ``vocab_size`` tokens, ``length`` per completion.

    ``logits_t = tok_emb[prev_t] + pos_emb[t]``, where ``prev_0`` is the prompt token
    and ``prev_t`` the completion's token ``t - 1``; both tables are ``vocab_size`` wide
    and start as N(0, ``init_std``^2), so the initial policy is close to uniform. With
    ``value_head``, a zero-initialised table ``value[t, prev_t]`` predicts the value of
    each position's state (for PPO/GAE). The same architecture, with the same parameter
    names, is ``jaxgrpo.CounterPolicy``.
    """

    def __init__(self, vocab_size: int = VOCAB_SIZE, length: int = COMPLETION_LENGTH,
                 init_std: float = 0.1, value_head: bool = False):
        super().__init__()
        self.vocab_size, self.length = vocab_size, length
        self.tok_emb = nn.Embedding(vocab_size, vocab_size)
        self.pos_emb = nn.Embedding(length, vocab_size)
        nn.init.normal_(self.tok_emb.weight, std=init_std)
        nn.init.normal_(self.pos_emb.weight, std=init_std)
        self.value = nn.Parameter(torch.zeros(length, vocab_size)) if value_head else None

    def step_logits(self, prev: torch.Tensor, t: int) -> torch.Tensor:
        """Logits (B, V) of position ``t`` given the previous tokens ``prev`` (B,)."""
        return self.tok_emb(prev) + self.pos_emb.weight[t]

    def forward(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits (B, L, V) for ``prompts`` (B,) and ``completions`` (B, L)."""
        prev = previous_tokens(prompts, completions)
        return self.tok_emb(prev) + self.pos_emb.weight[None, : prev.shape[1]]

    def token_logprobs(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        """Per-token log-probs (B, L) of ``completions``."""
        return selective_log_softmax(self(prompts, completions), completions)

    def values(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        """Value predictions (B, L) of each position's state (needs ``value_head``)."""
        if self.value is None:
            raise ValueError("this CounterPolicy has no value head (value_head=False)")
        prev = previous_tokens(prompts, completions)
        return self.value[torch.arange(prev.shape[1])[None, :], prev]

    def sample(self, prompts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Sample completions (B, L) token by token from the policy itself (no grad), by the
        inverse CDF (``torchref.sampling.categorical_icdf``): one uniform per token."""
        uniforms = torch.rand((self.length, prompts.shape[0]), generator=generator)
        prev = prompts
        out = []
        with torch.no_grad():
            for t in range(self.length):
                prev = categorical_icdf(uniforms[t], self.step_logits(prev, t))
                out.append(prev)
        return torch.stack(out, dim=1)


def previous_tokens(prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
    """The context token of each position (B, L): the prompt, then the completion shifted."""
    return torch.cat([prompts[:, None], completions[:, :-1]], dim=1)


def counting_reward(prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
    """Fraction of positions i with ``completion[i] == (p + i + 1) mod 8``, shape (B,)."""
    steps = torch.arange(1, completions.shape[1] + 1, device=completions.device)
    target = (prompts[:, None] + steps[None]) % VOCAB_SIZE
    return (completions == target).float().mean(dim=1)


def task_reward(task: str, prompts: torch.Tensor, completions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
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

    Returns:
      ``(rewards (B,) float32, mask (B, L) float32, correct (B,) bool, lengths (B,))``.
    """
    n, length = completions.shape
    if task == "variable":
        is_end = completions == END_TOKEN
        ended = is_end.any(dim=1)
        end_idx = torch.where(ended, is_end.float().argmax(dim=1), length - 1)
        mask = (torch.arange(length)[None, :] <= end_idx[:, None]).float()
        correct = (completions[:, 0] == (prompts + 1) % VOCAB_SIZE) & ended & (end_idx >= 1)
        return correct.float(), mask, correct, end_idx + 1
    per_position = counting_reward(prompts, completions)
    correct = per_position == 1.0
    rewards = per_position if task == "counting" else correct.float()
    return rewards, torch.ones(n, length), correct, torch.full((n,), length)


def training_signal(cfg: CountingConfig, prompts: torch.Tensor, completions: torch.Tensor):
    """What the update trains on: ``(rewards, response mask, loss mask, correct,
    lengths)``: the task's reward plus DAPO's overlong penalty (``cfg.overlong_buffer``);
    the loss mask drops truncated completions (no end token) when ``cfg.mask_truncated``."""
    rewards, mask, correct, lengths = task_reward(cfg.task, prompts, completions)
    ended = (completions == END_TOKEN).any(dim=1)
    rewards, loss_mask = shape_signal(cfg, rewards, mask, lengths, ended)
    return rewards, mask, loss_mask, correct, lengths


def shape_signal(cfg, rewards: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor,
                 ended: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rewards, loss mask)``: plus the overlong penalty, without the rows that did not
    end when ``cfg.mask_truncated``; as ``jaxgrpo.counting.shape_signal``. Shared by the
    counting and the language-model trainers."""
    if cfg.overlong_buffer is not None:
        rewards = rewards + overlong_penalty(lengths, cfg.length, cfg.overlong_buffer,
                                             cfg.overlong_penalty)
    loss_mask = mask * ended[:, None].float() if cfg.mask_truncated else mask
    return rewards, loss_mask


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis, in float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def select_groups(grouped_rewards: torch.Tensor, n_keep: int) -> torch.Tensor:
    """Dynamic sampling's choice: indices (n_keep,) of the groups to train on.

    Groups whose rewards vary come first, in sampling order; zero-variance groups fill
    the remaining places only when too few vary (a stable sort on "has zero variance").
    """
    zero_var = grouped_rewards.amax(dim=1) == grouped_rewards.amin(dim=1)
    return torch.argsort(zero_var.to(torch.int8), stable=True)[:n_keep]


def _advantages(cfg: CountingConfig, policy: CounterPolicy, prompts, completions, rewards,
                mask, lengths):
    """Advantages (per sequence, or per token for GAE) and the value targets (or None)."""
    values = None
    if cfg.estimator == "gae":
        with torch.no_grad():
            values = policy.values(prompts, completions)
    return estimator_advantages(cfg.estimator, rewards, cfg.group_size, mask, lengths, values,
                                cfg.gamma, cfg.lam, cfg.scale_rewards)


def grpo_update(
    policy: CounterPolicy,
    ref_policy: CounterPolicy,
    optimizer: torch.optim.Optimizer,
    prompts: torch.Tensor,
    completions: torch.Tensor,
    cfg: CountingConfig,
) -> dict[str, torch.Tensor]:
    """One GRPO step on given rollouts: reward, advantages, ``inner_epochs`` Adam steps.

    ``prompts`` (B*G,) and ``completions`` (B*G, L) are laid out group by group. Returns
    the update's metrics: ``loss``, the ``clip_ratio/*`` shares (``clip_metrics``), ``kl``
    and ``entropy`` are those of the last inner epoch, before its update.
    """
    rewards, _, mask, _, lengths = training_signal(cfg, prompts, completions)
    adv, returns = _advantages(cfg, policy, prompts, completions, rewards, mask, lengths)
    with torch.no_grad():
        logp_old = policy.token_logprobs(prompts, completions)
        logp_ref = ref_policy.token_logprobs(prompts, completions)
    for _ in range(cfg.inner_epochs):
        logits = policy(prompts, completions)
        logp_new = selective_log_softmax(logits, completions)
        entropy = token_entropy(logits) if cfg.needs_entropy else None
        loss = grpo_loss(logp_new, logp_old, logp_ref, adv, mask, entropy=entropy,
                         **cfg.loss_options())
        if returns is not None:
            loss = loss + cfg.vf_coef * value_loss(policy.values(prompts, completions),
                                                   returns, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return {
            **clip_metrics(logp_new, logp_old, adv, mask, cfg.clip_eps, cfg.clip_eps_high,
                           cfg.importance_level, cfg.dual_clip),
            "kl": masked_mean(kl_estimate(logp_new, logp_ref, cfg.kl_estimator), mask),
            "entropy": masked_mean(token_entropy(logits), mask),
            "loss": loss.detach(),
        }


def rollout_metrics(cfg: CountingConfig, prompts: torch.Tensor, completions: torch.Tensor,
                    kept: torch.Tensor) -> dict[str, torch.Tensor]:
    """Metrics of a step's sampled pool and of the groups ``kept`` for training."""
    rewards, mask, _, correct, lengths = training_signal(cfg, prompts, completions)
    return rollout_stats(rewards, mask, correct, lengths, cfg.group_size,
                         kept if cfg.dynamic_sampling else None)


def rollout_stats(rewards: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor,
                  lengths: torch.Tensor, group_size: int, kept: torch.Tensor | None
                  ) -> dict[str, torch.Tensor]:
    """Metrics of a sampled pool (rewards (N,), mask (N, T), correct (N,), lengths (N,),
    laid out group by group), for any task; with dynamic sampling, ``kept`` holds the
    groups chosen for training and the ``ds_*`` metrics are added (``None``: without)."""
    grouped = rewards.view(-1, group_size)
    zero_var = grouped.amax(1) == grouped.amin(1)
    lengths, c = lengths.float(), correct.float()
    nan = torch.tensor(float("nan"))
    metrics = {
        "mean_reward": rewards.mean(),
        "frac_reward_zero_std": zero_var.float().mean(),
        "correct_frac": c.mean(),
        "mean_length": lengths.mean(),
        "len_correct": (lengths * c).sum() / c.sum() if c.sum() > 0 else nan,
        "len_incorrect": (lengths * (1 - c)).sum() / (1 - c).sum() if c.sum() < len(c) else nan,
        "sampled_tokens": mask.sum(),
    }
    if kept is not None:
        filled = zero_var[kept].sum()  # zero-variance groups that had to fill the batch
        metrics["ds_dropped"] = (zero_var.sum() - filled).float()
        metrics["ds_filled"] = filled.float()
    return metrics


def group_rows(kept: torch.Tensor, group_size: int) -> torch.Tensor:
    """The rows (len(kept) * group_size,) of the groups ``kept``, in order."""
    return (kept[:, None] * group_size + torch.arange(group_size)).reshape(-1)


def train_counting(seed: int = 0, steps: int = 80, on_step=None,
                   **overrides) -> Mapping[str, np.ndarray]:
    """Train ``CounterPolicy`` with GRPO on a toy task (SPEC section 4 by default).

    Args:
      seed: seeds the initial weights and every sample.
      steps: GRPO steps.
      on_step: called with no argument after each step (progress reporting).
      **overrides: any other field of ``grpospec.CountingConfig``.
    Returns:
      ``{metric: array of shape (steps,)}`` for each of ``cfg.metric_names``;
      ``mean_reward`` is that step's rollouts' reward, before the update.
    """
    cfg = CountingConfig(steps=steps, **overrides)
    gen = torch.Generator().manual_seed(int(seed))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        policy = CounterPolicy(cfg.vocab_size, cfg.length, value_head=cfg.value_head)
    ref_policy = copy.deepcopy(policy).requires_grad_(False)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate)
    pool = cfg.n_prompts * (cfg.oversample if cfg.dynamic_sampling else 1)
    history: dict[str, list[float]] = {k: [] for k in cfg.metric_names}
    for _ in range(cfg.steps):
        prompts = torch.randint(0, VOCAB_SIZE, (pool,), generator=gen)
        prompts = prompts.repeat_interleave(cfg.group_size)
        completions = policy.sample(prompts, gen)
        grouped = training_signal(cfg, prompts, completions)[0].view(-1, cfg.group_size)
        kept = select_groups(grouped, cfg.n_prompts)
        metrics = rollout_metrics(cfg, prompts, completions, kept)
        rows = group_rows(kept, cfg.group_size)
        metrics.update(grpo_update(policy, ref_policy, optimizer, prompts[rows],
                                   completions[rows], cfg))
        for k in cfg.metric_names:
            history[k].append(float(metrics[k]))
        if on_step is not None:
            on_step()
    return {k: np.asarray(v) for k, v in history.items()}
