"""Models and tokenizers built in code, for tests and benchmarks (no model hub needed).

* :func:`tiny_tokenizer`: a byte-level tokenizer (256 byte tokens, no merges) with
  Qwen's special tokens and chat template, as a ``PreTrainedTokenizerFast``.
* :func:`tiny_qwen2`: a random-initialised ``Qwen2ForCausalLM`` with small sizes.
* :data:`QWEN25_05B_SIZES`: the exact architecture of Qwen2.5-0.5B(-Instruct).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

#: Qwen2.5's chat template, without the default system prompt and tool handling.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

#: Qwen2.5-0.5B / -Instruct, from its config.json.
QWEN25_05B_SIZES = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    hidden_act="silu",
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
    use_sliding_window=False,
    attention_dropout=0.0,
    bos_token_id=151643,
    eos_token_id=151645,
    pad_token_id=151643,
)

TINY_SIZES = dict(
    vocab_size=272,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
    # Larger than the default 0.02 so that the (frozen, tied) embeddings let LoRA reach
    # peaked output distributions: logits are bounded by |embedding| * |normed hidden|.
    initializer_range=0.1,
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: ids 0..255 are the bytes, then ``<|endoftext|>`` (256),
    ``<|im_start|>`` (257), ``<|im_end|>`` (258). Pad is ``<|endoftext|>``, the end of a
    turn (eos) ``<|im_end|>``, the chat template Qwen's."""
    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([ENDOFTEXT, IM_START, IM_END])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START], chat_template=CHAT_TEMPLATE,
    )


def qwen2_config(sizes: dict, tokenizer=None, **overrides) -> Qwen2Config:
    """A ``Qwen2Config`` with ``sizes``; token ids taken from ``tokenizer`` when given."""
    kw = dict(sizes)
    if tokenizer is not None:
        kw.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                  bos_token_id=tokenizer.pad_token_id)
    kw.update(overrides)
    return Qwen2Config(**kw)


def tiny_qwen2(seed: int = 0, tokenizer=None, **overrides) -> Qwen2ForCausalLM:
    """A random-initialised tiny Qwen2 (float32, eval mode), deterministic in ``seed``."""
    config = qwen2_config(TINY_SIZES, tokenizer or tiny_tokenizer(), **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.eval()


def save_tiny(folder: str | Path, seed: int = 0, **overrides) -> Path:
    """Write a tiny model and its tokenizer to ``folder`` (loadable with ``--model``)."""
    folder = Path(folder)
    tokenizer = tiny_tokenizer()
    tiny_qwen2(seed, tokenizer, **overrides).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
