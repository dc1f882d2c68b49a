"""Verifiable tasks: synthetic arithmetic, GSM8K from a local JSONL file, and the checker.

A task hands out :class:`Problem` s (a prompt and a reference answer); the checker
:func:`check_answer` scores a completion 1 or 0 against the reference.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from grpospec import check_positive_int

OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
INSTRUCTION = "Put the final answer in \\boxed{}."


class TaskError(ValueError):
    """A task was configured wrongly or its data file is malformed (the message says where)."""


@dataclass(frozen=True)
class Problem:
    """One prompt (the user message, without chat template) and its reference answer."""

    prompt: str
    answer: str


# --------------------------------------------------------------------------- checker

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")
_COMMA_NUMBER = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?$")
_FRACTION = re.compile(r"^([+-]?\d+)/(\d+)$")
_LAST_NUMBER = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?|[+-]?\.\d+")
_STRIP = ("\\$", "$", "\\%", "%", "\\!", "\\,")


def normalize_number(text: str) -> Fraction | None:
    """The number written in ``text``, or ``None`` when it is not a plain number.

    Accepts a sign, thousands separators (``1,234``, only in groups of three), a
    decimal part (``12.0`` == ``12``), a fraction ``a/b``, ``\\frac{a}{b}``, and ignores
    surrounding spaces, dollar and percent signs and a trailing full stop.
    """
    s = text.strip()
    m = re.fullmatch(r"\\[dt]?frac\{([+-]?\d+)\}\{(\d+)\}", s)
    if m:
        s = f"{m.group(1)}/{m.group(2)}"
    s = re.sub(r"\\text\{\s*\}", "", s)
    for junk in _STRIP:
        s = s.replace(junk, "")
    s = s.strip().rstrip(".")
    if _COMMA_NUMBER.match(s):
        s = s.replace(",", "")
    if _NUMBER.match(s):
        return Fraction(s)
    m = _FRACTION.match(s)
    if m and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2)))
    return None


def extract_boxed(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` in ``text``, in order (nested braces allowed).

    An unclosed ``\\boxed{`` is ignored.
    """
    out = []
    start = text.find("\\boxed{")
    while start != -1:
        i, depth = start + len("\\boxed{"), 1
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[start + len("\\boxed{"): i - 1])
        start = text.find("\\boxed{", start + 1)
    return out


def extract_answer(text: str, fallback_last_number: bool = False) -> str | None:
    """The final answer of a completion: the last ``\\boxed{}``, else (if configured) the
    last number in the text, else ``None``."""
    boxed = extract_boxed(text)
    if boxed:
        return boxed[-1]
    if fallback_last_number:
        numbers = _LAST_NUMBER.findall(text)
        if numbers:
            return numbers[-1].rstrip(",")
    return None


