"""The LM lab's tasks in both frameworks against the plain-Python rules of ``grpospec.lm``.

Independent truth: ``grpospec.lm.reference_reward`` / ``prompt_text`` parse text with
Python strings and ``int``; the array versions never see text. Hand-worked cases pin the
rules themselves.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from grpospec.lm import (
    END,
    PAD,
    SCRATCH,
    LMConfig,
    decode,
    encode,
    parse_completion,
    prompt_text,
    reference_reward,
)
from jaxgrpo import lm_tasks as jt
from parity_tests.test_lm_sampling import chi2_critical
from torchref import lm_tasks as tt

L = 8


def _rewards(task, a, b, completions, digits=2):
    """Both frameworks' (rewards, mask, correct, lengths) as NumPy."""
    out = []
    for mod, arr in ((jt, jnp.asarray), (tt, torch.as_tensor)):
        problems = mod.encode_prompts(arr(np.asarray(a)), arr(np.asarray(b)), digits)
        out.append(tuple(np.asarray(x) for x in mod.task_reward(task, problems,
                                                                arr(np.asarray(completions)))))
    return out


def test_rules_by_hand():
    a, b = [3, 3, 3, 3, 3, 3, 3, 0, 45, 0, 1], [4, 4, 4, 4, 4, 4, 4, 0, 56, 1, 0]
    texts = [
        "7#______",  # right, shortest: length 2
        "..7.#___",  # scratch anywhere is free: right, length 5
        "8#______",  # off by one: wrong (near: 0.5)
        "07#_____",  # not canonical (a leading zero): wrong
        "7_______",  # no end token: truncated, wrong, length 8
        "#_______",  # no answer: wrong, length 1
        "7+#_____",  # an operator inside the answer: wrong
        "1#7#____",  # 0 + 0: the first end token closes the answer "1": near
        "101#____",  # 45 + 56 = 101: right, length 4
        "0#______",  # 0 + 1: one below the sum (near: 0.5)
        "2#______",  # 1 + 0: one above the sum (near: 0.5)
    ]
    completions = [encode(t) for t in texts]
    want_arith = [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0]
    want_near = [1, 1, 0.5, 0, 0, 0, 0, 0.5, 1, 0.5, 0.5]
    lengths = [2, 5, 2, 3, 8, 1, 3, 2, 4, 2, 2]
    for task, want in (("arithmetic", want_arith), ("near", want_near)):
        for rewards, mask, correct, lens in _rewards(task, a, b, completions):
            np.testing.assert_array_equal(rewards, want)
            assert rewards.dtype == np.float32
            np.testing.assert_array_equal(correct, np.asarray(want_arith) == 1)
            np.testing.assert_array_equal(lens, lengths)
            np.testing.assert_array_equal(mask.sum(1), lengths)
        assert [reference_reward(task, x, y, t)[0] for x, y, t in zip(a, b, texts,
                                                                      strict=True)] == want
    assert parse_completion("..12#__") == (12, 5, True)


def test_prompts_equal_their_text_for_every_problem():
    """All 1-digit and 2-digit operand pairs: 10,000 prompts, left-padded, both ways."""
    a, b = (x.ravel() for x in np.meshgrid(np.arange(100), np.arange(100)))
    want = [prompt_text(int(x), int(y), 2) for x, y in zip(a, b, strict=True)]
    for mod, arr in ((jt, jnp.asarray), (tt, torch.as_tensor)):
        problems = mod.encode_prompts(arr(a), arr(b), 2)
        tokens, mask = np.asarray(problems.tokens), np.asarray(problems.mask)
        assert [decode(t) for t in tokens] == want
        np.testing.assert_array_equal(mask.sum(1), [len(w.lstrip("_")) for w in want])
    assert prompt_text(7, 5, 2) == "__7+5=" and prompt_text(12, 34, 2) == "12+34="


