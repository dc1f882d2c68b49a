"""Fixtures: the tiny Qwen2 model and tokenizer built in code, and a task with mixed
rewards so that GRPO has something to learn from in every test."""

from __future__ import annotations

import pytest
import torch

from scaleup.config import TrainConfig
from scaleup.modeling import add_lora, stop_token_ids
from scaleup.tasks import Problem
from scaleup.tiny import save_tiny, tiny_qwen2, tiny_tokenizer

torch.set_num_threads(1)


def pytest_configure(config):
    # peft calls a transformers property deprecated in v5; not ours to fix
    config.addinivalue_line(
        "filterwarnings", "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


class ParityTask:
    """Reward 1 when the completion's first character has an even code point (about half
    of random completions): groups rarely have zero variance."""

    def sample(self, n, seed, step, stream=0):
        return [Problem(f"Say something {step}-{i}.", "") for i in range(n)]

    def score(self, completion, problem):
        return int(bool(completion) and ord(completion[0]) % 2 == 0)


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny model + tokenizer saved as a model folder (for --model)."""
    return save_tiny(tmp_path_factory.mktemp("tiny_model"), seed=0)


def small_cfg(**kw) -> TrainConfig:
    """A config sized for CPU tests."""
    base = dict(model="unused", device="cpu", lora_r=4, lora_alpha=8, prompts_per_step=2,
                group_size=4, max_new_tokens=8, micro_batch_size=3, learning_rate=1e-2,
                steps=2, save_every=2, logprob_chunk=3)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture
def policy(tokenizer):
    """``(peft_model, stop_ids)``: the tiny model (seed 0) with a fresh LoRA adapter."""
    model = add_lora(tiny_qwen2(0, tokenizer), small_cfg())
    return model, stop_token_ids(tokenizer, model)