def _math_verify():
    """HF math-verify's ``parse`` and ``verify`` (imported on first use: it loads sympy)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    return parse, verify, ExprExtractionConfig, LatexExtractionConfig


def answers_match(predicted: str, reference: str) -> bool:
    """Whether the answer ``predicted`` (what was inside the last ``\\boxed{}``, or the
    last number) equals ``reference`` as mathematics, by HF ``math-verify`` (what TRL's
    accuracy reward uses): ``18\\text{ dollars}``, ``1{,}234``, ``-\\frac{1}{2}``, a
    Unicode minus, ``12.0`` and ``$18`` all equal their plain numbers. A trailing full
    stop is dropped first. Anything unparseable is not a match; never raises."""
    parse, verify, expr_cfg, latex_cfg = _math_verify()
    try:
        gold = parse(reference, extraction_config=[expr_cfg()])
        got = parse("\\boxed{" + predicted.strip().rstrip(".") + "}",
                    extraction_config=[latex_cfg()])
        return bool(gold) and bool(got) and bool(verify(gold, got))
    except Exception:  # math-verify's own errors and timeouts: no match
        return False


def check_answer(completion: str, reference: str, fallback_last_number: bool = False) -> int:
    """1 when the completion's final answer equals ``reference`` (:func:`answers_match`),
    else 0. The final answer is the last ``\\boxed{}`` (several are flagged by
    :func:`exploit_flags`), else, if configured, the last number in the text.

    Anything unparseable (no answer, a non-numeric answer, an unparseable reference)
    scores 0; the checker never raises on text.
    """
    predicted = extract_answer(completion, fallback_last_number)
    if predicted is None:
        return 0
    return int(answers_match(predicted, reference))


def exploit_flags(completion: str, truncated: bool, min_reasoning_chars: int = 20) -> list[str]:
    """Signs that a completion games the checker rather than solving the problem.

    ``several_boxed``: more than one ``\\boxed{}`` (the checker takes the last one);
    ``no_reasoning``: fewer than ``min_reasoning_chars`` non-space characters outside
    the boxed answers; ``truncated``: the completion hit the token limit.
    """
    flags = []
    boxed = extract_boxed(completion)
    if len(boxed) > 1:
        flags.append("several_boxed")
    rest = completion
    for b in boxed:
        rest = rest.replace("\\boxed{" + b + "}", "")
    if len(re.sub(r"\s", "", rest)) < min_reasoning_chars:
        flags.append("no_reasoning")
    if truncated:
        flags.append("truncated")
    return flags


# --------------------------------------------------------------------------- tasks


def _rng(seed: int, stream: int, step: int) -> np.random.Generator:
    """An independent random stream per (seed, stream, step): resumable without state."""
    return np.random.default_rng([int(seed), int(stream), int(step)])


EVAL_SHARE = 10  # one arithmetic problem in EVAL_SHARE is reserved for evaluation


def held_out(a: int, op: str, b: int) -> bool:
    """Whether ``a op b`` belongs to the arithmetic evaluation split: the first 8 bytes of
    ``blake2b("a op b")``, as an integer, are 0 modulo ``EVAL_SHARE``. Training never
    draws such a problem and evaluation draws only such problems, so the two are disjoint
    by construction, whatever the seed, ``--steps`` or batch size (about 10% reserved)."""
    digest = hashlib.blake2b(f"{a} {op} {b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % EVAL_SHARE == 0


@dataclass(frozen=True)
class ArithmeticTask:
    """``What is 347 * 29? Put the final answer in \\boxed{}.`` generated from a seed.

    The problem space is split in two by :func:`held_out`: :meth:`sample` (training)
    draws only problems outside the evaluation split, :meth:`eval_problems` only inside
    it.

    Attributes:
      digits: the largest number of digits of an operand (each operand draws its own
        number of digits in 1..digits, so that short ones occur too).
      operators: the operators to draw from, a subset of ``"+-*"``.
      min_digits: the smallest number of digits of an operand.
      fallback_last_number: the checker takes the last number when there is no boxed one.
    """

    digits: int = 2
    operators: str = "+-*"
    min_digits: int = 1
    fallback_last_number: bool = False

    def __post_init__(self):
        check_positive_int("digits", self.digits)
        check_positive_int("min_digits", self.min_digits)
        if self.min_digits > self.digits:
            raise TaskError(f"min_digits must be <= digits ({self.digits}), got {self.min_digits}")
        bad = set(self.operators) - set(OPERATORS)
        if not self.operators or bad:
            raise TaskError(f"operators must be a non-empty string of '+', '-', '*', "
                            f"got {self.operators!r}")

    def _operand(self, rng: np.random.Generator) -> int:
        n_digits = int(rng.integers(self.min_digits, self.digits + 1))
        low = 0 if n_digits == 1 else 10 ** (n_digits - 1)
        return int(rng.integers(low, 10**n_digits))

    def _draw(self, rng: np.random.Generator, evaluation: bool) -> tuple[int, str, int]:
        """One (a, op, b) from the training distribution, restricted to one split."""
        while True:
            a, b = self._operand(rng), self._operand(rng)
            op = self.operators[int(rng.integers(len(self.operators)))]
            if held_out(a, op, b) == evaluation:
                return a, op, b

    @staticmethod
    def _problem(a: int, op: str, b: int) -> Problem:
        return Problem(f"What is {a} {op} {b}? {INSTRUCTION}", str(OPERATORS[op](a, b)))

    def sample(self, n: int, seed: int, step: int, stream: int = 0) -> list[Problem]:
        """``n`` training problems (never in the evaluation split), a pure function of
        (``seed``, ``step``, ``stream``)."""
        rng = _rng(seed, stream, step)
        return [self._problem(*self._draw(rng, False)) for _ in range(check_positive_int("n", n))]

    def space(self) -> int:
        """How many distinct problems the options allow."""
        low = 0 if self.min_digits == 1 else 10 ** (self.min_digits - 1)
        return (10**self.digits - low) ** 2 * len(set(self.operators))

    def eval_problems(self, n: int, seed: int) -> list[Problem]:
        """Up to ``n`` distinct problems of the evaluation split, drawn like training
        problems (same operand distribution); all of the split when it has fewer."""
        n = check_positive_int("n", n)
        rng = _rng(seed, 1, 0)
        seen: dict[tuple, None] = {}
        for _ in range(50 * n):
            seen.setdefault(self._draw(rng, True))
            if len(seen) == n:
                break
        if len(seen) < n and self.space() <= 4_000_000:  # a small space: take all of it
            low = 0 if self.min_digits == 1 else 10 ** (self.min_digits - 1)
            ops = sorted(set(self.operators), key=self.operators.index)
            everything = [(a, op, b) for a in range(low, 10**self.digits) for op in ops
                          for b in range(low, 10**self.digits) if held_out(a, op, b)]
            rest = [t for t in everything if t not in seen]
            for i in rng.permutation(len(rest))[: n - len(seen)]:
                seen.setdefault(rest[int(i)])
        return [self._problem(*t) for t in seen]

    def score(self, completion: str, problem: Problem) -> int:
        """The checker's verdict (0 or 1) on ``completion``."""
        return check_answer(completion, problem.answer, self.fallback_last_number)


