"""Framework-free rules shared by `jaxgrpo` and `torchref`.

Both implementations check their arguments with these functions, so a bad input gets
the same error, with the same words, whichever framework the user calls. Nothing here
imports JAX or PyTorch: the checks look at shapes (tuples) and at plain Python scalars.
"""

from grpospec.checks import (
    AGG_MODES,
    IMPORTANCE_LEVELS,
    KL_ESTIMATORS,
    LOSS_MODES,
    SCALE_REWARDS,
    check_bandit,
    check_gae,
    check_group_rewards,
    check_grpo_loss,
    check_kl_estimator,
    check_overlong,
    check_positive_int,
    check_rloo_rewards,
    check_same_shape,
    check_scale_rewards,
    scalar_or_none,
)
from grpospec.config import (
    COMPLETION_LENGTH,
    END_TOKEN,
    ESTIMATORS,
    METRIC_NAMES,
    METRICS,
    TASKS,
    VOCAB_SIZE,
    CountingConfig,
    logged_metrics,
)

__all__ = [
    "AGG_MODES",
    "IMPORTANCE_LEVELS",
    "KL_ESTIMATORS",
    "LOSS_MODES",
    "SCALE_REWARDS",
    "check_scale_rewards",
    "check_gae",
    "check_rloo_rewards",
    "check_same_shape",
    "COMPLETION_LENGTH",
    "END_TOKEN",
    "ESTIMATORS",
    "TASKS",
    "METRIC_NAMES",
    "METRICS",
    "VOCAB_SIZE",
    "CountingConfig",
    "logged_metrics",
    "check_bandit",
    "check_grpo_loss",
    "check_kl_estimator",
    "check_group_rewards",
    "check_overlong",
    "check_positive_int",
    "scalar_or_none",
]
