"""jaxgrpo: the RL math of LLM post-training in JAX (see SPEC.md)."""

from jaxgrpo.advantages import group_advantages
from jaxgrpo.bandit import exact_policy_gradient, expected_reward, reinforce_gradient
from jaxgrpo.loss import clip_fraction, grpo_loss, k3_kl, masked_mean, selective_log_softmax

__all__ = [
    "clip_fraction",
    "exact_policy_gradient",
    "expected_reward",
    "group_advantages",
    "grpo_loss",
    "k3_kl",
    "masked_mean",
    "reinforce_gradient",
    "selective_log_softmax",
]
