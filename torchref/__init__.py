"""torchref: the PyTorch reference of jaxgrpo's math (see SPEC.md). Plain and readable."""

from torchref.advantages import (
    gae_advantages,
    group_advantages,
    overlong_penalty,
    reinforce_pp_advantages,
    rloo_advantages,
)
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
    training_signal,
)
from torchref.loss import (
    clip_metrics,
    grpo_loss,
    high_entropy_mask,
    k3_kl,
    kl_estimate,
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
    "high_entropy_mask",
    "grpo_update",
    "k3_kl",
    "kl_estimate",
    "masked_mean",
    "overlong_penalty",
    "reinforce_gradient",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "rollout_metrics",
    "select_groups",
    "selective_log_softmax",
    "task_reward",
    "token_entropy",
    "training_signal",
    "train_counting",
    "value_loss",
]
