"""jaxgrpo: the RL math of LLM post-training in JAX (see SPEC.md)."""

from jaxgrpo.advantages import group_advantages
from jaxgrpo.bandit import exact_policy_gradient, expected_reward, reinforce_gradient
from jaxgrpo.counting import (
    CounterPolicy,
    counting_reward,
    grpo_update,
    load_torch_state_dict,
    make_train,
    sample_completions,
    token_entropy,
    torch_state_dict,
    train_counting,
)
from jaxgrpo.loss import clip_fraction, grpo_loss, k3_kl, masked_mean, selective_log_softmax

__all__ = [
    "CounterPolicy",
    "clip_fraction",
    "counting_reward",
    "exact_policy_gradient",
    "expected_reward",
    "group_advantages",
    "grpo_loss",
    "grpo_update",
    "k3_kl",
    "load_torch_state_dict",
    "make_train",
    "masked_mean",
    "reinforce_gradient",
    "sample_completions",
    "selective_log_softmax",
    "token_entropy",
    "torch_state_dict",
    "train_counting",
]