def parse_gsm8k_answer(answer: str) -> str | None:
    """The number after ``####`` in a GSM8K answer field (commas removed), or ``None``."""
    if "####" not in answer:
        return None
    final = answer.rsplit("####", 1)[1].strip()
    value = normalize_number(final)
    if value is None:
        return None
    return str(value.numerator) if value.denominator == 1 else str(value)


def load_gsm8k(path: str | Path) -> list[Problem]:
    """Read GSM8K's JSONL format: one ``{"question": ..., "answer": "... #### N"}`` a line.

    Blank lines are skipped. Raises :class:`TaskError` naming the file and the line for
    a missing file, invalid JSON, a missing field or an answer without ``#### N``.
    """
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"GSM8K data file {str(path)!r} does not exist")
    problems = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or not all(
                isinstance(row.get(k), str) for k in ("question", "answer")
            ):
                raise TaskError(f'{where}: expected an object with string fields "question" '
                                f'and "answer"')
            reference = parse_gsm8k_answer(row["answer"])
            if reference is None:
                raise TaskError(f"{where}: the answer must end with '#### <number>', "
                                f"got ...{row['answer'][-40:]!r}")
            problems.append(Problem(f"{row['question'].strip()} {INSTRUCTION}", reference))
    if not problems:
        raise TaskError(f"GSM8K data file {str(path)!r} holds no problems")
    return problems


def question_key(prompt: str) -> str:
    """A problem's question for overlap checks: lower case, whitespace collapsed."""
    return " ".join(prompt.lower().split())


