"""GRPO with LoRA on Qwen2.5 (transformers + peft), on torchref's loss.

Entry points: ``scaleup.train.train`` (the loop), ``scaleup.evaluate.evaluate_run``,
``scaleup.cli.app`` (``grpo-scaleup train|eval``). See scaleup/README.md.
"""

from scaleup.config import TrainConfig

__all__ = ["TrainConfig"]
