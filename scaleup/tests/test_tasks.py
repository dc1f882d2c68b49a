"""The checker, the arithmetic generator and the GSM8K reader."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaleup.tasks import (
    ArithmeticTask,
    DatasetTask,
    TaskError,
    check_answer,
    check_gsm8k_held_out,
    exploit_flags,
    extract_boxed,
    held_out,
    load_gsm8k,
    make_task,
    normalize_number,
)

ints = st.integers(min_value=-10**12, max_value=10**12)
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)


# ------------------------------------------------------------------ checker properties

@given(ints, text)
def test_boxed_integer_matches_in_any_common_spelling(n, prefix):
    prefix = prefix.replace("\\boxed{", "")
    for spelling in (str(n), f"{n:,}", f"{n}.0", f"{n:,}.00", f"+{n}" if n >= 0 else str(n),
                     f" {n} ", f"\\${n}"):
        assert check_answer(f"{prefix} so \\boxed{{{spelling}}}", str(n)) == 1, spelling


@given(ints, ints)
def test_different_numbers_never_match(n, m):
    if n != m:
        assert check_answer(f"\\boxed{{{m}}}", str(n)) == 0
        assert check_answer(f"\\boxed{{{m:,}}}", f"{n:,}") == 0


@given(ints, ints, text)
def test_last_boxed_wins(first, last, middle):
    middle = middle.replace("\\boxed{", "")
    completion = f"\\boxed{{{first}}} {middle} \\boxed{{{last}}}"
    assert check_answer(completion, str(last)) == 1
    assert check_answer(completion, str(first)) == int(first == last)


@given(text, text)
def test_checker_never_raises_and_scores_0_or_1(completion, reference):
    assert check_answer(completion, reference) in (0, 1)
    assert check_answer(completion, reference, fallback_last_number=True) in (0, 1)


@given(ints, st.text(alphabet="abcdefgh .!?\n", max_size=30))
def test_fallback_takes_the_last_number_only_when_configured(n, words):
    completion = f"I think 3 then {words} the answer is {n}"
    assert check_answer(completion, str(n)) == 0  # no \boxed{}, no fallback
    assert check_answer(completion, str(n), fallback_last_number=True) == 1


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz ,.!?", max_size=20))
def test_answers_without_a_number_score_zero(junk):
    assert check_answer(f"\\boxed{{{junk}}}", "0") == 0
    assert check_answer(f"\\boxed{{{junk}}}", "7") == 0


@pytest.mark.parametrize("boxed, reference", [
    ("18\\text{ dollars}", "18"), ("1{,}234", "1234"), ("-\\frac{1}{2}", "-1/2"),
    ("\u22125", "-5"), ("12.0", "12"), ("\\$18", "18"), ("1,234,567", "1234567"),
    ("\\dfrac{3}{4}", "0.75"), ("x = 17", "17"), ("12.", "12"),
])
def test_math_verify_accepts_the_usual_latex_spellings(boxed, reference):
    """Spellings the old hand-written checker scored 0: math-verify reads them."""
    assert check_answer(f"So the answer is \\boxed{{{boxed}}}.", reference) == 1


@pytest.mark.parametrize("boxed, reference", [
    ("19", "18"), ("18", "-18"), ("\\frac{1}{3}", "0.33"), ("12,34", "1234"), ("", "0"),
])
def test_math_verify_rejects_wrong_answers(boxed, reference):
    assert check_answer(f"\\boxed{{{boxed}}}", reference) == 0


@given(st.integers(-1000, 1000), st.integers(1, 1000))
def test_fractions_compare_by_value(a, b):
    assert check_answer(f"\\boxed{{\\frac{{{a}}}{{{b}}}}}", f"{a}/{b}") == 1
    assert normalize_number(f"{a}/{b}") == Fraction(a, b)


# ------------------------------------------------------------------ checker by hand

@pytest.mark.parametrize("written, value", [
    ("1,234", 1234), ("-0", 0), ("12.0", 12), ("12.", 12), ("+7", 7), ("$18", 18),
    ("1,234,567.50", Fraction(2469135, 2)), ("50%", 50), (".5", Fraction(1, 2)),
])
def test_normalize_by_hand(written, value):
    assert normalize_number(written) == value


@pytest.mark.parametrize("written", ["1,2", "12,34", "abc", "", "1/0", "1e5", "--3", "3 4"])
def test_normalize_rejects(written):
    assert normalize_number(written) is None


def test_extract_boxed_nested_and_unclosed():
    assert extract_boxed("a \\boxed{\\frac{1}{2}} b \\boxed{3} \\boxed{4") == ["\\frac{1}{2}", "3"]


def test_exploit_flags_by_hand():
    reasoning = "First 3 * 4 = 12, then add 5 to get 17. "
    assert exploit_flags(reasoning + "\\boxed{17}", truncated=False) == []
    assert exploit_flags("\\boxed{17}", truncated=False) == ["no_reasoning"]
    assert exploit_flags(reasoning + "\\boxed{1} \\boxed{17}", truncated=True) == [
        "several_boxed", "truncated"]


# ------------------------------------------------------------------ arithmetic

PROMPT = re.compile(r"^What is (\d+) ([-+*]) (\d+)\? Put the final answer in \\boxed\{\}\.$")


@pytest.mark.parametrize("digits, operators", [(1, "+"), (3, "*"), (2, "+-*")])
def test_arithmetic_answers_and_difficulty(digits, operators):
    task = ArithmeticTask(digits=digits, operators=operators)
    problems = task.sample(200, seed=3, step=5)
    seen_ops = set()
    for p in problems:
        a, op, b = PROMPT.match(p.prompt).groups()
        seen_ops.add(op)
        assert len(a) <= digits and len(b) <= digits
        assert int(p.answer) == {"+": int(a) + int(b), "-": int(a) - int(b),
                                 "*": int(a) * int(b)}[op]
    assert seen_ops == set(operators)
    assert task.sample(200, seed=3, step=5) == problems  # a pure function of the seeds
    assert task.sample(200, seed=3, step=6) != problems


def test_arithmetic_rejects_bad_options():
    with pytest.raises(TaskError, match="operators"):
        ArithmeticTask(operators="/")
    with pytest.raises(ValueError, match="digits"):
        ArithmeticTask(digits=0)


# ------------------------------------------------------------------ GSM8K

def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_gsm8k_reads_the_usual_format(tmp_path):
    rows = [{"question": "Tom has 3 apples and buys 1,000 more. How many?",
             "answer": "3 + 1000 = <<3+1000=1003>>1003\n#### 1,003"},
            {"question": "Debt?", "answer": "It is negative.\n#### -5"}]
    path = _write(tmp_path / "train.jsonl", [json.dumps(r) for r in rows] + [""])
    problems = load_gsm8k(path)
    assert [p.answer for p in problems] == ["1003", "-5"]
    assert problems[0].prompt.startswith("Tom has 3 apples")
    assert problems[0].prompt.endswith("\\boxed{}.")
    task = DatasetTask(tuple(problems))
    assert task.score("so \\boxed{1,003}", problems[0]) == 1
    assert set(task.sample(5, 0, 0)) == set(problems)


@pytest.mark.parametrize("bad, message", [
    ('{"question": "q", "answer": "a #### 4"', "line 2: not valid JSON"),
    ('{"question": "q"}', 'line 2: expected an object with string fields'),
    ('{"question": "q", "answer": "no marker"}', "line 2: the answer must end with '#### "),
    ('[1, 2]', "line 2: expected an object"),
])
def test_gsm8k_malformed_line_names_file_and_line(tmp_path, bad, message):
    good = json.dumps({"question": "q", "answer": "#### 1"})
    path = _write(tmp_path / "data.jsonl", [good, bad])
    with pytest.raises(TaskError) as e:
        load_gsm8k(path)
    assert str(path) in str(e.value) and message in str(e.value)


def test_gsm8k_missing_file_and_missing_option(tmp_path):
    with pytest.raises(TaskError, match="does not exist"):
        load_gsm8k(tmp_path / "nope.jsonl")
    with pytest.raises(TaskError, match="--data"):
        make_task("gsm8k")
    with pytest.raises(TaskError, match="task must be one of"):
        make_task("chess")


# ------------------------------------------------------------------ held-out evaluation


@pytest.mark.parametrize("digits, operators, seed, steps, batch", [
    (1, "+", 0, 200, 8), (2, "+-*", 3, 200, 8), (2, "*", 1, 50, 32), (3, "+-", 7, 100, 16),
])
def test_arithmetic_evaluation_is_disjoint_from_every_training_problem(
        digits, operators, seed, steps, batch):
    """Every problem a run can train on (all steps, any seed's stream) is outside the
    evaluation split, and every evaluation problem inside it: no overlap, by
    construction. (Before the fix, 41 of 200 evaluation problems were also trained on
    with the defaults.)"""
    task = ArithmeticTask(digits=digits, operators=operators)
    evaluation = task.eval_problems(200, seed)
    trained = {p.prompt for step in range(steps) for p in task.sample(batch, seed, step)}
    assert not trained & {p.prompt for p in evaluation}
    assert len({p.prompt for p in evaluation}) == len(evaluation)  # distinct
    for p in evaluation:
        a, op, b = PROMPT.match(p.prompt).groups()
        assert held_out(int(a), op, int(b))
    for prompt in list(trained)[:500]:
        a, op, b = PROMPT.match(prompt).groups()
        assert not held_out(int(a), op, int(b))
    # 1-digit sums: only 100 problems, about a tenth reserved, all of which are used
    if (digits, operators) == (1, "+"):
        assert 5 <= len(evaluation) <= 20
    else:
        assert len(evaluation) == 200


def test_held_out_reserves_about_a_tenth_of_the_problem_space():
    share = np.mean([held_out(a, "+", b) for a in range(100) for b in range(100)])
    assert 0.08 < share < 0.12


def _gsm(path, questions):
    path.write_text("".join(json.dumps({"question": q, "answer": "#### 1"}) + "\n"
                            for q in questions))
    return path


def test_gsm8k_evaluation_must_be_a_separate_file_without_shared_questions(tmp_path):
    train = _gsm(tmp_path / "train.jsonl", ["How many apples?", "How many pears?"])
    test = _gsm(tmp_path / "test.jsonl", ["How many plums?"])
    overlapping = _gsm(tmp_path / "mixed.jsonl", ["How  many APPLES?", "How many figs?"])
    with pytest.raises(TaskError, match="pass --eval-data"):
        check_gsm8k_held_out(train, None)
    with pytest.raises(TaskError, match="is the training file"):
        check_gsm8k_held_out(train, str(train))
    with pytest.raises(TaskError, match="1 of its 2 questions are also in the training file"):
        check_gsm8k_held_out(train, str(overlapping))
    with pytest.raises(TaskError, match="does not exist"):
        check_gsm8k_held_out(train, str(tmp_path / "nope.jsonl"))
    record = check_gsm8k_held_out(train, str(test))
    assert record["overlapping_questions"] == 0 and record["eval_questions"] == 1
    assert check_gsm8k_held_out(train, str(overlapping), allow_overlap=True)[
        "overlapping_questions"] == 1


def test_gsm8k_held_out_messages_and_record_exactly(tmp_path):
    """The whole of each message (a user reads it) and of the record ``eval.json`` keeps;
    a byte-identical copy of the training file under another name is the training file."""
    train = _gsm(tmp_path / "train.jsonl", ["How many apples?"])
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(train.read_bytes())
    test = _gsm(tmp_path / "test.jsonl", ["How many plums?", "How many figs?"])
    mixed = _gsm(tmp_path / "mixed.jsonl", ["how many apples?", "How many figs?"])
    cases = [
        (None, "task 'gsm8k' evaluates on a separate file: pass --eval-data PATH (e.g. "
               "GSM8K's test.jsonl); the training file is not held out"),
        (str(tmp_path / "nope.jsonl"), f"--eval-data {str(tmp_path / 'nope.jsonl')!r} does "
                                        "not exist"),
        (str(copy), f"--eval-data {str(copy)!r} is the training file (--data); evaluation "
                    "must be held out (pass --allow-overlap to do it anyway)"),
        (str(mixed), f"--eval-data {str(mixed)!r}: 1 of its 2 questions are also in the "
                     f"training file {str(train)!r}; evaluation must be held out (pass "
                     "--allow-overlap to do it anyway)"),
    ]
    for eval_path, message in cases:
        with pytest.raises(TaskError) as e:
            check_gsm8k_held_out(train, eval_path)
        assert str(e.value) == message
    assert check_gsm8k_held_out(train, str(test)) == {
        "rule": "a separate file; no evaluation question is a training question",
        "eval_data": str(test), "data": str(train), "eval_questions": 2,
        "overlapping_questions": 0, "allow_overlap": False}
    assert check_gsm8k_held_out(train, str(copy), allow_overlap=True)["allow_overlap"] is True


def test_the_shared_gsm8k_test_split_is_held_out_from_train():
    """The data this project points users at: GSM8K's test file shares no question with
    its train file (checked when the files are present)."""
    root = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k"
    if not (root / "train.jsonl").is_file():
        pytest.skip("GSM8K files not present")
    record = check_gsm8k_held_out(root / "train.jsonl", str(root / "test.jsonl"))
    assert record["overlapping_questions"] == 0 and record["eval_questions"] == 1319


def test_numbers_in_latex_and_trailing_punctuation():
    """The checker's normal forms that answers take in practice: ``\\frac``, ``\\dfrac``,
    ``\\tfrac`` (numerator with its sign, over the denominator), an empty ``\\text{ }``,
    a final full stop."""
    assert normalize_number(r"\frac{1}{2}") == Fraction(1, 2)
    assert normalize_number(r"\dfrac{-3}{4}") == Fraction(-3, 4)
    assert normalize_number(r"\tfrac{6}{3}") == 2
    assert normalize_number(r"\frac{2}{5}") != normalize_number(r"\frac{5}{2}")
    assert normalize_number(r"12\text{ }") == 12
    assert normalize_number("42.") == 42
    assert check_answer(r"so \boxed{\frac{3}{4}}", "0.75") == 1


def test_gsm8k_answers_take_the_last_marker_and_keep_fractions():
    from scaleup.tasks import parse_gsm8k_answer

    assert parse_gsm8k_answer("a #### 3/4") == "3/4"
    assert parse_gsm8k_answer("x #### 1 #### 5") == "5"
    assert parse_gsm8k_answer("#### 1,234") == "1234"
    assert parse_gsm8k_answer("#### 6/3") == "2"
    assert parse_gsm8k_answer("so 3 + 4 ####7") == "7"
    assert parse_gsm8k_answer("no marker") is None


def test_gsm8k_reader_skips_blank_lines_anywhere_and_words_its_errors(tmp_path):
    rows = [json.dumps({"question": f"Q{i}?", "answer": f"#### {i}"}) for i in range(3)]
    path = tmp_path / "d.jsonl"
    path.write_text(rows[0] + "\n\n" + rows[1] + "\n   \n" + rows[2] + "\n", encoding="utf-8")
    assert [p.answer for p in load_gsm8k(path)] == ["0", "1", "2"]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(TaskError) as e:
        load_gsm8k(empty)
    assert str(e.value) == f"GSM8K data file {str(empty)!r} holds no problems"
    with pytest.raises(TaskError) as e:
        load_gsm8k(tmp_path / "none.jsonl")
    assert str(e.value) == f"GSM8K data file {str(tmp_path / 'none.jsonl')!r} does not exist"
    bad = tmp_path / "bad.jsonl"
    long_answer = "x" * 50 + "the end"
    bad.write_text(json.dumps({"question": "Q?", "answer": long_answer}) + "\n")
    with pytest.raises(TaskError) as e:
        load_gsm8k(bad)
    assert str(e.value).endswith(f"got ...{long_answer[-40:]!r}")
    unicode = tmp_path / "u.jsonl"
    unicode.write_bytes((json.dumps({"question": "Ünïcode ½?", "answer": "#### 1"},
                                    ensure_ascii=False) + "\n").encode("utf-8"))
    assert load_gsm8k(unicode)[0].prompt.startswith("Ünïcode ½?")


def test_arithmetic_and_dataset_tasks_score_with_their_checker():
    problem = ArithmeticTask().sample(1, seed=0, step=0)[0]
    task = ArithmeticTask()
    assert task.score(f"\\boxed{{{problem.answer}}}", problem) == 1
    assert task.score(f"\\boxed{{{int(problem.answer) + 1}}}", problem) == 0
    assert task.score(f"it is {problem.answer}", problem) == 0  # no box, no fallback
    assert ArithmeticTask(fallback_last_number=True).score(f"it is {problem.answer}",
                                                           problem) == 1


def test_dataset_task_samples_distinct_problems_from_its_stream():
    from scaleup.tasks import Problem

    task = DatasetTask([Problem(f"q{i}", str(i)) for i in range(20)])
    a = task.sample(10, seed=0, step=3)
    assert len({p.prompt for p in a}) == 10  # without replacement
    assert a == task.sample(10, seed=0, step=3, stream=0)
    assert a != task.sample(10, seed=0, step=3, stream=1)
    assert len(task.sample(50, seed=0, step=0)) == 20
    with pytest.raises(ValueError, match="^n must be"):
        task.sample(0, seed=0, step=0)