@dataclass(frozen=True)
class DatasetTask:
    """Problems drawn at random (with replacement across steps) from a fixed list."""

    problems: tuple[Problem, ...]
    fallback_last_number: bool = False

    def sample(self, n: int, seed: int, step: int, stream: int = 0) -> list[Problem]:
        """``n`` distinct problems (all of them when fewer), a pure function of the seeds."""
        n = min(check_positive_int("n", n), len(self.problems))
        idx = _rng(seed, stream, step).choice(len(self.problems), size=n, replace=False)
        return [self.problems[int(i)] for i in idx]

    def score(self, completion: str, problem: Problem) -> int:
        """The checker's verdict (0 or 1) on ``completion``."""
        return check_answer(completion, problem.answer, self.fallback_last_number)


@dataclass(frozen=True)
class DigitTask:
    """A trivial verifiable task for learning checks: start the reply with a digit.

    Reward 1 when the completion's first character is one of ``0-9``. A random byte-level
    policy scores about 10/V, so the reward has room to rise.
    """

    def sample(self, n: int, seed: int, step: int, stream: int = 0) -> list[Problem]:
        """``n`` copies of the same instruction."""
        return [Problem("Start your reply with a digit.", "")] * check_positive_int("n", n)

    def score(self, completion: str, problem: Problem) -> int:
        """1 when ``completion`` starts with an ASCII digit."""
        return int(completion[:1] in tuple("0123456789"))


def check_gsm8k_held_out(train_path: str | Path, eval_path: str | None,
                         allow_overlap: bool = False) -> dict:
    """Check that GSM8K evaluation is held out from training; returns the record for
    ``eval.json``.

    ``eval_path`` must be given (``--eval-data``), must not be the training file, and no
    evaluation question may also be a training question (compared lower-cased, with
    whitespace collapsed), unless ``allow_overlap``. Raises :class:`TaskError` naming
    the option otherwise.
    """
    if not eval_path:
        raise TaskError("task 'gsm8k' evaluates on a separate file: pass --eval-data PATH "
                        "(e.g. GSM8K's test.jsonl); the training file is not held out")
    train_path, eval_file = Path(train_path), Path(eval_path)
    if not eval_file.is_file():
        raise TaskError(f"--eval-data {str(eval_path)!r} does not exist")
    same = eval_file.resolve() == train_path.resolve() or (
        train_path.is_file() and eval_file.read_bytes() == train_path.read_bytes())
    if same and not allow_overlap:
        raise TaskError(f"--eval-data {str(eval_path)!r} is the training file (--data); "
                        "evaluation must be held out (pass --allow-overlap to do it anyway)")
    train_q = {question_key(p.prompt) for p in load_gsm8k(train_path)}
    eval_q = [question_key(p.prompt) for p in load_gsm8k(eval_file)]
    overlap = sum(q in train_q for q in eval_q)
    if overlap and not allow_overlap:
        raise TaskError(f"--eval-data {str(eval_path)!r}: {overlap} of its {len(eval_q)} "
                        f"questions are also in the training file {str(train_path)!r}; "
                        "evaluation must be held out (pass --allow-overlap to do it anyway)")
    return {"rule": "a separate file; no evaluation question is a training question",
            "eval_data": str(eval_path), "data": str(train_path),
            "eval_questions": len(eval_q), "overlapping_questions": overlap,
            "allow_overlap": allow_overlap}


TASKS = ("arithmetic", "gsm8k", "digit")


def make_task(name: str, *, digits: int = 2, operators: str = "+-*",
              data_path: str | None = None, fallback_last_number: bool = False):
    """Build the task called ``name``: ``arithmetic``, ``gsm8k`` (needs ``data_path``) or
    ``digit``. A task has ``sample(n, seed, step, stream)`` and ``score(text, problem)``."""
    if name == "arithmetic":
        return ArithmeticTask(digits=digits, operators=operators,
                              fallback_last_number=fallback_last_number)
    if name == "gsm8k":
        if not data_path:
            raise TaskError("task 'gsm8k' needs a data file (--data PATH to a GSM8K JSONL file)")
        return DatasetTask(tuple(load_gsm8k(data_path)), fallback_last_number)
    if name == "digit":
        return DigitTask()
    raise TaskError(f"task must be one of {TASKS}, got {name!r}")