@st.composite
def problem_and_completion(draw):
    a, b = draw(st.integers(0, 99)), draw(st.integers(0, 99))
    s = a + b
    kind = draw(st.sampled_from(["right", "near", "random", "leading zero", "noise"]))
    if kind == "noise":
        tokens = draw(st.lists(st.integers(0, 14), min_size=L, max_size=L))
    else:
        number = {"right": s, "near": s + draw(st.sampled_from([-1, 1])),
                  "random": draw(st.integers(0, 999)), "leading zero": s}[kind]
        digits = ("0" if kind == "leading zero" else "") + str(abs(number))
        scratch = draw(st.integers(0, 4))
        text = "." * scratch + digits + ("#" if draw(st.booleans()) else "")
        text = text[:L]
        tokens = encode(text) + draw(st.lists(st.integers(0, 14), min_size=L - len(text),
                                              max_size=L - len(text)))
    return a, b, tokens, kind


@given(st.lists(problem_and_completion(), min_size=1, max_size=12))
def test_rewards_equal_the_reference_checker(batch):
    batch = (batch * 12)[:12]  # one shape: JAX compiles its operations once
    a = [x[0] for x in batch]
    b = [x[1] for x in batch]
    completions = [x[2] for x in batch]
    for task in ("arithmetic", "near"):
        want = [reference_reward(task, x, y, decode(c)) for x, y, c in
                zip(a, b, completions, strict=True)]
        for rewards, mask, correct, lengths in _rewards(task, a, b, completions):
            np.testing.assert_allclose(rewards, [w[0] for w in want])
            np.testing.assert_array_equal(correct, [w[1] for w in want])
            np.testing.assert_array_equal(lengths, [w[2] for w in want])
            np.testing.assert_array_equal(mask.sum(1), lengths)
            assert np.all(np.diff(mask, axis=1) <= 0)  # a prefix
        for w in want:
            event(f"{task}: reward {w[0]}")


def test_problem_draws_cover_every_digit_count():
    """Operands draw their number of digits uniformly, then a value: for digits=2 about
    half of them have one digit (0..9), half two (10..99); both frameworks."""
    for a in (np.asarray(jt.sample_problems(jax.random.key(0), 20_000, 2).a),
              tt.sample_problems(20_000, 2, torch.Generator().manual_seed(0)).a.numpy()):
        assert a.min() == 0 and a.max() == 99
        assert abs(np.mean(a < 10) - 0.5) < 0.02
        counts = np.bincount(a[a >= 10], minlength=100)[10:]
        assert counts.min() > 0.5 * counts.mean()


@pytest.mark.parametrize("task", ["arithmetic", "near"])
def test_corpus_has_the_configured_share_of_right_and_near_answers(task):
    """The base model's corpus: right answers with probability base_accuracy (plus the
    chance that a uniformly random answer is right), off by one with base_near, the
    answer after 0..max_scratch scratch tokens; within 4 standard errors, both ways."""
    cfg = LMConfig(task=task, digits=1, max_scratch=3)
    n = 20_000
    for framework in ("jax", "torch"):
        if framework == "jax":
            problems = jt.sample_problems(jax.random.key(1), n, cfg.digits)
            demos = np.asarray(jt.corpus_completions(jax.random.key(2), problems, cfg))
        else:
            gen = torch.Generator().manual_seed(1)
            problems = tt.sample_problems(n, cfg.digits, gen)
            demos = tt.corpus_completions(problems, cfg, gen).numpy()
        a, b = np.asarray(problems.a), np.asarray(problems.b)
        parsed = [parse_completion(decode(d)) for d in demos]
        assert all(ended for _, _, ended in parsed)
        numbers = np.array([p[0] for p in parsed])
        right = numbers == a + b
        near = np.abs(numbers - (a + b)) == 1
        p_random_right = 1 / 19  # a uniform answer in [0, 18]
        p_random_near = 2 / 19 * 0.95  # both neighbours exist unless the sum is 0 or 18
        want_right = cfg.corpus_accuracy + (1 - cfg.corpus_accuracy - cfg.corpus_near
                                            ) * p_random_right
        want_near = cfg.corpus_near + (1 - cfg.corpus_accuracy - cfg.corpus_near
                                       ) * p_random_near
        for got, want in ((right.mean(), want_right), (near.mean(), want_near)):
            assert abs(got - want) < 4 * np.sqrt(want * (1 - want) / n) + 0.005, (got, want)
        scratch = np.array([list(d).index(END) - len(str(x)) for d, x in
                            zip(demos, numbers, strict=True)])
        assert set(scratch) == {0, 1, 2, 3}


