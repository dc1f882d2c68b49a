"""Group-relative advantages (SPEC section 2), plain PyTorch."""

from __future__ import annotations

import torch

from grpospec import check_group_rewards


def group_advantages(
    rewards: torch.Tensor, std_norm: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Per-group advantages: GRPO ``(r - mean) / (std + eps)`` or Dr. GRPO ``r - mean``.

    ``std`` is the population std (divide by G). A group whose rewards are all equal
    (G = 1 included) gets exactly zero advantages: it carries no learning signal.

    Args:
      rewards: shape (B, G), B prompts with G sampled completions each.
      std_norm: divide by the group std (GRPO) or not (Dr. GRPO).
      eps: added to the std.
    Returns:
      advantages, shape (B, G), the dtype of ``rewards``.
    """
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    check_group_rewards(tuple(rewards.shape), eps)
    if not rewards.dtype.is_floating_point:
        rewards = rewards.to(torch.get_default_dtype())
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if std_norm:
        centered = centered / (rewards.std(dim=1, unbiased=False, keepdim=True) + eps)
    all_equal = rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True)
    return torch.where(all_equal, torch.zeros_like(centered), centered)
