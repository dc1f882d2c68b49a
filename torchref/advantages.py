"""Group-relative advantages (SPEC section 2), plain PyTorch."""

from __future__ import annotations

import torch

from grpospec import (
    check_gae,
    check_group_rewards,
    check_overlong,
    check_rloo_rewards,
    check_scale_rewards,
)


def group_advantages(
    rewards: torch.Tensor, std_norm: bool = True, eps: float = 1e-6,
    scale_rewards: str | None = None,
) -> torch.Tensor:
    """Per-group advantages: GRPO ``(r - mean) / (std + eps)`` or Dr. GRPO ``r - mean``.

    ``std`` is the population std (divide by G). A group whose rewards are all equal
    (G = 1 included) gets exactly zero advantages: it carries no learning signal.
    ``scale_rewards`` (TRL's option) overrides ``std_norm``: ``"group"``, ``"batch"``
    (the group's mean, the std of all B * G rewards) or ``"none"``.

    Args:
      rewards: shape (B, G), B prompts with G sampled completions each.
      std_norm: divide by the group std (GRPO) or not (Dr. GRPO).
      eps: added to the std.
      scale_rewards: ``"group"``, ``"batch"``, ``"none"``, or ``None`` (from ``std_norm``).
    Returns:
      advantages, shape (B, G), the dtype of ``rewards``.
    """
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    check_group_rewards(tuple(rewards.shape), eps)
    scale = scale_rewards if scale_rewards is not None else ("group" if std_norm else "none")
    check_scale_rewards(scale)
    if not rewards.dtype.is_floating_point:
        rewards = rewards.to(torch.get_default_dtype())
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if scale == "group":
        centered = centered / (rewards.std(dim=1, unbiased=False, keepdim=True) + eps)
    elif scale == "batch":
        centered = centered / (rewards.std(unbiased=False) + eps)
    all_equal = rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True)
    return torch.where(all_equal, torch.zeros_like(centered), centered)


def reinforce_pp_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++: the whole batch's rewards normalised together,
    ``A = (r - mean_batch) / (std_batch + eps)`` (population std); exactly zeros when all
    rewards are equal."""
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    check_group_rewards(tuple(rewards.reshape(1, -1).shape), eps)
    if not rewards.dtype.is_floating_point:
        rewards = rewards.to(torch.get_default_dtype())
    if rewards.max() == rewards.min():
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean()) / (rewards.std(unbiased=False) + eps)


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int,
                     penalty: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment: 0 up to ``max_len - buffer`` tokens, then down
    linearly to ``-penalty`` at ``max_len`` (and beyond)."""
    check_overlong(max_len, buffer, penalty)
    lengths = torch.as_tensor(lengths).float()
    return penalty * torch.clamp((max_len - buffer - lengths) / buffer, -1.0, 0.0)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO: ``A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean(r))``.

    Needs G >= 2. A group whose rewards are all equal gets exactly zero advantages.

    Args:
      rewards: shape (B, G).
    Returns:
      advantages, shape (B, G).
    """
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    check_rloo_rewards(tuple(rewards.shape))
    if not rewards.dtype.is_floating_point:
        rewards = rewards.to(torch.get_default_dtype())
    g = rewards.shape[1]
    leave_one_out = (rewards.sum(dim=1, keepdim=True) - rewards) / (g - 1)
    adv = rewards - leave_one_out
    all_equal = rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True)
    return torch.where(all_equal, torch.zeros_like(adv), adv)


def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token GAE(gamma, lambda) and returns, by a plain backward loop over time.

    ``delta_t = r_t + gamma V_{t+1} m_{t+1} - V_t``;
    ``A_t = delta_t + gamma lam m_{t+1} A_{t+1}``; returns ``A + V``. The valid tokens of
    a row are a prefix (left-aligned); the value after the last valid token is 0 (the
    episode ends). Masked positions may hold anything and get 0.

    Args:
      rewards: (N, T) per-token rewards.
      values: (N, T) value predictions V_t (constants).
      mask: (N, T) nonzero at valid tokens.
      gamma: discount in [0, 1].
      lam: GAE lambda in [0, 1].
    Returns:
      ``(advantages, returns)``, both (N, T), 0 at masked positions.
    """
    for name, x in (("rewards", rewards), ("values", values), ("mask", mask)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    check_gae(tuple(rewards.shape), tuple(values.shape), tuple(mask.shape), gamma, lam)
    valid = mask != 0
    w = valid.to(values.dtype)
    zero = torch.zeros((), dtype=values.dtype)
    r = torch.where(valid, rewards.to(values.dtype), zero)
    v = torch.where(valid, values.detach(), zero)
    adv = torch.zeros_like(v)
    next_adv = torch.zeros_like(v[:, 0])
    next_value = torch.zeros_like(v[:, 0])
    next_valid = torch.zeros_like(v[:, 0])
    for t in reversed(range(v.shape[1])):
        delta = r[:, t] + gamma * next_value * next_valid - v[:, t]
        next_adv = (delta + gamma * lam * next_valid * next_adv) * w[:, t]
        adv[:, t] = next_adv
        next_value, next_valid = v[:, t], w[:, t]
    return adv, torch.where(valid, adv + v, zero)


def estimator_advantages(estimator: str, rewards: torch.Tensor, group_size: int,
                         mask: torch.Tensor, lengths: torch.Tensor,
                         values: torch.Tensor | None = None, gamma: float = 1.0,
                         lam: float = 0.95, scale_rewards: str | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The trainers' advantages for ``estimator``, and the value targets (or ``None``).

    ``rewards`` (N,) are laid out group by group (N = B * ``group_size``).
    ``"grpo"`` / ``"dr_grpo"``: ``group_advantages`` with / without the std (or as
    ``scale_rewards`` says, when set: ``"group"``, ``"batch"`` or ``"none"``); ``"rloo"``:
    ``rloo_advantages``; ``"reinforce_pp"``: ``reinforce_pp_advantages`` (over the whole
    batch); each gives one advantage per sequence, (N,).
    ``"gae"`` (PPO): the reward is paid at each sequence's last valid token
    (``lengths - 1``), ``gae_advantages`` with the constant ``values`` (N, T) gives one
    advantage per token, whitened over the valid tokens of the batch
    (``(A - mean) / (std + 1e-8)``, 0 at masked positions); returns ``(A, returns)``.
    """
    from torchref.loss import masked_mean

    grouped = rewards.reshape(-1, group_size)
    if estimator in ("grpo", "dr_grpo"):
        return group_advantages(grouped, std_norm=estimator == "grpo",
                                scale_rewards=scale_rewards).reshape(-1), None
    if estimator == "rloo":
        return rloo_advantages(grouped).reshape(-1), None
    if estimator == "reinforce_pp":
        return reinforce_pp_advantages(rewards), None
    if estimator != "gae":
        raise ValueError("estimator must be one of grpo, dr_grpo, rloo, reinforce_pp, gae; "
                         f"got {estimator!r}")
    if values is None:
        raise ValueError("estimator='gae' needs values (N, T), got None")
    terminal = torch.nn.functional.one_hot(lengths.long() - 1, mask.shape[1]).to(
        rewards.dtype) * rewards[:, None]
    adv, returns = gae_advantages(terminal, values.detach(), mask, gamma, lam)
    mean = masked_mean(adv, mask)
    std = masked_mean((adv - mean) ** 2, mask).sqrt()
    return torch.where(mask != 0, (adv - mean) / (std + 1e-8), torch.zeros(())), returns
