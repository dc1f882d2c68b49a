"""jaxgrpo: the RL math of LLM post-training in JAX (see SPEC.md)."""

from jaxgrpo.advantages import gae_advantages, group_advantages, rloo_advantages
from jaxgrpo.bandit import (
    exact_policy_gradient,
    expected_reward,
    reinforce_gradient,
    reinforce_gradients,
)
from jaxgrpo.counting import (
    CounterPolicy,
    counting_reward,
    grpo_update,
    load_torch_state_dict,
    make_train,
    rollout_metrics,
    sample_completions,
    select_groups,
    task_reward,
    token_entropy,
    torch_state_dict,
    train_counting,
)
from jaxgrpo.loss import (
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
    "expected_reward",
    "gae_advantages",
    "group_advantages",
    "grpo_loss",
    "grpo_update",
    "k3_kl",
    "load_torch_state_dict",
    "make_train",
    "masked_mean",
    "reinforce_gradient",
    "reinforce_gradients",
    "rloo_advantages",
    "rollout_metrics",
    "sample_completions",
    "select_groups",
    "selective_log_softmax",
    "task_reward",
    "token_entropy",
    "torch_state_dict",
    "train_counting",
    "value_loss",
]
