"""torchref: the PyTorch reference of jaxgrpo's math (see SPEC.md). Plain and readable."""

from torchref.advantages import gae_advantages, group_advantages, rloo_advantages
from torchref.bandit import exact_policy_gradient, reinforce_gradient
from torchref.counting import (
    CounterPolicy,
    counting_reward,
    grpo_update,
    rollout_metrics,
    select_groups,
    task_reward,
    token_entropy,
    train_counting,
)
from torchref.loss import (
    clip_metrics,
    grpo_loss,
    k3_kl,
    masked_mean,
    selective_log_softmax,
    value_loss,
)

__all__ = [
    "CounterPolicy",
    "clip_metrics",
    "counting_reward",
    "exact_policy_gradient",
    "gae_advantages",
    "group_advantages",
    "grpo_loss",
    "grpo_update",
    "k3_kl",
    "masked_mean",
    "reinforce_gradient",
    "rloo_advantages",
    "rollout_metrics",
    "select_groups",
    "selective_log_softmax",
    "task_reward",
    "token_entropy",
    "train_counting",
    "value_loss",
]
