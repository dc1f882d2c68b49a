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
    LMConfig,
    decode,
    encode,
    parse_completion,
    prompt_text,
    reference_reward,
)
from jaxgrpo import lm_tasks as jt
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
    a, b = [3, 3, 3, 3, 3, 3, 3, 0, 45], [4, 4, 4, 4, 4, 4, 4, 0, 56]
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
    ]
    completions = [encode(t) for t in texts]
    want_arith = [1, 1, 0, 0, 0, 0, 0, 0, 1]
    want_near = [1, 1, 0.5, 0, 0, 0, 0, 0.5, 1]
    lengths = [2, 5, 2, 3, 8, 1, 3, 2, 4]
    for task, want in (("arithmetic", want_arith), ("near", want_near)):
        for rewards, mask, correct, lens in _rewards(task, a, b, completions):
            np.testing.assert_array_equal(rewards, want)
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