def _corpus(framework: str, cfg: LMConfig, n: int, seed: int = 1):
    """``(a, b, demos)`` as NumPy: ``n`` problems and their corpus demonstrations."""
    if framework == "jax":
        problems = jt.sample_problems(jax.random.key(seed), n, cfg.digits)
        demos = jt.corpus_completions(jax.random.key(seed + 1), problems, cfg)
    else:
        gen = torch.Generator().manual_seed(seed)
        problems = tt.sample_problems(n, cfg.digits, gen)
        demos = tt.corpus_completions(problems, cfg, gen)
    return np.asarray(problems.a), np.asarray(problems.b), np.asarray(demos)


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_number_tokens_are_the_decimal_digits(framework):
    """``number_tokens`` against ``str``: every digit, the count, PAD after the number (the
    callers never read it, so it is pinned here), up to 9-digit numbers, whose digits a
    float division would round."""
    xs = [0, 7, 10, 99, 100, 1234, 19998, 123456789, 987654321, 999999999]
    mod, arr = (jt, jnp.asarray) if framework == "jax" else (tt, torch.as_tensor)
    digits, n = (np.asarray(t) for t in mod.number_tokens(arr(np.asarray(xs)), 9))
    want = [[int(c) for c in str(x)] + [PAD] * (9 - len(str(x))) for x in xs]
    np.testing.assert_array_equal(digits, want)
    np.testing.assert_array_equal(n, [len(str(x)) for x in xs])
    assert digits.dtype == (np.int32 if framework == "jax" else np.int64)


