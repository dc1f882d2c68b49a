"""Verifiable tasks: synthetic arithmetic, GSM8K from a local JSONL file, and the checker.

A task hands out :class:`Problem` s (a prompt and a reference answer); the checker
:func:`check_answer` scores a completion 1 or 0 against the reference.
"""

from __future__ import annotations

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


def check_answer(completion: str, reference: str, fallback_last_number: bool = False) -> int:
    """1 when the completion's final answer equals ``reference`` as a number, else 0.

    Anything unparseable (no answer, a non-numeric answer, an unparseable reference)
    scores 0; the checker never raises on text.
    """
    predicted = extract_answer(completion, fallback_last_number)
    if predicted is None:
        return 0
    want, got = normalize_number(reference), normalize_number(predicted)
    return int(want is not None and got is not None and want == got)


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


@dataclass(frozen=True)
class ArithmeticTask:
    """``What is 347 * 29? Put the final answer in \\boxed{}.`` generated from a seed.

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

    def sample(self, n: int, seed: int, step: int, stream: int = 0) -> list[Problem]:
        """``n`` problems, a pure function of (``seed``, ``step``, ``stream``)."""
        rng = _rng(seed, stream, step)
        out = []
        for _ in range(check_positive_int("n", n)):
            a, b = self._operand(rng), self._operand(rng)
            op = self.operators[int(rng.integers(len(self.operators)))]
            out.append(Problem(f"What is {a} {op} {b}? {INSTRUCTION}", str(OPERATORS[op](a, b))))
        return out

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

