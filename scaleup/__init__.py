"""GRPO with LoRA on Qwen2.5 (transformers + peft), on torchref's loss."""