def test_prompt_arrays_are_integers():
    problems = jt.encode_prompts(jnp.array([3, 45]), jnp.array([4, 6]), 2)
    assert problems.tokens.dtype == jnp.int32 and problems.mask.dtype == jnp.int32
    problems = tt.encode_prompts(torch.tensor([3, 45]), torch.tensor([4, 6]), 2)
    assert problems.tokens.dtype == torch.int64 and problems.mask.dtype == torch.int64


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_problems_draw_digit_counts_then_values_independently_and_reproducibly(framework):
    """digits=3: each operand's digit count is uniform in {1, 2, 3} and its value lies in
    that count's range (0..9, 10..99, 100..999); a and b are independent draws (equal
    about 1.2% of the time, not always); the same seed gives the same problems."""
    n = 30_000

    def draw():
        if framework == "jax":
            p = jt.sample_problems(jax.random.key(7), n, 3)
        else:
            p = tt.sample_problems(n, 3, torch.Generator().manual_seed(7))
        return np.asarray(p.a), np.asarray(p.b), np.asarray(p.tokens)

    a, b, tokens = draw()
    for x in (a, b):
        count = np.array([len(str(v)) for v in x])
        for k in (1, 2, 3):
            assert abs(np.mean(count == k) - 1 / 3) < 4 * np.sqrt(2 / 9 / n)
        assert x.min() == 0 and x.max() == 999
        assert (x[count == 3] >= 100).all() and (x[count == 2] >= 10).all()
        assert len(np.unique(x[count == 3])) == 900
    assert np.mean(a == b) < 0.03  # independent: 1/9 * (1/10 + 1/90 + 1/900) = 0.0124
    again = draw()
    for x, y in zip((a, b, tokens), again, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_corpus_near_answers_go_either_way_and_never_below_zero(framework):
    """base_near=1: every answer is a + b +- 1, each sign half of the time, and +1 when the
    sum is 0 (no negative answer); after the end token, padding."""
    cfg = LMConfig(digits=1, base_accuracy=0.0, base_near=1.0)
    n = 20_000
    a, b, demos = _corpus(framework, cfg, n)
    parsed = [parse_completion(decode(d)) for d in demos]
    numbers, s = np.array([p[0] for p in parsed]), a + b
    assert all(p[2] for p in parsed)
    diff = numbers - s
    assert set(diff) == {-1, 1}
    assert (diff[s == 0] == 1).all() and (s == 0).sum() > 50
    up = np.mean(diff[s > 0] == 1)
    assert abs(up - 0.5) < 4 * np.sqrt(0.25 / (s > 0).sum()), up
    ends = np.argmax(demos == END, axis=1)
    after = np.arange(demos.shape[1])[None, :] > ends[:, None]
    assert (demos[after] == PAD).all() and after.any()


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("digits", [1, 2])
def test_corpus_random_answers_are_uniform_on_their_range(framework, digits):
    """base_accuracy = base_near = 0: every answer uniform on [0, 2 (10^digits - 1)], the
    range of the sums (every value drawn; chi-square at P = 1e-4)."""
    cfg = LMConfig(digits=digits, base_accuracy=0.0, base_near=0.0)
    top = 2 * (10**digits - 1)
    n = 100 * (top + 1)
    _, _, demos = _corpus(framework, cfg, n)
    numbers = np.array([parse_completion(decode(d))[0] for d in demos])
    assert numbers.min() == 0 and numbers.max() == top
    counts = np.bincount(numbers, minlength=top + 1)
    chi2 = ((counts - 100) ** 2 / 100).sum()
    assert chi2 < chi2_critical(top), chi2


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_corpus_scratch_is_cut_to_fit_the_completion(framework):
    """max_scratch 10 > completion_length 8: a demonstration takes min(k, L - digits - 1)
    scratch tokens, so every one still ends, and the longest fill all L tokens."""
    cfg = LMConfig(digits=1, completion_length=8, max_scratch=10)
    _, _, demos = _corpus(framework, cfg, 4000)
    parsed = [parse_completion(decode(d)) for d in demos]
    assert all(p[2] for p in parsed)
    for (number, length, _), d in zip(parsed, demos, strict=True):
        assert length <= 8 and list(d[len(str(number)):length - 1]) == [SCRATCH] * (
            length - 1 - len(str(number)))
    lengths = np.array([p[1] for p in parsed])
    width = np.array([len(str(p[0])) for p in parsed])
    for w in (1, 2):  # all 8 tokens when k >= 8 - w - 1, k ~ U{0..10}
        full = np.mean(lengths[width == w] == 8)
        want = (10 + 1 - (8 - w - 1)) / 11
        assert abs(full - want) < 4 * np.sqrt(want * (1 - want) / (width == w).sum()), (w, full)


def test_corpus_is_reproducible_from_its_seed():
    cfg = LMConfig(digits=2)
    for framework in ("jax", "torch"):
        first, second = _corpus(framework, cfg, 500), _corpus(framework, cfg, 500)
        for x, y in zip(first, second, strict=True):
            np.testing.assert_array_equal(x, y)


def test_long_completions_are_judged_not_indexed_out_of_range():
    """L = 12: contents of 10 and 11 digits (longer than any sum) are wrong, not an error;
    the right answer after 10 scratch tokens is right."""
    a, b = [3, 3, 3], [4, 4, 4]
    texts = ["12345678901#", "1234567890#_", "..........7#"]
    completions = [encode(t) for t in texts]
    for rewards, _, correct, lengths in _rewards("arithmetic", a, b, completions, digits=1):
        np.testing.assert_array_equal(rewards, [0, 0, 1])
        np.testing.assert_array_equal(correct, [False, False, True])
        np.testing.assert_array_equal(lengths, [12, 11, 12])
        assert rewards.dtype == np.float32
